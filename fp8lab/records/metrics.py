"""What a training run reports: per-step records, the log line SageMaker parses, MFU, provenance.

``metrics.jsonl`` holds one JSON object per optimizer step (keys in ``STEP_KEYS``, plus
``val_loss`` on validation steps and ``skipped: true`` on steps the overflow guard dropped). The
same numbers go to stdout as one line a SageMaker metric-definition regex can read::

    fp8lab-metrics step=12 loss=3.456789 tokens_per_sec_per_gpu=12345.6 mfu=0.4123 step_time_s=0.5123 lr=0.0003 \
grad_norm=1.234
    fp8lab-metrics step=12 val_loss=3.4567

MFU is model FLOPs (``fp8lab.model.models.model_flops_per_token``) per second per GPU over the GPU's
**dense BF16** peak, for BF16 and FP8 runs alike, so the two are comparable (an FP8 run may then
exceed what "100%" would mean for BF16 alone). On CPUs there is no meaningful peak: ``mfu`` is
null in the file and 0 in the log line.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any

from fp8lab.core.hardware import PEAK_BF16_DENSE, peak_bf16_flops  # noqa: F401 (re-exported: their old home)
from fp8lab.core.paths import read_result_text
from fp8lab.core.pins import installed, installed_te
from fp8lab.records import ownership

STEP_KEYS = (
    "step", "tokens", "loss", "lr", "grad_norm", "step_time_s", "tokens_per_sec", "tokens_per_sec_per_gpu",
    "mfu", "max_mem_gib", "precision", "backend", "recipe", "model", "world_size", "gpu_name",
)
LINE_PREFIX = "fp8lab-metrics"

def mfu(flops_per_token: float, tokens_per_sec_per_gpu: float, peak: float | None) -> float | None:
    if not peak or not math.isfinite(tokens_per_sec_per_gpu):
        return None
    return flops_per_token * tokens_per_sec_per_gpu / peak


def plain(x: float | None, digits: int) -> str:
    """A number without exponent or thousands separators (what a metric regex can read); nan if missing."""
    if x is None or not math.isfinite(x):
        return "nan"
    s = f"{x:.{digits}f}"
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return s or "0"


def step_line(rec: dict[str, Any]) -> str:
    """The stdout metric line of one step (same numbers as its metrics.jsonl record)."""
    return (
        f"{LINE_PREFIX} step={rec['step']} loss={_fixed(rec['loss'], 6)}"
        f" tokens_per_sec_per_gpu={_fixed(rec['tokens_per_sec_per_gpu'], 1)}"
        f" mfu={_fixed(rec['mfu'] if rec['mfu'] is not None else 0.0, 4)}"
        f" step_time_s={_fixed(rec['step_time_s'], 4)} lr={plain(rec['lr'], 10)} "
        f"grad_norm={_fixed(rec['grad_norm'], 4)}"
    )


def val_line(step: int, val_loss: float) -> str:
    return f"{LINE_PREFIX} step={step} val_loss={_fixed(val_loss, 4)}"


def _fixed(x: float | None, digits: int) -> str:
    if x is None or not math.isfinite(x):
        return "nan"
    return f"{x:.{digits}f}"


class MetricsLog:
    """Append-only ``metrics.jsonl`` that a resumed run continues without losing or repeating a step.

    Opening with ``resume_step=S`` keeps the records of steps ``<= S`` (those the checkpoint
    covers) and drops later ones, and any torn last line a kill left behind (counted in ``torn``,
    for the run's log to say so); ``resume_step=None`` starts a fresh file.
    """

    def __init__(self, path: str | Path, resume_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[str] = []
        self.torn = 0
        if resume_step is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    self.torn += bool(line.strip())  # a line torn by kill -9
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("step"), int) and rec["step"] <= resume_step:
                    kept.append(line)
        head = "".join(k + "\n" for k in kept).encode("utf-8")
        ownership.write_file(self.path, head)  # a fresh file, renamed in: never written through a link
        self.kept = len(kept)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        self._fh = os.fdopen(fd, "a", encoding="utf-8")
        # the run folder's marker (fp8lab.records.ownership) names the file with the digest of its first bytes
        self._marked = ownership.marker_kind(self.path.parent) is not None
        self._record(head)

    def _record(self, head: bytes) -> None:
        if self._marked:
            ownership.record(self.path.parent, self.path.name, digest=(len(head), hashlib.sha256(head).hexdigest()))
        self._recorded = len(head)

    def write(self, rec: dict[str, Any]) -> None:
        line = json.dumps(rec, allow_nan=False) + "\n"
        try:
            self._fh.write(line)
            self._fh.flush()
        except OSError as exc:  # a full disk, a file-size limit: the error names the file
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None
        if self._recorded == 0:  # its first record: the marker's digest covers it from now on
            self._record(line.encode("utf-8"))

    def close(self) -> None:
        try:
            self._fh.close()
        except OSError as exc:  # the last line did not fit either: named as the write's error is
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None


def read_metrics(path: str | Path, record: str | None = None) -> list[dict[str, Any]]:
    """The step records of a metrics.jsonl file (complete lines only); ``record="fp8_stats"``: those
    records instead (lines with a ``"record"`` key are other records: fp8lab.fp8.stats)."""
    return metrics_in(read_result_text(path), record)


def metrics_in(text: str, record: str | None = None) -> list[dict[str, Any]]:
    """:func:`read_metrics` of a file's text already read."""
    out = []
    # a line holding a record of a plain name has the name in it, or a \u escape (JSON writes it no other way):
    # other lines (every step of a run, looking for its fp8_stats) need no parsing
    plain = record is not None and record.isascii() and record.replace("_", "a").isalnum()
    for line in text.splitlines():
        if plain and record not in line and "\\u" not in line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and rec.get("record") == record:
            out.append(rec)
    return out


def provenance(gpu_name: str, world_size: int, argv: list[str] | None) -> dict[str, Any]:
    """What ran where: versions, device, world size and the command (no host names or paths)."""
    import torch

    return {
        "gpu_name": gpu_name,
        "world_size": world_size,
        "peak_bf16_flops": peak_bf16_flops(gpu_name),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": installed("transformers"),
        "transformer_engine": installed_te(),
        "nvdlfw_inspect": installed("nvdlfw-inspect"),
        "torchao": installed("torchao"),
        "fp8lab": installed("fp8lab"),
        "command": "fp8lab train " + " ".join(argv) if argv is not None else " ".join(sys.argv),
    }
