"""FP8 health statistics (issue 31) from the emulated backend: what a cast does to a tensor, per layer
and kind, and the early warning when a layer stays past its threshold."""
from __future__ import annotations

import json

import pytest
import torch

from fp8lab.analysis import fp8_stats as fp8read
from fp8lab.fp8 import formats, stats as fp8stats
from fp8lab.fp8.convert import convert_model
from fp8lab.model.models import build_model
from fp8lab.plan import fp8_stats as fp8rule


def test_tensor_stats_counts_underflow_and_saturation_of_a_cast():
    t = torch.tensor([0.0, 1e-6, 1.0, 2.0, 500.0, -900.0])
    amax, under, sat, scale = fp8stats.tensor_stats(t, formats.E4M3, 1.0).tolist()
    assert amax == 900.0 and scale == 1.0
    assert under == pytest.approx(1 / 6)  # 1e-6 flushes to 0 (the exact 0 is not an underflow)
    assert sat == pytest.approx(2 / 6)  # 500 and -900 reach E4M3's max, 448
    q = formats.quantize(t, formats.E4M3, 1.0)
    assert fp8stats.tensor_stats(t, formats.E4M3, 1.0, q)[1].item() == pytest.approx(1 / 6)  # counted on the cast
    assert torch.isnan(fp8stats.tensor_stats(t, formats.E4M3, None, q)[2])  # block scales: no per-tensor saturation


def _tiny(recipe: str):
    model = convert_model(build_model("llama-tiny", seed=0), backend="emulated", recipe=recipe)
    stats = fp8stats.attach(model, "emulated", 1)
    return model, stats


def _step(model, stats, step: int, recipe: str):
    from fp8lab.fp8.backends import get_backend
    from fp8lab.fp8.recipe import Recipe

    x = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(step))
    stats.begin(step)
    with get_backend("emulated").autocast(Recipe.parse(recipe)):
        loss = model(x).logits.float().logsumexp(-1).mean()
    loss.backward()
    model.zero_grad()
    return stats.end(step)


def test_every_gemm_reports_activation_weight_and_gradient():
    model, stats = _tiny("delayed")
    rec = _step(model, stats, 1, "delayed")
    assert rec["record"] == fp8stats.RECORD and rec["step"] == 1
    got = {(r["layer"], r["kind"]) for r in rec["layers"]}
    sites = {r["layer"] for r in rec["layers"]}
    assert {"blocks.0.qkv", "blocks.0.proj", "blocks.0.mlp.fc1", "blocks.0.mlp.fc2", "blocks.1.mlp.fc2"} <= sites
    assert got == {(s, k) for s in sites for k in ("activation", "weight", "gradient")}
    fmt = {r["kind"]: r["format"] for r in rec["layers"]}
    assert fmt == {"activation": "E4M3", "weight": "E4M3", "gradient": "E5M2"}  # HYBRID
    assert all(r["amax"] > 0 and r["scale"] == 1.0 for r in rec["layers"])  # delayed scaling's first step: scale 1
    rec2 = _step(model, stats, 2, "delayed")  # the scale now follows the amax of step 1
    w1 = {r["layer"]: r for r in rec["layers"] if r["kind"] == "weight"}
    for r in (r for r in rec2["layers"] if r["kind"] == "weight"):
        assert r["scale"] == pytest.approx(448.0 / w1[r["layer"]]["amax"], rel=1e-5)


def test_nothing_is_recorded_between_sampled_steps():
    model, _ = _tiny("current")
    stats = fp8stats.attach(model, "emulated", 5)
    assert _step(model, stats, 3, "current") is None and not fp8stats.watching()
    assert len(_step(model, stats, 5, "current")["layers"]) > 0


@pytest.mark.parametrize("recipe", ["delayed", "current"])
def test_an_injected_weight_outlier_is_seen_and_warned_about(recipe, capsys):
    model, stats = _tiny(recipe)
    target = "blocks.1.mlp.fc1"
    with torch.no_grad():  # one weight 10^5 times its neighbours: the per-tensor scale flushes the rest to 0
        model.blocks[1].mlp.fc1_weight[0, 0] = 1e4
    recs = [_step(model, stats, s, recipe) for s in range(1, 5)]
    hit = [r for r in recs[-1]["layers"] if r["layer"] == target and r["kind"] == "weight"][0]
    assert hit["amax"] == pytest.approx(1e4) and hit["underflow"] > 0.5  # |w| < 0.022 of N(0, 0.02): ~72%
    others = [r for r in recs[-1]["layers"] if r["kind"] == "weight" and r["layer"] != target]
    assert max(r["underflow"] for r in others) < 0.05
    warned = [w for r in recs for w in r.get("warnings", [])]
    row = lambda r: [x for x in r["layers"] if x["layer"] == target and x["kind"] == "weight"][0]  # noqa: E731
    over = [r for r in recs if row(r)["underflow"] >= fp8stats.UNDERFLOW_WARN]  # delayed: from step 2 (step 1's scale is 1)
    assert len(over) >= fp8stats.WARN_SAMPLES
    mine = [w for w in warned if f"{target} weight" in w]  # (the outlier also reaches fc2's input: it may warn too)
    assert len(mine) == 1 and mine[0] in over[fp8stats.WARN_SAMPLES - 1]["warnings"]  # once, at the 3rd sample
    assert all(w.startswith("FP8 health: blocks.1.") for w in warned)  # block 0 is untouched
    assert "underflow" in mine[0] and "--recipe current" in mine[0] and "amax_history_len" in mine[0]
    assert "--bf16-edge-blocks" in mine[0]


def test_an_activation_spike_saturates_under_delayed_scaling():
    model, stats = _tiny("delayed")
    _step(model, stats, 1, "delayed")
    with torch.no_grad():  # the input norm's weight scaled up 1000x: the next cast still uses the old scale
        model.blocks[0].mlp.layer_norm_weight.mul_(1000)
    rec = _step(model, stats, 2, "delayed")
    hit = [r for r in rec["layers"] if r["layer"] == "blocks.0.mlp.fc1" and r["kind"] == "activation"][0]
    assert hit["saturation"] > 0.01


def test_watch_needs_consecutive_samples():
    w = fp8stats.Watch(samples=3)
    row = lambda v: {"record": "fp8_stats", "step": 0, "layers": [{"layer": "a", "kind": "weight", "format": "E4M3",  # noqa: E731
                                                                   "saturation": v, "underflow": 0.0}]}
    seq = [0.5, 0.5, 0.0, 0.5, 0.5, 0.5, 0.5]
    fired = [bool(w.update({**row(v), "step": i + 1})) for i, v in enumerate(seq)]
    assert fired == [False, False, False, False, False, True, False]


def test_attach_has_nothing_to_watch_without_fp8_layers():
    assert fp8stats.attach(build_model("llama-tiny", seed=0), None, 10) is None


def test_the_plan_decides_the_statistics_once_with_a_reason():
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.runplan import plan_run
    from fp8lab.train.entry import TrainConfig

    h200 = Machine("cuda", "NVIDIA H200", 139.8, te_usable=True, fp8=True)
    fp8 = plan_run(TrainConfig(model="llama-1b", precision="fp8"), h200)
    assert fp8.fp8_stats_every == fp8rule.DEFAULT_EVERY["te"] == 25  # auto on TE: the measured <= 2% interval
    assert fp8.layout.grad_accum >= 4 and "every 25 steps (auto: te at" in fp8.all_reasons()["fp8_stats"]
    one = plan_run(TrainConfig(model="llama-1b", precision="fp8", micro_batch_size=16, grad_accum=1), h200)
    assert one.fp8_stats_every == 100  # a sample costs ~one micro-batch: 4x rarer at one micro-batch a step
    assert [fp8rule.default_every("te", a) for a in (1, 2, 3, 4, 8)] == [100, 50, 50, 25, 25]
    assert fp8.record()["fp8_stats_every"] == 25
    cpu = plan_run(TrainConfig(model="llama-tiny", precision="fp8"), Machine("cpu", "cpu", 24.0))
    assert cpu.fp8_stats_every == fp8rule.DEFAULT_EVERY["emulated"] == 10  # emulated: short CPU runs, more columns
    asked = plan_run(TrainConfig(model="llama-1b", precision="fp8", fp8_stats_every=7), h200)
    assert asked.fp8_stats_every == 7 and "--fp8-stats-every" in asked.all_reasons()["fp8_stats"]
    off = plan_run(TrainConfig(model="llama-1b", precision="fp8", fp8_stats_every=0), h200)
    assert off.fp8_stats_every == 0 and "off" in off.all_reasons()["fp8_stats"]
    assert plan_run(TrainConfig(model="llama-1b", precision="bf16"), h200).fp8_stats_every == 0  # no FP8 casts
    graphed = plan_run(TrainConfig(model="llama-7b", precision="fp8", micro_batch_size=1, cuda_graphs="on"), h200)
    assert graphed.graphs.active and graphed.fp8_stats_every == 0
    assert "CUDA graphs" in graphed.all_reasons()["fp8_stats"] and "--cuda-graphs off" in graphed.all_reasons()["fp8_stats"]
    compiled = plan_run(TrainConfig(model="llama-1b", precision="fp8", compile=True), h200)
    assert compiled.fp8_stats_every == 0 and "--compile" in compiled.all_reasons()["fp8_stats"]
    with pytest.raises(ValueError, match="--fp8-stats-every"):
        TrainConfig(fp8_stats_every=-1)


def test_a_run_writes_the_records_and_the_step_readers_skip_them(prepared, tmp_path):
    from fp8lab import analysis
    from fp8lab.records import metrics as fmetrics
    from fp8lab.train.entry import TrainConfig, train

    base = dict(model="llama-tiny", seq_len=32, micro_batch_size=2, compute_dtype="fp32", plot=False, progress="off",
                print_metrics=False, steps=4, precision="fp8", backend="emulated", save_model=False, data=str(prepared),
                checkpoint_every=-1)
    on, off = tmp_path / "on", tmp_path / "off"
    train(TrainConfig(**base, fp8_stats_every=2, output_dir=str(on)))
    train(TrainConfig(**base, fp8_stats_every=0, output_dir=str(off)))
    assert [r["step"] for r in fmetrics.read_metrics(on / "metrics.jsonl", fp8stats.RECORD)] == [2, 4]
    assert fmetrics.read_metrics(off / "metrics.jsonl", fp8stats.RECORD) == []
    assert [r["step"] for r in fmetrics.read_metrics(on / "metrics.jsonl")] == [1, 2, 3, 4]  # step records only
    assert [r["loss"] for r in fmetrics.read_metrics(on / "metrics.jsonl")] == \
        [r["loss"] for r in fmetrics.read_metrics(off / "metrics.jsonl")]  # watching changes nothing
    assert len(analysis.load_runs(on)) == 4  # one row per step, none for the statistics
    assert list(fp8read.of_sources(tmp_path)) == ["on"]
    from fp8lab.views import report

    page = report.build_report(tmp_path, tmp_path / "r.html").read_text()
    section = page[page.index("<h2>FP8 health</h2>"):]
    section = section[:section.index("<h2>", 5)]
    # one figure a run: underflow and saturation as two rows of heatmaps (the page drew two figures before)
    assert "<h3>on</h3>" in section and "<h3>off</h3>" not in section and section.count("<img") == 1
    assert 'alt="FP8 underflow and saturation per decoder block and step, on"' in section
    assert "No early warning in this run." in section
    assert "Read by fp8lab (the emulator&#x27;s quantizers" in section  # who read the casts (te-debug: TE's debug API)
    assert "debug API" in fp8read.source_text([{"record": fp8stats.RECORD, "step": 1, "layers": [], "source": "te-debug"}])
    empty = report.build_report(off, tmp_path / "r2.html").read_text()
    assert "No FP8 statistics in these runs" in empty


# --- --fp8-stats-source: TE's own debug API (fp8lab.fp8.te_debug); its GPU part: tests/gpu/test_fp8stats_gpu.py

def test_te_debug_config_asks_for_what_the_records_hold():
    from fp8lab.fp8 import te_debug

    cfg = te_debug.config(25, delayed=True)["fp8lab_health"]
    te = cfg["transformer_engine"]
    assert cfg["enabled"] and cfg["layers"] == {"layer_name_regex_pattern": ".*"}
    assert te["LogFp8TensorStats"]["stats"] == ["underflows%", "scale_inv_min", "overflows%"]
    assert te["LogTensorStats"]["stats"] == ["cur_amax"]
    assert {f["freq"] for f in te.values()} == {25} and all(f["tensors"] == ["activation", "weight", "gradient"] for f in te.values())
    # current scaling cannot clip, and TE refuses overflows% for it: not asked
    assert "overflows%" not in te_debug.config(10, delayed=False)["fp8lab_health"]["transformer_engine"]["LogFp8TensorStats"]["stats"]
    assert -1 % 2 and te_debug.NEVER == -1  # between steps the debug API sits on an iteration no interval >= 2 samples


def test_te_debug_scalars_become_fp8stats_rows():
    from fp8lab.fp8 import te_debug

    assert te_debug.parse_name("blocks.0.mlp.fc1_gradient_underflows%") == ("blocks.0.mlp.fc1", "g", "underflows%")
    assert te_debug.parse_name("blocks.1.qkv_activation_cur_amax") == ("blocks.1.qkv", "x", "cur_amax")
    assert te_debug.parse_name("blocks.1.qkv_output_max") is None  # not a tensor fp8lab asks about
    logged = [("blocks.0.qkv_activation_underflows%", torch.tensor(2.5), 10),
              ("blocks.0.qkv_activation_scale_inv_min", torch.tensor(0.5), 10),
              ("blocks.0.qkv_activation_overflows%", torch.tensor(0.05), 10),
              ("blocks.0.qkv_activation_cur_amax", torch.tensor(224.0), 10),
              ("blocks.0.qkv_gradient_underflows%", 40.0, 10),
              ("blocks.0.qkv_gradient_scale_inv_min", torch.tensor(0.0), 10),  # no per-tensor scale
              ("blocks.0.qkv_gradient_cur_amax", torch.tensor(1e-3), 10),
              ("blocks.0.qkv_weight_cur_amax", torch.tensor(9.0), 9)]  # another iteration: left out
    rows = te_debug.rows(logged, 10, {"x": "E4M3", "w": "E4M3", "g": "E5M2"})
    assert rows == [
        {"layer": "blocks.0.qkv", "kind": "activation", "format": "E4M3", "amax": 224.0, "scale": 2.0,
         "underflow": pytest.approx(0.025), "saturation": pytest.approx(0.0005)},
        {"layer": "blocks.0.qkv", "kind": "gradient", "format": "E5M2", "amax": pytest.approx(1e-3), "scale": None,
         "underflow": 0.4, "saturation": None}]
    assert te_debug.rows(logged, 11, {}) == []
    blocks = te_debug.rows(logged, 10, {"x": "E4M3", "w": "E4M3", "g": "E4M3"}, per_tensor=False)
    assert [r["scale"] for r in blocks] == [None, None]  # block scales: no one scale per tensor
    warn = fp8stats.Watch(samples=1).update({"record": fp8stats.RECORD, "step": 10, "layers": rows})
    assert len(warn) == 1 and "blocks.0.qkv gradient (E5M2)" in warn[0] and "underflow" in warn[0]


def test_the_plan_picks_who_reads_the_casts():
    """Who reads the casts is a function of the machine's facts (TE's debug API there, its TE release) and the
    evidence (TE's debug API's committed GPU check), both given to the plan: nothing of this process is read."""
    import dataclasses

    from fp8lab.core.hardware import Machine
    from fp8lab.plan.evidence import Evidence
    from fp8lab.plan.runplan import plan_run
    from fp8lab.train.entry import TrainConfig

    fp8 = dict(model="llama-1b", precision="fp8")
    without_inspect = Machine("cuda", "NVIDIA H200", 139.8, te_usable=True, fp8=True,
                              te_debug_problem="nvdlfw-inspect is not installed", te_release="2.20.2")
    passed = Evidence(te_debug=True, te_debug_te="2.20.2")
    without = plan_run(TrainConfig(**fp8), without_inspect, passed)
    assert without.fp8_stats_source == fp8stats.OWN and "nvdlfw-inspect is not installed" in without.all_reasons()["fp8_stats"]
    with pytest.raises(ValueError, match="--fp8-stats-source te-debug cannot run here: nvdlfw-inspect.*auto | fp8lab"):
        plan_run(TrainConfig(**fp8, fp8_stats_source="te-debug"), without_inspect, passed)
    h200 = dataclasses.replace(without_inspect, te_debug_problem=None)
    unchecked = plan_run(TrainConfig(**fp8), h200, Evidence())  # installed, its GPU check not committed: asked for only
    assert unchecked.fp8_stats_source == fp8stats.OWN and "GPU check" in unchecked.all_reasons()["fp8_stats"]
    assert "not committed yet" in unchecked.all_reasons()["fp8_stats"]
    failed_check = Evidence(te_debug_problems=("cost at the default interval (25 steps): 58.7% > 2%",))
    failed = plan_run(TrainConfig(**fp8), h200, failed_check)  # committed, and failed: the reason says why
    assert failed.fp8_stats_source == fp8stats.OWN
    assert "failed its GPU check (fp8stats-sources/check.json: cost at the default interval (25 steps): 58.7% > 2%)" \
        in failed.all_reasons()["fp8_stats"]
    assert plan_run(TrainConfig(**fp8, fp8_stats_source="te-debug"), h200, failed_check).fp8_stats_source == fp8stats.TE_DEBUG
    other_te = dataclasses.replace(h200, te_release="2.8.0+abc")  # checked on another TE release: not trusted
    other = plan_run(TrainConfig(**fp8), other_te, passed)
    assert other.fp8_stats_source == fp8stats.OWN and "checked on Transformer Engine 2.20.2, this machine has 2.8.0+abc" in \
        other.all_reasons()["fp8_stats"]
    auto = plan_run(TrainConfig(**fp8), dataclasses.replace(h200, te_release="2.20.1"), passed)  # the same release
    assert auto.fp8_stats_source == fp8stats.TE_DEBUG and "TE's debug API" in auto.all_reasons()["fp8_stats"]
    assert auto.record()["fp8_stats_source"] == "te-debug" and "fp8_stats_source" not in auto.decisions()  # not a job's check
    asked = plan_run(TrainConfig(**fp8, fp8_stats_source="fp8lab"), h200, passed)
    assert asked.fp8_stats_source == fp8stats.OWN and "--fp8-stats-source fp8lab" in asked.all_reasons()["fp8_stats"]
    two = plan_run(TrainConfig(**fp8), dataclasses.replace(h200, world_size=2), passed)
    assert two.fp8_stats_source == fp8stats.OWN and "several processes" in two.all_reasons()["fp8_stats"]
    assert plan_run(TrainConfig(**fp8, fp8_stats_every=0), h200, passed).fp8_stats_source is None
    cpu = Machine("cpu", "cpu", 24.0)
    assert plan_run(TrainConfig(model="llama-tiny", precision="fp8"), cpu).fp8_stats_source == fp8stats.OWN  # emulated
    with pytest.raises(ValueError, match="--fp8-stats-source te-debug .* needs --backend te .*allowed here: auto | fp8lab"):
        plan_run(TrainConfig(model="llama-tiny", precision="fp8", fp8_stats_source="te-debug"), cpu)
    with pytest.raises(ValueError, match="--fp8-stats-source"):
        TrainConfig(fp8_stats_source="tensorboard")


def test_the_committed_te_debug_cost_split_supports_what_docs_training_says():
    """docs/training.md and fp8stats-sources/ABOUT.md read data/results/fp8stats-sources/te-debug-cost.json (session
    18, the H200): every variant recorded the same rows; most of a sample's cost comes from TE's two statistics
    features together, not from any one statistic; feeding the first micro-batch only cuts the full set to about a
    third. The figures the docs quote are this file's, rounded."""
    from fp8lab.core.paths import REPO_ROOT

    path = REPO_ROOT / "data" / "results" / "fp8stats-sources" / "te-debug-cost.json"
    data = json.loads(path.read_text())
    cost = {v["variant"]: v["sample_cost_s"] for v in data["variants"]}
    assert {len(set(v["rows_per_sample"])) for v in data["variants"]} == {1}
    assert {v["rows_per_sample"][0] for v in data["variants"]} == {48}  # 16 GEMMs x 3 operands, every variant
    singles = [cost[k] for k in ("amax-only", "scale-only", "overflow-only", "underflow-only")]
    assert max(singles) < cost["fp8-all"] < cost["full"] / 3  # no one statistic, nor TE's FP8 feature, is the cost
    assert cost["no-overflow"] > 3 * (cost["underflow-only"] + cost["scale-only"] + cost["amax-only"])  # together
    assert cost["full-first-mb"] < cost["full"] / 2.5
    text = (REPO_ROOT / "docs" / "training.md").read_text()
    for k in ("full", "fp8-all", "full-first-mb", "amax-only"):
        assert f"{cost[k]:.2f} s" in text, k


def test_records_of_a_kind_are_found_without_parsing_every_step():
    """Issue 47: metrics_in skips, unparsed, the lines that cannot hold the record asked for (neither its name nor a
    \\u escape in them); what it returns is what parsing every line returns, an escaped name included."""
    import json

    from fp8lab.records import metrics as fmetrics

    lines = [json.dumps({"step": i, "loss": 1.0 / (i + 1)}) for i in range(50)]
    lines += [json.dumps({"record": fp8stats.RECORD, "step": 10, "layers": []}),
              '{"record": "fp8\\u005fstats", "step": 20, "layers": []}',  # the same name, escaped
              '{"record": "fp8_stats", "step": 30',  # a torn last line
              json.dumps({"record": "summary", "note": "fp8_stats in a note"})]
    text = "\n".join(lines)

    def every_line(record):
        out = []
        for line in text.splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and rec.get("record") == record:
                out.append(rec)
        return out

    for record in (fp8stats.RECORD, "summary", None):
        assert fmetrics.metrics_in(text, record) == every_line(record)
    assert [r["step"] for r in fmetrics.metrics_in(text, fp8stats.RECORD)] == [10, 20]
