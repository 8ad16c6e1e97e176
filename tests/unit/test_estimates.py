"""Plans estimated from measurements (issue 15, item 4): each job's time rests on a committed result
of its model and precision, scaled and assumed as the plan table says; the MFU assumption remains the
fallback where nothing was measured."""
from __future__ import annotations


import pytest

from fp8lab import analysis, launch as L
from fp8lab.analysis import estimates, scaling
from fp8lab.views import plots
from fp8lab.model.models import model_flops_per_token
from fake_runs import bench as _bench, run_meta, step_records

ROLE, BUCKET = L.PLACEHOLDER_ROLE, L.PLACEHOLDER_BUCKET


def _committed():
    summary = analysis.summarize_runs(analysis.load_runs())
    return summary, estimates.measured_rates(summary)


def test_default_plan_rests_on_the_fastest_committed_one_gpu_run_of_each_model_and_precision():
    summary, rates = _committed()
    plan = L.plan_sweep(["llama-1b", "llama-7b"], ["bf16", "fp8"], [1, 2, 4], role=ROLE, bucket=BUCKET,
                        tokens=24 * 10**9)
    assert isinstance(plan.estimate, estimates.MeasuredEstimate)
    table = plan.table()
    one_gpu = summary[(summary["world_size"] == 1) & summary["tokens_per_sec_per_gpu"].notna()]
    for j, basis in zip(plan.jobs, table["basis"]):
        s = j.spec
        mine = one_gpu[(one_gpu["model"] == s.model) & (one_gpu["precision"] == s.precision) & (one_gpu["backend"] == "te")]
        if s.precision == "fp8":
            mine = mine[(mine["recipe"] == "delayed") & (mine["fuse"] == True)]  # noqa: E712
        if "memory" in mine:  # runs in the job's memory mode (plain: a P5 job shards the states)
            mine = mine[mine["memory"].map(lambda m: not isinstance(m, str) or m == "plain")]
        p5 = mine[mine["gpu_name"].str.contains("H100 80GB")]  # a run on P5's GPU first, where one exists
        mine = p5 if len(p5) else mine
        best = mine.loc[mine["tokens_per_sec_per_gpu"].idxmax()]
        assert basis.startswith(f"measured {best['run_id']} ({best['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU")
        r = plan.estimate.rate(s.model, s.precision, instance_count=s.instance_count)
        # issue 32: same peaks, slower HBM: the H100 projection follows the run's kernels, said so
        if "H100" in str(best["gpu_name"]):  # measured on P5's GPU: no projection from another GPU
            assert r["gpu_scale"] == 1.0 and "H100 80GB/H200" not in basis
        else:
            assert f"x{r['gpu_scale']:.2f} H100 80GB/H200 (kernels of " in basis and 0.8 < r["gpu_scale"] < 1
        assert "8 GPUs/node (median of" in basis and "assumed for 8" in basis
        assert ("nodes (scaling model: FSDP2 over EFA" in basis) == (s.instance_count > 1)
        inter = r["model_internode_efficiency"]  # the scaling model, no longer 0.95 per doubling
        assert (inter == 1.0) == (s.instance_count == 1) and 0.5 < inter <= 1.0
        assert r["tokens_per_sec_per_gpu"] == pytest.approx(
            best["tokens_per_sec_per_gpu"] * r["gpu_scale"] * r["node_efficiency"] * inter)
        hours = (24e9 / (r["tokens_per_sec_per_gpu"] * 8 * s.instance_count) + plan.estimate.startup_s) / 3600
        assert j.est_hours == pytest.approx(hours)
        assert 0.5 < r["node_efficiency"] <= 1.0
    by = {(j.spec.model, j.spec.precision, j.spec.instance_count): j for j in plan.jobs}
    for model in ("llama-1b", "llama-7b"):  # FP8 is faster by the measured ratio, not an assumed 1.15
        assert by[model, "fp8", 1].est_hours < by[model, "bf16", 1].est_hours / 1.2
    text = L.format_cost_table(plan)
    assert "what each estimate rests on" in text and "the scaling model's multi-node factor" in text
    assert "0.95 per doubling" not in text


def test_a_job_in_a_memory_mode_without_runs_borrows_a_like_modes_speed_and_says_so():
    """llama-7b on one ml.p5.4xlarge in --memory fp8-exp-avg: no run was measured in that mode, so both precisions
    rest on the committed runs of bf16-moments (TE's FusedAdam too, on P5's GPU), not on offload's, and the basis
    says so; a plain-mode job's basis says nothing of modes."""
    plan = L.plan_sweep(["llama-7b"], ["bf16", "fp8"], [1], role=ROLE, bucket=BUCKET, tokens=10**9,
                        instance_type="ml.p5.4xlarge", options={"memory": "fp8-exp-avg"})
    for j in plan.jobs:
        basis = plan.estimate.basis(j.spec)
        assert j.spec.plan.memory_mode == "fp8-exp-avg"
        assert "measured in --memory bf16-moments: no run in the job's fp8-exp-avg yet" in basis
    sharded = L.plan_sweep(["llama-7b"], ["fp8"], [1], role=ROLE, bucket=BUCKET, tokens=10**9)
    assert "--memory" not in sharded.estimate.basis(sharded.jobs[0].spec)


def test_llama_7b_on_one_p5_gpu_plans_offload_and_both_sections_rest_on_its_runs():
    """The plain plan for one ml.p5.4xlarge takes --memory offload (its loss check is committed) and prices it from
    the offload runs on P5's GPU, in the job table and in the scaling model's one-instance row alike."""
    plan = L.plan_sweep(["llama-7b"], ["bf16", "fp8"], [1], role=ROLE, bucket=BUCKET, tokens=10**9,
                        instance_type="ml.p5.4xlarge")
    rates = {}
    for j in plan.jobs:
        assert j.spec.plan.memory_mode == "offload"
        basis = plan.estimate.basis(j.spec)
        assert basis.startswith(f"measured llama-7b-default-{j.spec.precision}-h100-offload (") and "--memory" not in basis
        rates[j.spec.precision] = plan.estimate.rate("llama-7b", j.spec.precision, instance_type="ml.p5.4xlarge",
                                                     memory="offload")["tokens_per_sec_per_gpu"]
    row = next(line for line in scaling.plan_lines(plan).splitlines() if line.strip().startswith("llama-7b x1:"))
    assert f"bf16 {rates['bf16']:,.0f} |" in row and f"fp8 {rates['fp8']:,.0f} |" in row
    assert f"({rates['fp8'] / rates['bf16']:.2f}x)" in row


def test_node_efficiency_is_the_measured_two_gpu_median_of_the_same_layout():
    summary, _ = _committed()
    sc = analysis.scaling_table(summary, by="world_size")
    multi = sc[(sc["run_id"] != sc["reference_run_id"]) & (sc["model"] == "llama-1b") & (sc["precision"] == "fp8")]
    r = estimates.MeasuredEstimate().rate("llama-1b", "fp8")
    same = multi[multi["variant"].str.endswith(", " + r["layout"])]
    assert len(same) and r["node_efficiency"] == pytest.approx(same["efficiency"].median())
    assert f"median of {len(same)} two-GPU run(s) of llama-1b fp8, at {r['layout']}" == r["node_efficiency_from"]


def test_unmeasured_models_fall_back_to_the_mfu_assumption_and_say_so():
    plan = L.plan_sweep(["llama-tiny", "llama-1b"], ["bf16"], [1], role=ROLE, bucket=BUCKET, tokens=10**9)
    tiny, one_b = plan.jobs
    assert plan.estimate.basis(tiny.spec) == "assumed MFU 0.35 of BF16 peak"
    assert tiny.est_hours == pytest.approx(L.Estimate().seconds(tiny.spec) / 3600)
    assert plan.estimate.basis(one_b.spec).startswith("measured ")


def test_sequence_length_and_gpu_peak_scale_the_measured_rate(tmp_path):
    _bench(tmp_path, "one", 1000.0, 1, "2026-11-29T10:00:00Z")  # llama-1b FP8 on one H200, 4x1024
    _bench(tmp_path, "two", 900.0, 2, "2026-11-29T10:05:00Z", parallel="fsdp")
    est = estimates.MeasuredEstimate(results=str(tmp_path))
    r = est.rate("llama-1b", "fp8", seq_len=1024)
    assert r["run_id"] == "one" and r["seq_scale"] == pytest.approx(1.0)
    assert r["node_efficiency"] == pytest.approx(0.9) and r["tokens_per_sec_per_gpu"] == pytest.approx(900.0)
    longer = est.rate("llama-1b", "fp8", seq_len=4096)  # attention grows with the sequence: fewer tokens/s
    ratio = model_flops_per_token("llama-1b", 1024) / model_flops_per_token("llama-1b", 4096)
    assert longer["tokens_per_sec_per_gpu"] == pytest.approx(900.0 * ratio) and ratio < 1
    b200 = est.rate("llama-1b", "fp8", instance_type="ml.p6-b200.48xlarge", seq_len=1024)
    # no profile beside these runs: the step scales with the BF16 peak alone (B200 over the H200 measured on)
    assert b200["gpu_scale"] == pytest.approx(2250.0 / 989.0) and b200["gpu_split_from"].startswith("no profile")
    assert b200["tokens_per_sec_per_gpu"] == pytest.approx(900.0 * 2250.0 / 989.0)
    assert est.rate("llama-1b", "bf16") is None  # nothing measured in BF16 here
    assert estimates.MeasuredEstimate(results=str(tmp_path), node_efficiency=0.8).rate("llama-1b", "fp8", seq_len=1024)[
        "tokens_per_sec_per_gpu"] == pytest.approx(800.0)


def test_a_run_on_the_jobs_gpu_beats_a_faster_run_projected_from_another(tmp_path):
    """Session 26: P5's plan rests on a run measured on an H100 where there is one (no projection between GPUs), even
    where an H200 run is faster; a job on another GPU (P5e's H200) still takes the fastest of its own; a named run
    is taken as named."""
    _bench(tmp_path, "h200", 1000.0, 1, "2026-11-29T10:00:00Z")  # fake_runs' GPU: an H200
    h100 = "NVIDIA H100 80GB HBM3"
    analysis.write_result_file(tmp_path / "h100.jsonl", run_meta("llama-1b", "fp8", run_id="h100", variant="h100",
                                                                 gpu_name=h100, date="2026-11-29T10:05:00Z"),
                               [{**r, "gpu_name": h100} for r in step_records(12, 950.0, "fp8")])
    est = estimates.MeasuredEstimate(results=str(tmp_path), node_efficiency=1.0)
    p5 = est.rate("llama-1b", "fp8", seq_len=1024)
    assert p5["run_id"] == "h100" and p5["gpu_scale"] == pytest.approx(1.0)
    assert p5["tokens_per_sec_per_gpu"] == pytest.approx(950.0)
    p5e = est.rate("llama-1b", "fp8", seq_len=1024, instance_type="ml.p5e.48xlarge")
    assert p5e["run_id"] == "h200" and p5e["tokens_per_sec_per_gpu"] == pytest.approx(1000.0)
    assert est.rate("llama-1b", "fp8", seq_len=1024, run_id="h200")["run_id"] == "h200"
    b200 = est.rate("llama-1b", "fp8", seq_len=1024, instance_type="ml.p6-b200.48xlarge")  # measured on neither:
    assert b200["run_id"] == "h200"  # the fastest, projected


def test_emulated_and_cpu_runs_are_not_measurements(tmp_path):
    meta = run_meta("llama-1b", "fp8", run_id="emu", backend="emulated", gpu_name="cpu")
    analysis.write_result_file(tmp_path / "emu.jsonl", meta, step_records(12, 5000.0, "fp8", backend="emulated"))
    assert estimates.MeasuredEstimate(results=str(tmp_path)).rate("llama-1b", "fp8") is None


def test_bad_assumptions_are_rejected():
    with pytest.raises(ValueError, match="internode_efficiency_per_doubling"):
        estimates.MeasuredEstimate(internode_efficiency_per_doubling=1.5)
    with pytest.raises(ValueError, match="node_efficiency"):
        estimates.MeasuredEstimate(node_efficiency=0)
    with pytest.raises(ValueError, match="instance_counts"):
        L.plan_curve(["llama-1b"], ["bf16"], [0, 1], 10**9)
    with pytest.raises(ValueError, match="instance_type"):
        L.plan_curve(["llama-1b"], ["bf16"], [1], 10**9, instance_type="ml.x")


def test_plan_curve_matches_the_plan_and_draws_readably():
    plan = L.plan_sweep(["llama-1b", "llama-7b"], ["bf16", "fp8"], [1, 2, 4], role=ROLE, bucket=BUCKET,
                        tokens=24 * 10**9)
    curve = L.plan_curve(["llama-1b", "llama-7b"], ["bf16", "fp8"], list(range(1, 9)), 24 * 10**9)
    assert len(curve) == 2 * 2 * 8 and curve["measured"].all()
    got = curve.set_index(["model", "precision", "instances"])
    for j in plan.jobs:
        row = got.loc[(j.spec.model, j.spec.precision, j.spec.instance_count)]
        assert row["hours"] == pytest.approx(j.est_hours) and row["cost_usd"] == pytest.approx(j.cost_usd)
    fp8, bf16 = (got.xs(p, level="precision") for p in ("fp8", "bf16"))
    assert (fp8["cost_usd"] < bf16["cost_usd"]).all() and (fp8["hours"] < bf16["hours"]).all()
    # more instances: sooner, and (per-GPU rate falling per doubling) a little dearer
    h = got.loc[("llama-1b", "bf16")]
    assert h["hours"].is_monotonic_decreasing and h["cost_usd"].is_monotonic_increasing
    fig = plots.plan_figure(curve)
    stats = plots.figure_stats(fig)
    assert stats["legend_entries"] == 4 and stats["width_px"] <= 1600 and stats["height_px"] <= 900
    assert "\n" not in stats["title"] and "projected from measured one-GPU runs" in stats["title"]  # one line
    # hours on a log axis; cost linear from 0, so the rise with more instances shows
    assert fig.axes[0].get_yscale() == "log" and fig.axes[1].get_yscale() == "linear" and fig.axes[1].get_ylim()[0] == 0
    # the basis the figure's title once carried in seven lines: the curve's columns, which the cost table prints
    notes = " ".join(dict.fromkeys([*curve["assumption"], *curve["gpu_scaling"]]))
    assert "the only measurement" in notes and "the scaling model's multi-node factor" in notes
    assert "measured on NVIDIA H200, projected to H100 80GB by kernel class" in notes and "4.8 against 3.35 TB/s" in notes
    # the planned jobs' instance counts are drawn as their own points: the figure follows instance_counts
    def planned_points(counts):
        f = plots.plan_figure(curve, planned=counts)
        return sorted({x for line in f.axes[1].get_lines() if line.get_markersize() > 5 for x in line.get_xdata()})
    assert planned_points([1, 2, 4]) == [1, 2, 4] and planned_points([1, 2, 4, 8]) == [1, 2, 4, 8]


def test_plan_curve_takes_rate_and_hours_from_the_plan():
    """A row's rate was once the requested settings' (seq_len None: the measured run's own length) while its
    hours were the plan's (seq_len auto: 2048): the two disagreed wherever the measured run ran shorter."""
    curve = L.plan_curve(["gptneo-125m", "llama-1b"], ["bf16", "fp8"], [1, 2], 24 * 10**9, backend="auto",
                         recipe="auto")
    est = estimates.MeasuredEstimate()
    measured = curve[curve["measured"]]
    assert len(measured) == len(curve) == 8
    for _, row in measured.iterrows():
        hours = est.seconds_at(row["tokens"], row["tokens_per_sec_per_gpu"], row["gpus"]) / 3600
        assert row["hours"] == pytest.approx(hours), (row["model"], row["precision"], row["instances"])
