"""The trainer's metric line as a SageMaker job reports it: the metric definitions SageMaker reads
from the job's log stream, and the parser ``collect`` uses on CloudWatch log lines."""
from __future__ import annotations

import re

from fp8lab.records.metrics import LINE_PREFIX  # the trainer writes the line

_NUM = r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
# SageMaker reads these from the job's log stream. The leading space keeps " loss=" from
# matching "val_loss=". Names become CloudWatch metric names of the job.
METRIC_DEFINITIONS: dict[str, str] = {
    "train:loss": rf"{LINE_PREFIX} step=\d+ loss={_NUM}",
    "train:tokens_per_sec_per_gpu": rf"{LINE_PREFIX} step=\d+ .* tokens_per_sec_per_gpu={_NUM}",
    "train:mfu": rf"{LINE_PREFIX} step=\d+ .* mfu={_NUM}",
    "train:step_time_s": rf"{LINE_PREFIX} step=\d+ .* step_time_s={_NUM}",
    "train:lr": rf"{LINE_PREFIX} step=\d+ .* lr={_NUM}",
    "train:grad_norm": rf"{LINE_PREFIX} step=\d+ .* grad_norm={_NUM}",
    "validation:loss": rf"{LINE_PREFIX} step=\d+ val_loss={_NUM}",
}
_METRIC_LINE = re.compile(rf"{LINE_PREFIX} ((?:\w+=\S+ ?)+)")


def parse_metric_line(line: str) -> dict[str, float | int] | None:
    """The key=value pairs of one trainer metric line (``step`` as int), or None for other lines."""
    m = _METRIC_LINE.search(line)
    if not m:
        return None
    out: dict[str, float | int] = {}
    for pair in m.group(1).split():
        key, _, value = pair.partition("=")
        try:
            out[key] = int(value) if key == "step" else float(value)
        except ValueError:
            continue
    return out if "step" in out else None
