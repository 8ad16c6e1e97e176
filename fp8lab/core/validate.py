"""Value checks: one clear line per bad value, before anything is computed, prepared or written.

Each check raises ``ValueError`` (or argparse's ``ArgumentTypeError``) whose message names the
option and says what is allowed. The commands turn that into ``<command>: error: <message>`` and a
non-zero exit; the Python API raises it as it is.

* the shared value checks: :func:`is_int`, :func:`is_num`, :func:`is_count` and the :class:`Check`
  objects (``POSITIVE_INT``, ``NONNEG_INT``, ``AUTO_OR_POSITIVE_INT`` ...) that option fields declare
  (fp8lab.plan.options) and ``fp8lab.launch.JobSpec`` uses for its own fields;
* :func:`parse_count` and the argparse types: a positive integer written as ``1000000000``, ``1e9``
  or ``1_000_000_000``; numbers with bounds;
* :func:`check_cli_recipe` and :class:`OneLineParser` for the commands.

The other checks live by what they look at: folders and files fp8lab will write
(``fp8lab.core.probes``), ``--data`` sources and prepared folders (``fp8lab.data.checks``), notebook
parameters (``fp8lab.notebook_checks``), a training run's folders and data (``fp8lab.train.run_paths.check_run``).
"""
from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from typing import Any, Callable


# --------------------------------------------------------------------------------------- numbers

def is_int(v: Any) -> bool:
    """An int that is not a bool (True is an int to Python, never a count to fp8lab)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_count(v: Any, low: int = 1) -> bool:
    """An integer >= ``low`` (1: a positive integer; 0: an integer >= 0)."""
    return is_int(v) and v >= low


@dataclass(frozen=True)
class Check:
    """A value test and what it allows, as error messages say it (``allowed: <allowed>``)."""

    ok: Callable[[Any], bool]
    allowed: str

    def __call__(self, value: Any) -> bool:
        return self.ok(value)


def one_of(choices: tuple, sep: str = " | ") -> Check:
    return Check(lambda v, cs=tuple(choices): isinstance(v, str) and v in cs, sep.join(choices))


def optional(check: Check) -> Check:
    """None, or a value ``check`` accepts (same wording: None means the default)."""
    return Check(lambda v: v is None or check(v), check.allowed)


AUTO = "auto"  # a value the layout resolver (fp8lab.plan.layout) or the trainer picks per machine
BOOL = Check(lambda v: isinstance(v, bool), "True | False")
AUTO_BOOL = Check(lambda v: v == AUTO or isinstance(v, bool), "auto | True | False")
POSITIVE_INT = Check(is_count, "a positive integer")
NONNEG_INT = Check(lambda v: is_count(v, 0), "an integer >= 0")
AUTO_OR_POSITIVE_INT = Check(lambda v: v == AUTO or is_count(v), "auto or a positive integer")
AUTO_OR_NONNEG_INT = Check(lambda v: v == AUTO or is_count(v, 0), "auto or an integer >= 0")
NONNEG_NUM = Check(lambda v: is_num(v) and v >= 0, "a number >= 0")
UNIT_OPEN = Check(lambda v: is_num(v) and 0 < v < 1, "a number in (0, 1)")  # a learning rate
UNIT_HALF_OPEN = Check(lambda v: is_num(v) and 0 <= v < 1, "a number in [0, 1)")  # an AdamW beta
PATH = Check(lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty path")
# Bounds past which a value is a typo (1e30 for 1e3), each checked where the option is parsed: a count of batches
# beyond them never ends (a validation of 1e30 batches), a seed past numpy's 32 bits fails deep inside torch
MAX_BATCHES = 10**5
BATCH_COUNT = Check(lambda v: is_count(v) and v <= MAX_BATCHES, "a positive integer, at most 100,000")
AUTO_OR_BATCH_COUNT = Check(lambda v: v == AUTO or BATCH_COUNT(v), "auto or a positive integer, at most 100,000")
SEED = Check(lambda v: is_count(v, 0) and v < 2**32, "an integer from 0 to 4294967295 (2**32 - 1)")
DECAY = Check(lambda v: is_num(v) and 0 <= v <= 1, "a number in [0, 1]")
PEAK_TFLOPS = Check(lambda v: is_num(v) and 0 <= v <= 1e5, "a number from 0 to 100000 (TFLOP/s of one GPU)")
MEMORY_GIB = Check(lambda v: is_num(v) and 0 <= v <= 4096, "a number from 0 to 4096 (GiB of one GPU)")
# A run's length, bounded: more steps than any LLM run has taken (Llama 3 405B: ~1.2M), more tokens
# than any has seen (~15e12); beyond that it is a typo (1e23 for 1e3) that would run until stopped.
MAX_STEPS = 10**8
MAX_TOKENS = 10**15
STEP_COUNT = Check(lambda v: is_count(v) and v <= MAX_STEPS, "a positive integer, at most 1e8 (100,000,000)")
TOKEN_COUNT = Check(lambda v: is_count(v) and v <= MAX_TOKENS, "a positive integer, at most 1e15")


def step_numbers(allowed: str) -> Check:
    """A tuple of step numbers (>= 1)."""
    return Check(lambda v: isinstance(v, tuple) and all(is_count(s) for s in v), allowed)


_COUNT = re.compile(r"^\d[\d_]*(\.\d*)?([eE]\+?\d+)?$")


def parse_count(text: str) -> int:
    """A positive integer from '1000000000', '1e9', '1_000_000_000' or '2.5e9' (argparse ``type=``)."""
    s = str(text).strip()
    try:
        f = float(s.replace("_", "")) if _COUNT.match(s) else math.nan
    except ValueError:
        f = math.nan
    if not math.isfinite(f) or not f.is_integer() or f < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: a positive whole number, e.g. 1000000000 or "
                                         "1e9")
    return int(f)


def _number(kind: type, low: float, strict: bool) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            v = kind(float(text)) if kind is float else int(text)
        except (TypeError, ValueError):
            v = None
        if v is None or not math.isfinite(v) or v < low or (strict and v == low):
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: {what} {'>' if strict else '>='} {low:g}")
        return v
    return parse


positive_float = _number(float, 0, strict=True)
nonneg_float = _number(float, 0, strict=False)
positive_int = _number(int, 1, strict=False)
nonneg_int = _number(int, 0, strict=False)


def whole_number(value: Any) -> Any:
    """An integral float (1e9) as int, for APIs that take counts; anything else unchanged (checked later)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


# --------------------------------------------------------------------------------------- the command lines

def check_cli_recipe(c, recipe_given: bool) -> None:
    """``fp8lab train --precision bf16 --recipe X``: with ``--backend auto`` a BF16 run has FP8 off (TE's
    layers where TE is usable, else the plain HF model: fp8lab.plan.runplan.select_backend), so the recipe
    would be silently ignored.

    Not refused: an explicit ``--backend`` (a BF16 run then uses the converted layers that recipe
    picks, as fp8lab.launch and fp8lab.trainpair do for their baselines; SageMaker jobs always pass
    their recipe), and the Python API (TrainConfig keeps accepting it, for those callers)."""
    if recipe_given and c.precision == "bf16" and c.backend == "auto" and c.recipe != "auto":
        raise ValueError(f"--recipe={c.recipe!r} has no effect with --precision bf16 and --backend auto (FP8 off: "
                         "TE's layers where TE is usable, else the plain Hugging Face model); allowed: leave --recipe "
                         "out, --precision fp8, or an FP8 --backend (te | torchao | emulated: BF16 on the converted "
                         "layers that recipe picks)")


def check_cli_fp8_stats(c, given: bool) -> None:
    """``fp8lab train --precision bf16 --fp8-stats-every K`` (K > 0): a BF16 run has no FP8 casts, so the
    statistics would be silently off (0, the off switch, and auto are accepted)."""
    if given and c.precision != "fp8" and is_count(c.fp8_stats_every):
        raise ValueError(f"--fp8-stats-every={c.fp8_stats_every} has no effect with --precision {c.precision} (no FP8 "
                         "casts to watch); allowed: leave it out, 0, or --precision fp8")


class OneLineParser(argparse.ArgumentParser):
    """argparse with one line on a bad option, ``<prog>: error: <message> (see --help)``, and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
