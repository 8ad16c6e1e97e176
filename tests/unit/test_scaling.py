"""The P5 scaling model (issue 32): measured compute by kernel class, modelled FSDP2 traffic, calibrated on
the committed two-GPU runs."""
from __future__ import annotations

import pytest

from fp8lab import analysis, launch as L
from fp8lab.analysis import estimates, scaling
from fp8lab.core import hardware
from fp8lab.model.models import block_matmul_params, count_parameters, get_config


@pytest.fixture(scope="module")
def committed():
    return analysis.summarize_runs(analysis.load_runs())


def test_the_model_reproduces_the_committed_two_gpu_runs_within_5_percent(committed):
    cal = scaling.calibrate(committed)
    runs = cal.runs
    two = committed[(committed["world_size"] == 2) & ~committed["run_id"].isin(list(scaling.CALIBRATION_EXCLUDED))]
    assert set(runs["run_id"]) == set(two["run_id"]) and len(runs) >= 8  # every clean two-GPU run, DDP and FSDP2
    assert (runs["error"].abs() < 0.05).all(), runs[["run_id", "error"]]
    for _, r in runs.iterrows():  # the error is against the result file's own rate
        assert r["measured_tokens_per_sec_per_gpu"] == pytest.approx(
            committed.set_index("run_id").loc[r["run_id"], "tokens_per_sec_per_gpu"])
    assert 0 <= cal.overlap <= 1 and 0 < cal.link_efficiency <= 1 and cal.overhead_ms > 0


def test_gpu_projection_scales_gemms_by_peak_and_the_rest_by_bandwidth():
    split = scaling.ComputeSplit(fp8_gemm=0.25, bf16=0.25, memory=0.4, idle=0.1, profile="x")
    assert split.time_scale("NVIDIA H200", "H100 80GB") == pytest.approx(0.25 + 0.25 + 0.4 * 4.8 / 3.35 + 0.1)
    assert split.time_scale("NVIDIA H200", "B200 180GB") == pytest.approx(
        0.25 * 1979 / 4500 + 0.25 * 989 / 2250 + 0.4 * 4.8 / 8.0 + 0.1)
    none = scaling.compute_split({"model": "llama-1b", "precision": "fp8"}, analysis.load_profiles([]))
    assert none.bf16 == 1 and none.time_scale("NVIDIA H200", "H100 80GB") == pytest.approx(1.0)


def test_a_committed_profile_splits_its_own_run(committed):
    run = committed.set_index("run_id").loc["llama-1b-te-fp8-delayed-p16-mb16-ga4-alone"].to_dict()
    split = scaling.compute_split({**run, "run_id": "llama-1b-te-fp8-delayed-p16-mb16-ga4-alone"},
                                  scaling.profiles_of(committed))
    assert split.profile == "llama-1b-te-fp8-delayed-p16-mb16-ga4-alone"
    assert split.fp8_gemm + split.bf16 + split.memory + split.idle == pytest.approx(1.0)
    assert 0.3 < split.fp8_gemm < 0.6 and split.memory > 0.1  # fp8 gemm 570 ms of 1,276 ms


def test_fsdp2_traffic_in_bytes():
    p = count_parameters(get_config("llama-7b")).total
    linears = block_matmul_params(get_config("llama-7b")) * get_config("llama-7b").num_layers
    kept = scaling.traffic("llama-7b", 16, grad_accum=8)
    assert kept["all_gather"] == pytest.approx(2 * p * 15 / 16) and kept["reduce_scatter"] == pytest.approx(4 * p * 15 / 16)
    regather = scaling.traffic("llama-7b", 16, grad_accum=8, keep_weights=False)
    assert regather["all_gather"] == pytest.approx(16 * 2 * p * 15 / 16)
    fp8 = scaling.traffic("llama-7b", 16, grad_accum=8, fp8_all_gather=True)
    assert fp8["all_gather"] == pytest.approx((linears + 2 * (p - linears)) * 15 / 16)
    assert scaling.traffic("llama-7b", 1, grad_accum=8) == {}
    assert scaling.link_peak("H100 80GB", "ml.p5.48xlarge", 2) == pytest.approx(3200e9 / 8 / 8)
    assert scaling.link_peak("H100 80GB", "ml.p5.48xlarge", 1) == hardware.gpu_spec(hardware.NVLINK_BANDWIDTH, "H100")


def test_fp8s_gain_shrinks_when_communication_cannot_hide_and_the_plan_says_what_helps():
    cal = scaling.Calibration(link_efficiency=0.3, overlap=0.95, overhead_ms=10.0)
    small = {"model": "llama-7b", "gpu_name": "NVIDIA H200", "micro_batch_size": 1, "grad_accum": 2, "seq_len": 2048}
    bf16 = scaling.efficiency({**small, "tokens_per_sec_per_gpu": 14000.0}, 16, calibration=cal)
    fp8 = scaling.efficiency({**small, "tokens_per_sec_per_gpu": 21000.0}, 16, calibration=cal)
    fp8_ag = scaling.efficiency({**small, "tokens_per_sec_per_gpu": 21000.0}, 16, calibration=cal, fp8_all_gather=True)
    assert fp8["comm_bound"] and fp8["efficiency"] < bf16["efficiency"] < 1  # same bytes, less compute to hide them
    assert fp8["efficiency"] < fp8_ag["efficiency"]
    gain = 21000 * fp8["efficiency"] / (14000 * bf16["efficiency"])
    assert gain < 1.5 * 0.9
    bigger = scaling.efficiency({**small, "tokens_per_sec_per_gpu": 21000.0}, 16, calibration=cal, grad_accum=32)
    assert bigger["efficiency"] > fp8["efficiency"]  # accumulation amortises the per-step traffic
    text = scaling.advice("llama-7b", 1.05, fp8_all_gather_possible=True, instances=16)
    assert "communication-bound" in text and "micro-batch" in text and "FP8 all-gather" in text and "fewer instances" in text
    assert scaling.advice("llama-7b", 1.3, fp8_all_gather_possible=True, instances=16) is None


def test_launch_plan_prints_bf16_fp8_and_fp8_all_gather_per_instance_count():
    plan = L.plan_sweep(["llama-7b"], ["bf16", "fp8"], [1, 2, 16], role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET,
                        tokens=24 * 10**9)
    text = L.format_cost_table(plan)
    assert "scaling model (fp8lab.analysis.scaling" in text and "0.95 per doubling" not in text
    for n in (1, 2, 16):
        line = next(x for x in text.splitlines() if x.startswith(f"  llama-7b x{n}: "))
        assert "bf16 " in line and "; fp8 " in line and "fp8 + fp8 all-gather" in line
    assert "backend te has no FP8 all-gather in fp8lab: --backend torchao" in text
    t = scaling.instance_table(plan.estimate, "llama-7b", [1, 2, 16], 24e9, price_per_hour=plan.price_per_hour)
    one = {(r.instances, r.mode): r for r in t.itertuples()}
    job = {(j.spec.instance_count, j.spec.precision): j for j in plan.jobs}
    for n in (1, 2, 16):  # the table's BF16/FP8 hours are the plan's own
        for p in ("bf16", "fp8"):
            assert one[n, p].hours == pytest.approx(job[n, p].est_hours)
        assert one[n, "fp8"].internode_efficiency < 1 or n == 1


def test_the_answer_at_scale_rests_on_its_runs(committed):
    answer = analysis.Answer.of(committed)
    row = answer.row("llama-7b", priced=True)  # the row its time and cost rest on (it has one per GPU measured)
    t = answer.at_scale("llama-7b", (1, 4))
    one = t[t["instances"] == 1].set_index("mode")
    for prec in ("bf16", "fp8"):  # one instance: the Answer's own hours and cost
        assert one.loc[prec, "run_id"] == row[f"{prec}_run"]
        assert one.loc[prec, "hours"] == pytest.approx(row[f"hours_{prec}"])
        assert one.loc[prec, "cost_usd"] == pytest.approx(row[f"cost_{prec}"])
    four = t[t["instances"] == 4].set_index("mode")
    assert (four["internode_efficiency"] < 1).all() and (four["hours"] < one["hours"] / 3).all()
