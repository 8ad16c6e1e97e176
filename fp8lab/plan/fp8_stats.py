"""FP8 health's rule: when the statistics are sampled, and who reads the casts (``--fp8-stats-every``,
``--fp8-stats-source``), decided once per run by :func:`fp8_stats_decision` with the reason.

The interval ``--fp8-stats-every auto`` picks (:func:`default_every`, from the measured per-sample cost) and the
committed GPU check of Transformer Engine's debug API (the evidence's ``te_debug``) that ``--fp8-stats-source auto``
needs before it picks it live here. The vocabulary (``SOURCES``, ``TE_DEBUG``, ``OWN``) and the mechanism are
fp8lab.fp8.stats (and fp8lab.fp8.te_debug); the reader is fp8lab.analysis.fp8_stats.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from fp8lab.core.hardware import Machine
from fp8lab.core.validate import AUTO
from fp8lab.fp8 import te_debug
from fp8lab.fp8.stats import OWN, TE_DEBUG
from fp8lab.plan.evidence import TE_DEBUG_STUDY, Evidence

if TYPE_CHECKING:
    from fp8lab.plan.config import TrainConfig

COST_GOAL_PCT = 2.0  # what the statistics may cost at the default interval, in % of the mean step time


# auto picks TE's debug API only once its GPU check is committed and passed (the evidence's ``te_debug``,
# benchmarks/fp8stats_overhead.py --check: every sampled step recorded, and its cost at the default interval
# <= COST_GOAL_PCT), on the Transformer Engine release it ran on; otherwise --fp8-stats-source te-debug runs it on
# request.
# --fp8-stats-every auto, per backend. On TE a sampled step's statistics cost about one micro-batch's forward and
# backward (a few elementwise passes per GEMM operand), whatever the accumulation; so auto samples every 25 steps at
# 4+ micro-batches a step and proportionally less often below (100 at one micro-batch), within COST_GOAL_PCT (the
# measured cost: benchmarks/studies/loss_parity_20m.md, data/results/fp8stats-overhead/). The emulated backend (CPU
# teaching runs of a few dozen steps, never timed) keeps 10, enough for a heatmap.
DEFAULT_EVERY = {"te": 25, "emulated": 10}
TE_MEASURED_ACCUM = 4  # the accumulation DEFAULT_EVERY["te"] was measured at


def default_every(backend: str, grad_accum: int) -> int:
    """``--fp8-stats-every auto``: the sampling interval for ``backend`` at ``grad_accum`` micro-batches a step (the
    same for both TE sources: TE's debug API's own cost at it is what its GPU check measures)."""
    if backend != "te":
        return DEFAULT_EVERY[backend]
    return DEFAULT_EVERY["te"] * -(-TE_MEASURED_ACCUM // max(int(grad_accum), 1))


def fp8_stats_decision(c: "TrainConfig", backend: str | None, graphs_active: bool, grad_accum: int,
                       machine: Machine, evidence: Evidence) -> tuple[int, str | None, str]:
    """(every how many steps the FP8 health statistics are sampled, 0 = off; who reads them, None when off; why),
    decided once here."""
    source, why_source = fp8_stats_source(c, backend, machine, evidence)
    if not c.fp8_stats_every:
        return 0, None, "--fp8-stats-every 0: off"
    if c.precision != "fp8" or backend not in DEFAULT_EVERY:
        return 0, None, ("off: no FP8 casts to watch (a BF16 run, or a backend without statistics: te and emulated "
                         "have them)")
    if graphs_active:  # replayed graphs run no Python: the hooks that read the casts would never fire
        return 0, None, ("off under CUDA graphs (a replayed graph runs none of the statistics' hooks); "
                         "--cuda-graphs off to see them")
    if c.compile:  # compiled blocks guard on the hooks' state: each sample would recompile them
        return 0, None, "off under --compile (a sampled step would recompile the blocks); --compile False to see them"
    auto = c.fp8_stats_every == AUTO
    every = default_every(backend, grad_accum) if auto else c.fp8_stats_every
    how = (f"auto: {backend} at {grad_accum} micro-batch(es) a step" if auto else "--fp8-stats-every")
    return every, source, f"every {every} steps ({how}); {why_source}"


def fp8_stats_source(c: "TrainConfig", backend: str | None, machine: Machine,
                     evidence: Evidence) -> tuple[str | None, str]:
    """--fp8-stats-source: who reads the FP8 casts (fp8lab.fp8.stats.SOURCES), and why; a request that cannot be
    met is refused here, naming the option and what is allowed. ``machine``: where TE's debug API would run (its
    ``te_debug_problem`` and ``te_release``); ``evidence``: its committed GPU check."""
    asked = c.fp8_stats_source
    if backend != "te":
        if asked == TE_DEBUG and c.precision == "fp8" and c.fp8_stats_every:
            raise ValueError(f"--fp8-stats-source te-debug reads Transformer Engine's debug API: it needs --backend te "
                             f"(this run: {backend or 'none'}); allowed here: auto | {OWN}")
        return (OWN if backend else None), f"{backend or 'no'} backend: fp8lab reads its casts"
    why_not = ("several processes (TE's debug statistics are gathered per process group; fp8lab samples rank 0)"
               if machine.world_size > 1 else machine.te_debug_problem)
    if asked == AUTO and not why_not and not evidence.te_debug:
        check = f"{TE_DEBUG_STUDY}/check.json"
        problems = evidence.te_debug_problems
        why_not = ((f"TE's debug API failed its GPU check ({check}: {'; '.join(problems)})" if problems else
                    f"TE's debug API is installed but its GPU check ({check}: every step recorded, cost <= "
                    f"{COST_GOAL_PCT:g}%) is not committed yet") + "; --fp8-stats-source te-debug runs it")
    elif asked == AUTO and not why_not:
        why_not = te_debug.untested_te(evidence.te_debug_te, machine.te_release)
    if asked == TE_DEBUG:
        if why_not and c.precision == "fp8" and c.fp8_stats_every:
            raise ValueError(f"--fp8-stats-source te-debug cannot run here: {why_not}; allowed here: auto | {OWN}")
        return TE_DEBUG, ("--fp8-stats-source te-debug: TE's debug API (nvdlfw-inspect) reads every GEMM, "
                                   "summed over the step's micro-batches")
    if asked == OWN or why_not:
        return OWN, ((f"auto: fp8lab's hooks ({why_not})" if asked == AUTO else "--fp8-stats-source fp8lab")
                              + ": the first micro-batch of the step; fc2's input and fc1's gradient stay inside TE")
    return TE_DEBUG, ("auto: TE's debug API (nvdlfw-inspect is installed, one process) reads every GEMM, "
                               "summed over the step's micro-batches")
