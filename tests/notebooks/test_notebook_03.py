"""Notebook 03 executes for real under papermill with its CPU defaults: BF16 and emulated FP8
runs of a tiny Llama on the shipped corpus, same weights and batches, loss curves + throughput."""
from __future__ import annotations

import nbformat

from fp8lab.records import metrics as fmetrics
from figure_outputs import assert_figures_readable_and_saved
from fp8lab.notebooks import NOTEBOOK_DIR, declared_parameters, read_glued, run
from prose import assert_notebook_prose_short

NB = NOTEBOOK_DIR / "03_train_bf16_vs_fp8.ipynb"


def test_parameters_are_declared():
    params = declared_parameters(NB)
    assert {"model", "steps", "backends", "recipe"} <= set(params)
    assert params["model"] == "llama-tiny" and params["backends"] == ["auto"]


def test_defaults_train_bf16_and_fp8_on_the_same_tokens(tmp_path):
    res = run(["03"], {}, output_dir=tmp_path, progress=False)
    assert_notebook_prose_short(res[0].output)
    vals = read_glued(res[0].output)
    assert vals["device"] == "cpu" and vals["labels"] == ["fp32", "fp8 emulated"]  # a CPU computes the baseline in fp32
    assert "only the loss comparison is meaningful" in vals["note"]
    first, final = vals["first_losses"], vals["final_val_loss"]
    assert abs(first["fp32"] - first["fp8 emulated"]) < 0.01  # same weights, same first batch
    assert final["fp32"] < first["fp32"] - 1.0  # 60 steps on real text: the model learns
    assert abs(vals["val_loss_gap_pct"]["fp8 emulated"]) < 2.0  # FP8 (emulated) learns about as well
    assert vals["steps"] == {"fp32": 60, "fp8 emulated": 60}
    # the glued numbers are the trainer's files, not notebook arithmetic
    runs = tmp_path / NB.stem / "runs"
    for label, folder in (("fp32", "fp32"), ("fp8 emulated", "fp8-emulated")):
        recs = fmetrics.read_metrics(runs / folder / "metrics.jsonl")
        assert [r["step"] for r in recs] == list(range(1, 61))
        assert recs[0]["loss"] == first[label] and recs[-1]["val_loss"] == final[label]
    assert recs[0]["precision"] == "fp8" and recs[0]["backend"] == "emulated"
    nb = nbformat.read(str(res[0].output), as_version=4)
    pngs = sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert pngs == 2  # the pair's figure, and the FP8 run's health: underflow and saturation in one figure (issue 31)
    assert assert_figures_readable_and_saved(res[0].output, tmp_path / NB.stem) == [
        "loss_and_throughput.png", "fp8_health_fp8_emulated.png"]
    assert vals["fp8_stats_steps"] == {"fp8 emulated": [10, 20, 30, 40, 50, 60]}  # the default --fp8-stats-every 10
    health = [r for r in fmetrics.read_metrics(runs / "fp8-emulated" / "metrics.jsonl", "fp8_stats")]
    assert {row["kind"] for row in health[0]["layers"]} == {"activation", "weight", "gradient"}
    assert not fmetrics.read_metrics(runs / "fp32" / "metrics.jsonl", "fp8_stats")  # no FP8 casts in the baseline
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    layout_lines = [l for l in text.splitlines() if l.startswith("fp8lab: layout:")]
    assert len(layout_lines) == 1, layout_lines  # the layout both runs share, printed once


def test_config_replays_a_run_as_a_pair(tmp_path):
    """config: a run's config.json replayed (fp8lab.train.replay): its model, steps, layout, lr and seed, both runs;
    each run's config.json says what it replayed."""
    import json

    first = run(["03"], {"steps": 6, "seed": 3}, output_dir=tmp_path / "first", progress=False)
    record = tmp_path / "first" / NB.stem / "runs" / "fp8-emulated" / "config.json"
    again = run(["03"], {"config": str(record)}, output_dir=tmp_path / "again", progress=False)
    a, b = read_glued(first[0].output), read_glued(again[0].output)
    assert b["steps"] == {"fp32": 6, "fp8 emulated": 6} and b["layouts"] == a["layouts"]  # not the defaults' 60 steps
    assert b["first_losses"] == a["first_losses"]  # the same seed's weights, the same first batch
    replayed = json.loads((tmp_path / "again" / NB.stem / "runs" / "fp8-emulated" / "config.json").read_text())
    original = json.loads(record.read_text())
    assert replayed["plan"] == original["plan"] and replayed["requested"]["seed"] == 3
    assert replayed["replayed_from"]["sha256"] == __import__("hashlib").sha256(record.read_bytes()).hexdigest()
