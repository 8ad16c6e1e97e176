"""Notebook 06 executes for real under papermill with its CPU defaults: a tiny Llama folder made with its own
tokenizer and chat template is fine-tuned on the shipped instruction set in full and with LoRA, each in fp32 and
emulated FP8 from the same weights, and the same fine-tunes are priced on P5 by the launch planner."""
from __future__ import annotations

import json

import nbformat
import pytest

from figure_outputs import assert_figures_readable_and_saved
from fp8lab.notebooks import NOTEBOOK_DIR, declared_parameters, read_glued, run
from prose import assert_notebook_prose_short

NB = NOTEBOOK_DIR / "06_fine_tune.ipynb"
RUNS = ["full fp32", "full fp8 emulated", "lora fp32", "lora fp8 emulated"]


def test_parameters_are_declared():
    params = declared_parameters(NB)
    assert params["model"] is None and params["data"] is None and params["backends"] == ["auto"]
    assert {"steps", "lora_rank", "lr", "lora_lr", "p5_model", "tokens", "price_per_hour"} <= set(params)


def test_defaults_fine_tune_in_full_and_lora_bf16_against_fp8_and_price_p5(tmp_path):
    res = run(["06"], {}, output_dir=tmp_path, progress=False)
    assert_notebook_prose_short(res[0].output)
    vals = read_glued(res[0].output)
    assert vals["device"] == "cpu" and vals["runs"] == RUNS
    assert vals["steps"] == dict.fromkeys(RUNS, 8)
    first, heldout, gap = vals["first_loss"], vals["heldout_answer_loss"], vals["gap_pct"]
    assert max(first.values()) - min(first.values()) < 0.01  # the same weights and first batch in every run
    assert heldout["full fp32"] < first["full fp32"] - 0.3  # the full fine-tune learns the answers
    assert heldout["lora fp32"] < first["lora fp32"]  # LoRA too, less on a random base
    assert all(abs(gap[r]) < 1.0 for r in RUNS)  # emulated FP8 within 1% of its baseline, in both methods
    assert vals["trained_params"]["lora fp32"] < vals["trained_params"]["full fp32"] / 5  # adapters only
    # the glued numbers are the trainer's files, and the runs are what the notebook says they are
    runs = tmp_path / NB.stem / "runs"
    for key, folder in zip(RUNS, ("full/fp32", "full/fp8-emulated", "lora/fp32", "lora/fp8-emulated")):
        summary = json.loads((runs / folder / "summary.json").read_text())
        rec = json.loads((runs / folder / "config.json").read_text())
        assert summary["val_loss"] == heldout[key] and summary["first_loss"] == first[key]
        assert rec["task"] == "sft" and rec["data_manifest"]["tokenizer_source"]["name"] == "tiny-llama"
        assert (rec["lora_rank"], rec["fuse"]) == ((8, True) if key.startswith("lora") else (0, True))
    assert json.loads((runs / "lora/fp32/config.json").read_text())["lr"] == pytest.approx(
        5 * json.loads((runs / "full/fp32/config.json").read_text())["lr"])  # lora_lr "auto": 5 x the full one's
    assert assert_figures_readable_and_saved(res[0].output, tmp_path / NB.stem) == ["heldout_answer_loss.png"]
    p5 = vals["p5"]
    assert [(r["method"], r["precision"]) for r in p5] == [("full", "bf16"), ("full", "fp8"), ("lora", "bf16"),
                                                           ("lora", "fp8")]
    assert all(r["model"] == "llama-1b" and r["tokens"] == 100_000_000 and r["gpus"] == 8 and r["cost_usd"] > 0
               for r in p5)
    nb = nbformat.read(str(res[0].output), as_version=4)
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "measured llama-1b-" in text  # what the estimate rests on, named
    assert "«" in text and "<|eot_id|>»" in text  # the example shows the answer tokens that carry the loss


def test_bad_parameters_are_refused_before_anything_runs(tmp_path):
    for params, said in (({"lora_rank": 0}, "lora_rank"), ({"seq_len": 0}, "seq_len"), ({"lora_lr": 5.0}, "lr"),
                         ({"steps": "many"}, "steps")):
        with pytest.raises(ValueError, match=said):
            run(["06"], params, output_dir=tmp_path, progress=False)
    assert not (tmp_path / NB.name).exists()
