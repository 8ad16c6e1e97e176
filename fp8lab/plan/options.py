"""One option schema: each trainer option is declared once, on its ``TrainConfig`` field.

A field made with :func:`option` carries its help, its choices and its check (a
:class:`fp8lab.core.validate.Check`) in the field's metadata; its converter from text follows from the
field's type annotation (``bool``, ``int | None``, ``AutoInt`` ...). From that one declaration:

* the CLI parser (:func:`add_arguments`: one ``--kebab-case`` flag per field, plus the underscore
  spelling, with ``help (default: ...)``, under its section's heading: :data:`SECTIONS`); the options of the
  ``study`` section (study and test switches) only where asked for (``fp8lab train --study``);
* the conversion of command-line words and SageMaker hyperparameters (:func:`from_text`, and
  :func:`to_text` for the way back: what ``fp8lab.launch`` passes and ``SM_HPS`` holds);
* the per-field validation (:func:`check_fields`); checks across fields stay in ``fp8lab.train.entry``.

The vocabularies (precisions, parallel modes, dtypes, backend names from the ``fp8lab.fp8.backends``
registry, recipe kinds from ``fp8lab.fp8.recipe.KINDS``) are declared here once; the trainer, the
launcher and the notebooks import them.

Adding an option: one field in ``TrainConfig`` with ``option(default, "help", section=..., choices=... or
check=...)``; nothing else is needed for the CLI, SageMaker or ``JobSpec(options={...})``. Its help says what it
does; why the plan chose a value is the run's first lines (``RunPlan.reasons``). ``tests/unit/test_cli_options.py``
lists the user's options by section, so a new one is a decision.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
from typing import Any, Callable, Union

from fp8lab.fp8.backends import (  # noqa: F401 (the vocabulary, re-exported)
    FP8_ALL_GATHER_BACKENDS, FP8_LM_HEAD_BACKENDS, backend_names,
)
from fp8lab.plan.fp8attn import CHOICES as FP8_ATTENTION_CHOICES
from fp8lab.fp8.stats import SOURCES as FP8_STATS_SOURCE_CHOICES
from fp8lab.plan.fp8_weights import CHOICES as FP8_WEIGHTS_CHOICES
from fp8lab.plan.fused_loss import CHOICES as FUSED_LOSS_CHOICES
from fp8lab.plan.graphs import CHOICES as GRAPH_CHOICES
from fp8lab.plan.memory_modes import CHOICES as MEMORY_CHOICES
from fp8lab.fp8.recipe import KINDS
from fp8lab.records.data_format import TASKS  # noqa: F401 (pretrain | sft: what a prepared folder's tokens are for)
from fp8lab.core.validate import AUTO, Check, one_of

# ------------------------------------------------------------------------------------ vocabularies
PRECISIONS = ("bf16", "fp8")
PARALLEL = ("ddp", "fsdp")  # under torchrun: DDP, or FSDP2 fully_shard per decoder block
COMPUTE_DTYPES = (AUTO, "bf16", "fp32")
PARAM_DTYPES = (AUTO, "fp32", "bf16")
DEVICES = (AUTO, "cpu", "cuda")
PROGRESS = (AUTO, "on", "off")
TRACKERS = ("none", "tensorboard", "mlflow")  # where metrics.jsonl is mirrored (fp8lab.train.trackers)
CUDA_GRAPHS = GRAPH_CHOICES  # auto | on | off, declared where they are decided
FP8_ATTENTION = FP8_ATTENTION_CHOICES  # auto | on | off, declared where they are decided (fp8lab.plan.fp8attn)
EMULATED = "emulated"  # fp8lab's pure-PyTorch backend: any device, never for speed claims
# discovered (every module of fp8lab.fp8.backends): the tensor-core ones first, the emulator last
HARDWARE_BACKENDS = tuple(b for b in backend_names() if b != EMULATED)  # FP8 on tensor cores (SageMaker jobs)
FP8_BACKENDS = (*HARDWARE_BACKENDS, EMULATED)
BACKENDS = (AUTO, "none", *FP8_BACKENDS)  # auto: picked for the machine; none: the plain HF model
RECIPE_KINDS = KINDS
# FSDP2 all-gathers the block linears' weights in FP8 (fp8lab.plan.runplan.fp8_all_gather_decision)
FP8_ALL_GATHER = (AUTO, "on", "off")
# auto | te-debug | fp8lab, declared where they are read (fp8lab.fp8.stats)
FP8_STATS_SOURCES = FP8_STATS_SOURCE_CHOICES
RECIPES = (AUTO, *KINDS)  # auto = the backend's default
FUSED_LOSS = FUSED_LOSS_CHOICES  # auto | on | off, declared where they are decided (fp8lab.plan.fused_loss)
# auto | plain | offload | fp32-moments | bf16-moments | fp8-exp-avg, declared where they are decided
# (fp8lab.plan.memory_modes)
MEMORY = MEMORY_CHOICES
FP8_WEIGHTS = FP8_WEIGHTS_CHOICES  # auto | cast | primary, declared where they are decided (fp8lab.plan.fp8_weights)

# types of fields whose text form is special (their annotations name them)
AutoInt = Union[int, str]  # an integer, or "auto" (the layout resolver picks it)
AutoBool = Union[bool, str]  # True | False, or "auto"
Steps = tuple  # step numbers, written 5,6 on the command line


# the --help sections, in order: section -> heading. "study" holds the study and test switches, off the user's CLI:
# `fp8lab train --study` accepts and lists them (tests and benchmarks pass it); the Python API takes them always
SECTIONS = {
    "model": "model", "data": "data and steps", "optimiser": "optimiser", "layout": "layout (batch, memory, processes)",
    "fp8": "FP8", "kernels": "kernels", "lora": "LoRA adapters (fine-tuning)",
    "outputs": "outputs, checkpoints and logs",
    "study": "study and test switches (fp8lab train --study)",
}
STUDY = "study"


def option(default: Any = dataclasses.MISSING, help: str = "", *, section: str | None = None, choices: tuple = (),
           check: Check | None = None, factory: Callable[[], Any] | None = None, metavar: str | None = None,
           flags: tuple = ()) -> Any:
    """A dataclass field declaring one option: default, help (what it does), its ``--help`` section (one of
    :data:`SECTIONS`), choices (or another check); ``flags``: more CLI spellings, listed first."""
    meta = {"help": help, "section": section, "choices": tuple(choices),
            "check": check or (one_of(choices) if choices else None), "metavar": metavar, "flags": tuple(flags)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag(name: str) -> str:
    """The CLI spelling of a field: ``seq_len`` -> ``--seq-len``."""
    return "--" + name.replace("_", "-")


# ------------------------------------------------------------------------------------ text -> value

_BOOL = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}
_NONE = ("none", "null")


def _to_bool(name: str, s: str) -> bool:
    v = _BOOL.get(str(s).strip().lower())
    if v is None:
        raise ValueError(f"{flag(name)}={s!r} is invalid; allowed: True | False")
    return v


def _to_int(name: str, s: str) -> int:
    try:
        return int(str(s).strip())  # digits exactly (a seed of 20 digits stays itself, for the check to show)
    except (TypeError, ValueError):
        pass
    try:
        f = float(s)
        if not f.is_integer():
            raise ValueError
        return int(f)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{flag(name)}={s!r} is invalid; allowed: an integer") from None


def _to_float(name: str, s: str) -> float:
    try:
        return float(s)
    except (TypeError, ValueError):
        raise ValueError(f"{flag(name)}={s!r} is invalid; allowed: a number") from None


def _none_or(conv: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    def f(name: str, s: str) -> Any:
        return None if str(s).strip().lower() in (*_NONE, "") else conv(name, s)
    return f


def _auto_or(conv: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    def f(name: str, s: str) -> Any:
        if str(s).strip().lower() == AUTO:
            return AUTO
        try:
            return conv(name, s)
        except ValueError as exc:
            raise ValueError(f"{exc}, or auto (chosen for this machine)") from None
    return f


def _to_path(name: str, s: str) -> str | None:
    return None if str(s).strip().lower() in _NONE else str(s)  # "" stays "" (refused), not the default


def _steps(name: str, s: str) -> tuple:
    try:
        return tuple(int(x) for x in str(s).replace(" ", "").split(",") if x)
    except ValueError:
        raise ValueError(f"{flag(name)}={s!r} is invalid; allowed: comma-separated step numbers") from None


def _pairs(name: str, values: list[str]) -> dict[str, Any]:
    """``key=value`` items (repeated flags or comma-separated), values parsed as Python literals."""
    out: dict[str, Any] = {}
    for item in values:
        for pair in str(item).split(","):
            if not pair.strip():
                continue
            key, eq, value = pair.partition("=")
            if not eq or not key.strip():
                raise ValueError(f"--model-override {pair!r} is invalid; allowed: key=value, e.g. num_layers=2")
            try:
                out[key.strip()] = ast.literal_eval(value.strip())
            except (ValueError, SyntaxError):
                out[key.strip()] = value.strip()
    return out


# field annotation (as written) -> converter from text
CONVERTERS: dict[str, Callable[[str, Any], Any]] = {
    "bool": _to_bool, "int": _to_int, "float": _to_float, "str": lambda n, s: str(s),
    "int | None": _none_or(_to_int), "str | None": _to_path, "AutoInt": _auto_or(_to_int),
    "AutoBool": _auto_or(_to_bool), "Steps": _steps, "dict": _pairs,
}


def _annotation(f: dataclasses.Field) -> str:
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def from_text(f: dataclasses.Field, raw: Any) -> Any:
    """The value of option ``f`` from its text (a CLI word, a hyperparameter; a list for ``dict`` fields)."""
    return CONVERTERS[_annotation(f)](f.name, raw)


def to_text(v: Any) -> str:
    """An option value as text that :func:`from_text` reads back (hyperparameters, ``--key value`` words)."""
    if isinstance(v, dict):
        return ",".join(f"{k}={val}" for k, val in v.items())
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    return str(v)


def check_schema(cls: type) -> None:
    """Every field of ``cls`` has help and a converter (run on import: a new field cannot be half declared)."""
    for f in dataclasses.fields(cls):
        if _annotation(f) not in CONVERTERS:
            raise TypeError(f"{cls.__name__}.{f.name}: no converter for type {_annotation(f)!r} in "
                            "fp8lab.plan.options.CONVERTERS")
        if not f.metadata.get("help"):
            raise TypeError(f"{cls.__name__}.{f.name}: declare it with fp8lab.plan.options.option(default, help, ...)")


def check_fields(obj: Any, bad: Callable[[str, str], Exception]) -> None:
    """Each field's own check (choices, ranges); ``bad(name, allowed)`` makes the error."""
    for f in dataclasses.fields(obj):
        check = f.metadata.get("check")
        if check is not None and not check(getattr(obj, f.name)):
            raise bad(f.name, check.allowed)


# ------------------------------------------------------------------------------------ the parser

def _default_text(f: dataclasses.Field, defaults: dict[str, Any]) -> str:
    v = defaults[f.name] if f.name in defaults else (
        f.default if f.default is not dataclasses.MISSING else f.default_factory())
    return f'"{v}"' if isinstance(v, str) else repr(v)


def section_of(f: dataclasses.Field) -> str:
    """The ``--help`` section of option ``f`` ("other" where its field names none)."""
    return f.metadata.get("section") or "other"


def user_options(cls: type) -> list[dataclasses.Field]:
    """The options of ``cls`` on the user's CLI: all but the study section's."""
    return [f for f in dataclasses.fields(cls) if section_of(f) != STUDY]


def add_arguments(p: argparse.ArgumentParser, cls: type, only: tuple[str, ...] | None = None,
                  defaults: dict[str, Any] | None = None, study: bool = False) -> None:
    """One flag per field of ``cls`` (and its underscore spelling), under its section's heading; values stay text
    (``default=None``: not given), for :func:`from_text`. Booleans also work alone (``--compile``). ``only``: these
    fields, under ``p`` itself (``fp8lab launch`` takes a job's trainer options this way); ``defaults``: defaults
    shown in the help where the caller's differ from the field's (a job's ``--parallel``); ``study``: the study
    section's options too."""
    groups: dict[str, Any] = {}
    fields = sorted(dataclasses.fields(cls), key=lambda f: list(SECTIONS).index(section_of(f))
                    if section_of(f) in SECTIONS else len(SECTIONS))
    for f in fields:
        if only is not None and f.name not in only:
            continue
        if only is None and section_of(f) == STUDY and not study:
            continue
        if only is None:
            section = section_of(f)
            if section not in groups:
                groups[section] = p.add_argument_group(SECTIONS.get(section, "other options"))
            target = groups[section]
        else:
            target = p
        names = [*f.metadata.get("flags", ()), flag(f.name)] + ([f"--{f.name}"] if "_" in f.name else [])
        choices = " | ".join(map(str, f.metadata.get("choices") or ()))
        default = f"{choices + '; ' if choices else ''}default: {_default_text(f, defaults or {})}"
        kw: dict[str, Any] = {"dest": f.name, "default": None, "metavar": f.metadata.get("metavar") or f.name.upper(),
                              "help": f"{f.metadata['help']} ({default})".replace("%", "%%")}
        kind = _annotation(f)
        if kind in ("bool", "AutoBool"):
            kw.update(nargs="?", const="True")  # `--compile` alone, or `--compile False` (SageMaker)
        elif kind == "dict":
            kw.update(action="append")  # repeat it, or comma-separate
        target.add_argument(*names, **kw)
