"""A fine-tune's runs (task sft, sft-lora) pair among their own task and stay out of the pretraining headline and the
plan's rates (fp8lab.analysis.labels.is_fine_tune)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fp8lab import analysis
from fp8lab.analysis.estimates import measurable_runs
from fp8lab.analysis.labels import is_fine_tune, task_label, variant_label

H100 = "NVIDIA H100 80GB HBM3"


def _summary() -> pd.DataFrame:
    rows = [("pretrain", "bf16", 70_000.0), ("pretrain", "fp8", 90_000.0), (np.nan, "fp8", 88_000.0),
            ("sft", "bf16", 74_000.0), ("sft", "fp8", 95_000.0),
            ("sft-lora", "bf16", 62_000.0), ("sft-lora", "fp8", 68_000.0)]
    return pd.DataFrame([{"study": "x", "model": "llama-3.2-1b", "gpu_name": H100, "precision": prec,
                          "backend": "te", "recipe": "delayed" if prec == "fp8" else None, "fuse": True,
                          "variant": f"{task}-{prec}", "run_id": f"r{i}", "task": task,
                          "tokens_per_sec_per_gpu": tps, "tps_p25": tps, "tps_p75": tps, "mfu": 0.5, "max_mem_gib": 40.0, "world_size": 1,
                          "instances": 1, "seq_len": 2048, "micro_batch_size": 16, "grad_accum": 4,
                          "tokens": 1e6, "source": "x.jsonl", "smoothed_loss": 3.0, "final_loss": 3.0,
                          "val_loss": 3.1, "nonfinite_losses": 0, "loss_comparable": False, "seed": 1234,
                          "parallel": None}
                         for i, (task, prec, tps) in enumerate(rows)])


def test_task_labels_and_what_counts_as_a_fine_tune():
    assert task_label("pretrain", 0) == "pretrain" and task_label("sft", 0) == "sft"
    assert task_label("sft", 16) == "sft-lora"
    assert [is_fine_tune(t) for t in ("sft", "sft-lora", "pretrain", None, np.nan, "")] == [True, True] + [False] * 4
    assert variant_label({"precision": "fp8", "backend": "te", "recipe": "delayed", "task": "sft-lora"}).endswith(
        "sft-lora")


def test_the_headline_and_the_plan_rates_leave_fine_tunes_out():
    s = _summary()
    best = analysis.best_runs(s)
    assert set(best["run_id"]) <= {"r0", "r1", "r2"}  # the fine-tunes are faster here, and still not the headline's
    assert best.loc[best["role"] == "best FP8", "run_id"].item() == "r1"
    assert set(measurable_runs(s)["run_id"]) == {"r0", "r1", "r2"}


def test_fp8_pairs_with_bf16_of_its_own_task():
    c = analysis.compare_precisions(_summary())
    pairs = dict(zip(c["fp8_run"], c["baseline_run"]))
    assert pairs["r4"] == "r3" and pairs["r6"] == "r5"  # full SFT with full SFT, LoRA with LoRA
    assert pairs["r1"] == "r0"
    assert dict(zip(c["fp8_run"], c["task"]))["r6"] == "sft-lora"  # the pair's task, for whoever draws it


def test_the_speed_figures_draw_pretraining_only():
    from fp8lab.views import plots

    s = _summary()
    s.loc[s["task"] == "sft-lora", "model"] = "llama-3.1-8b"  # a model only a fine-tune measured
    fig = plots.speedup_figure(analysis.compare_precisions(s))
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert labels and not any("llama-3.1-8b" in t for t in labels)
    bars = [p.get_height() for p in fig.axes[0].patches]
    assert bars == [pytest.approx(90_000 / 70_000)]  # pretraining's best pair; not full SFT's 95/74 beside it
    for fig in (plots.throughput_figure(s), plots.mfu_figure(s)):  # the runs' figures: pretraining's runs only
        titles = [ax.get_title() for ax in fig.axes]
        assert not any("llama-3.1-8b" in t for t in titles) and any("llama-3.2-1b" in t for t in titles)


def _files(tmp_path, runs: dict[str, dict]) -> list:
    from fp8lab.analysis import write_result_file

    paths = []
    for run_id, extra in runs.items():
        run = {"run_id": run_id, "study": "s", "model": "llama-tiny", "gpu_name": H100, "world_size": 1,
               "backend": "te", "micro_batch_size": 2, "grad_accum": 1, "seq_len": 128, "command": "x",
               "date": "2026-12-06T00:00:00Z", **extra}
        steps = [{"step": i, "tokens": 256 * i, "loss": 3.0, "tokens_per_sec_per_gpu": 1000.0} for i in range(1, 9)]
        paths.append(write_result_file(tmp_path / f"{run_id}.jsonl", run, steps,
                                       {"tokens_per_sec_per_gpu": 1000.0, "tokens": 2048, "loss": 3.0}))
    return paths


def test_a_trainer_folders_lora_option_and_a_record_without_a_task_are_read_as_their_tasks(tmp_path):
    """A trainer folder's config says task sft and lora_rank apart; an older record says no task (pretraining), and
    pairs with a new record that says pretrain."""
    paths = _files(tmp_path, {"old-bf16": {"precision": "bf16"}, "new-fp8": {"precision": "fp8", "task": "pretrain"},
                              "lora-bf16": {"precision": "bf16", "task": "sft", "lora_rank": 8},
                              "lora-fp8": {"precision": "fp8", "task": "sft-lora"},
                              "full-bf16": {"precision": "bf16", "task": "sft", "lora_rank": 0}})
    s = analysis.summarize_runs(analysis.load_runs(paths))
    assert dict(zip(s["run_id"], s["task"])) == {"old-bf16": "pretrain", "new-fp8": "pretrain", "lora-bf16": "sft-lora",
                                                 "lora-fp8": "sft-lora", "full-bf16": "sft"}
    pairs = dict(zip(*[analysis.compare_precisions(s)[k] for k in ("fp8_run", "baseline_run")]))
    assert pairs == {"new-fp8": "old-bf16", "lora-fp8": "lora-bf16"}


def test_the_training_loss_figure_draws_pretraining_only(tmp_path):
    from fp8lab.views import plots

    paths = _files(tmp_path, {"pre-bf16": {"precision": "bf16", "loss_comparable": True},
                              "pre-fp8": {"precision": "fp8", "loss_comparable": True},
                              "ft-bf16": {"precision": "bf16", "task": "sft", "model": "llama-1b", "loss_comparable": True},
                              "ft-fp8": {"precision": "fp8", "task": "sft", "model": "llama-1b", "loss_comparable": True}})
    fig = plots.loss_figure(analysis.load_runs(paths))
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["llama-tiny"]


def test_run_fine_tunes_gives_the_lora_options_to_the_lora_runs_only(tmp_path, monkeypatch):
    """A full fine-tune refuses a LoRA option it would ignore (fp8lab.plan.lora.problem): run_fine_tunes passes
    ``lora_alpha`` and its kind to the LoRA pair alone, and every other option to both (each pair planned for real)."""
    from fp8lab import finetune

    given = {}

    def spy(model, steps, backends, recipe, **kw):
        given[Path(kw["output_dir"]).name] = kw
        return real(model, steps, backends, recipe, **kw)

    real = finetune.run_pair
    monkeypatch.setattr(finetune, "run_pair", spy)
    ft = finetune.run_fine_tunes("llama-tiny", 2, lora_rank=4, lora_alpha=32.0, output_dir=tmp_path, dry_run=True,
                                 seq_len=64)
    assert set(given) == {"full", "lora"} and all(len(p.table) == 2 for p in ft.pairs.values())  # BF16 and FP8
    assert "lora_alpha" not in given["full"] and "lora_rank" not in given["full"]
    assert given["lora"]["lora_alpha"] == 32.0 and given["lora"]["lora_rank"] == 4
    assert given["full"]["seq_len"] == given["lora"]["seq_len"] == 64
