"""Fake runs for the analysis, plot, report and notebook tests: trainer output folders and result files
written the way fp8lab writes them, with throughput and loss curves chosen by the test."""
from __future__ import annotations

import json
from pathlib import Path

from fp8lab import analysis

GPU = "NVIDIA H200"


def step_records(n: int, tps: float, precision: str, *, model: str = "llama-1b", loss0: float = 10.0,
                 loss_scale: float = 1.0, tokens_per_step: int = 4096, world_size: int = 1, warmup_tps: float | None = None,
                 warmup: int = 0, val_every: int = 0, backend: str = "te", recipe: str | None = "delayed") -> list[dict]:
    """metrics.jsonl-style records (the trainer's keys). Loss follows loss0/step**0.1 times loss_scale."""
    recs = []
    for s in range(1, n + 1):
        rate = warmup_tps if (warmup_tps is not None and s <= warmup) else tps
        r = {"step": s, "tokens": s * tokens_per_step, "loss": loss_scale * loss0 / s ** 0.1, "lr": 3e-4,
             "grad_norm": 1.0, "step_time_s": tokens_per_step / (rate * world_size),
             "tokens_per_sec": rate * world_size, "tokens_per_sec_per_gpu": rate, "mfu": rate / 1e4,
             "max_mem_gib": 10.0 + s / 100, "precision": precision, "backend": backend,
             "recipe": recipe if precision == "fp8" else None, "model": model, "world_size": world_size,
             "gpu_name": GPU}
        if val_every and s % val_every == 0:
            r["val_loss"] = r["loss"] + 0.1
        recs.append(r)
    return recs


def make_trainer_run(root: Path, name: str, precision: str, tps: float, n: int = 30, **kw) -> Path:
    """A trainer output folder: metrics.jsonl + config.json (config nested with provenance)."""
    d = Path(root) / name
    d.mkdir(parents=True, exist_ok=True)
    recs = step_records(n, tps, precision, **kw)
    cfg = {"config": {"model": recs[0]["model"], "precision": precision, "backend": recs[0]["backend"],
                      "recipe": recs[0]["recipe"], "micro_batch_size": 4, "grad_accum": 2, "seq_len": 512,
                      "max_steps": n},
           "provenance": {"gpu_name": GPU, "world_size": recs[0]["world_size"], "torch": "2.x",
                          "command": "fp8lab train ..."}}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return d


def run_meta(model: str, precision: str, **kw) -> dict:
    meta = {"model": model, "precision": precision, "backend": "te", "recipe": "delayed" if precision == "fp8" else None,
            "fuse": True, "gpu_name": GPU, "world_size": 1, "instances": 1, "micro_batch_size": 4, "grad_accum": 1,
            "seq_len": 1024, "versions": {"torch": "2.x"}, "command": "python benchmarks/x.py", "date": "2026-11-29T20:00:00Z"}
    meta.update(kw)
    return meta


def make_pair(root: Path, bf16_tps: float = 1000.0, fp8_tps: float = 1250.0, **kw) -> Path:
    make_trainer_run(root, "bf16", "bf16", bf16_tps, **kw)
    make_trainer_run(root, "fp8", "fp8", fp8_tps, loss_scale=1.03, **kw)
    return Path(root)


def bench(root: Path, run_id: str, tps: float, world_size: int, date: str, **kw) -> None:
    analysis.write_result_file(root / f"{run_id}.jsonl", run_meta("llama-1b", "fp8", run_id=run_id, variant=run_id,
                                                                   world_size=world_size, date=date, **kw),
                               step_records(12, tps, "fp8", world_size=world_size))
