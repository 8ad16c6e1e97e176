"""Notebook parameters: each value has its declared default's type, and the values a notebook passes
to the trainer pass the trainer's own checks (``fp8lab.notebooks`` calls these before running one)."""
from __future__ import annotations

import ast
import math
import re
from typing import Any, Callable

from fp8lab.core.validate import is_int, is_num
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.options import FP8_BACKENDS


def _listed(v: Any) -> Any:
    """A string holding a list (plain papermill's ``-p name "[1, 2]"``) as that list; else ``v``."""
    if isinstance(v, str):
        try:
            return ast.literal_eval(v.strip())
        except (ValueError, SyntaxError):
            return v
    return v


def _kind(default: Any) -> tuple[str, Callable[[Any], bool]] | None:
    if isinstance(default, bool):
        return "True or False", lambda v: isinstance(v, bool)
    if isinstance(default, int):
        return "an integer", lambda v: is_int(v) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    if isinstance(default, float):
        return "a number", is_num
    # a string default is left to the notebook's own checks: it may stand for "auto" or a number
    if isinstance(default, list):
        return "a list, e.g. " + repr(default), lambda v: isinstance(_listed(v), (list, tuple))
    return None


def check_notebook_values(name: str, declared: dict[str, Any], comments: dict[str, str],
                          params: dict[str, Any]) -> None:
    """Each value has its default's type (the parameters cell's comment says what is allowed)."""
    for key, value in params.items():
        kind = _kind(declared.get(key))
        if kind is not None and not kind[1](value):
            hint = f" ({comments[key]})" if comments.get(key) else ""
            raise ValueError(f"notebook {name}: parameter {key}={value!r} is invalid; allowed: {kind[0]}{hint}, "
                             f"default {declared[key]!r}")


def _train_pair_check(values: dict[str, Any]) -> None:
    """A notebook running ``trainpair.run_pair``: every run it would start passes the trainer's own checks
    (fp8lab.train.entry.TrainConfig)."""
    import dataclasses

    backends = _listed(values.get("backends"))
    choices = ("auto", *FP8_BACKENDS)
    if isinstance(backends, str) or not isinstance(backends, (list, tuple)) or not backends or any(
            b not in choices for b in backends):
        raise ValueError(f"backends={backends!r} is invalid; allowed: a non-empty list of "
                         f"{', '.join(repr(b) for b in choices)}")
    options = {f.name for f in dataclasses.fields(TrainConfig)} - {"precision", "backend", "recipe"}
    base = {k: v for k, v in values.items() if k in options}  # the parameters named like trainer options
    if base.get("lr") == "auto":  # trainpair picks it by model size
        del base["lr"]
    for backend in backends:
        TrainConfig(**base, precision="fp8", backend=backend, recipe=values.get("recipe", "auto"))


def _fine_tune_check(values: dict[str, Any]) -> None:
    """A notebook running ``finetune.run_fine_tunes``: its full and its LoRA pairs (``--task sft``; LoRA at
    ``lora_lr``) pass the trainer's own checks; ``model=None`` is the tiny folder the notebook makes, and ``tokens``
    is the P5 jobs' length (the runs here take ``steps``)."""
    values = {k: v for k, v in values.items() if not (k in ("model", "data") and v is None) and k != "tokens"}
    lora_lr = values.pop("lora_lr", "auto")
    rank = values.pop("lora_rank", None)
    if not is_int(rank) or rank < 1:  # the trainer's 0 (LoRA off) would make the LoRA pair a second full one
        raise ValueError(f"lora_rank={rank!r} is invalid; allowed: a positive integer, e.g. 8")
    _train_pair_check({**values, "task": "sft"})
    _train_pair_check({**values, "task": "sft", "lora_rank": rank, "lr": lora_lr})


# what a notebook calls -> the check its parameters get (a notebook is known by what it runs, not its file name)
NOTEBOOK_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "trainpair.run_pair(": _train_pair_check,  # its parameters are TrainConfig options
    "finetune.run_fine_tunes(": _fine_tune_check,  # and so are the fine-tunes'
}


def check_notebook_semantics(name: str, declared: dict[str, Any], params: dict[str, Any], code: str) -> None:
    """The checks of what the notebook runs (its ``code``: every code cell) on its full parameter set
    (defaults + given), named as the notebook names them."""
    checks = [check for call, check in NOTEBOOK_CHECKS.items() if call in code]
    try:
        for check in checks:
            check({**declared, **params})
    except ValueError as exc:
        # the trainer says --seq-len; the notebook parameter is seq_len
        msg = re.sub(r"--([a-z0-9-]+)", lambda m: m.group(1).replace("-", "_"), str(exc))
        raise ValueError(f"notebook {name}: parameter {msg}") from None


def parameter_comments(source: str) -> dict[str, str]:
    """``name = value  # comment`` lines of a parameters cell: name -> comment."""
    out = {}
    for line in source.splitlines():
        m = re.match(r"^(\w+)\s*(?::[^=]+)?=.*?#\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out
