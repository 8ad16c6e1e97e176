"""The parts of a training run that own a policy, each used by ``fp8lab.train.trainer.Trainer``:

* :class:`TrainState`: step, tokens seen, non-finite steps and this rank's RNG, the one entry of a
  checkpoint that says where the run stands;
* :class:`Checkpointer`: when to save (periodic, final, on SIGTERM; never after a non-finite
  step), resuming from the newest checkpoint that loads (older ones when it does not), and the
  fingerprint check of fp8lab.train.resume;
* :class:`StepMetrics`: the step timer, the ``metrics.jsonl`` record, the log lines and progress
  bar, and the run's summary;
* :class:`StepProfiler`: torch.profiler over ``--profile-steps``, written as ``profile.json``;
* :class:`NonFiniteGuard`: skips a step whose loss or gradient is not finite, counts them, and
  stops the run after ``--max-bad-steps`` in a row;
* :class:`StopFlag`: SIGTERM (a spot interruption, torchrun or SageMaker stopping the job) or
  SIGINT (Ctrl-C, a notebook's interrupt), handled alike.

None of them imports the trainer.
"""
from __future__ import annotations

import json
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from fp8lab.train import checkpoint as fckpt
from fp8lab.core.progress import watched
from fp8lab.train import distributed as fdist
from fp8lab.train import profiling as fprofiling
from fp8lab.records import metrics as fmetrics
from fp8lab.records import ownership
from fp8lab.core import paths as fpaths
from fp8lab.train import resume as fresume
from fp8lab.train import rerun
from fp8lab.train import trackers as ftrackers


# ---------------------------------------------------------------------------------------- train state

@dataclass
class TrainState:
    """Where the run stands; ``state_dict`` adds this rank's RNG states (torch, CUDA, numpy, random)."""

    step: int = 0
    tokens: int = 0  # seen by all ranks together
    nonfinite_steps: int = 0
    tokens_per_step: int = field(default=0, compare=False)  # of this run (fixed: the fingerprint's global batch)
    device: Any = field(default=None, compare=False, repr=False)  # whose RNG the state holds besides the CPU's

    def advance(self) -> None:
        self.step += 1
        self.tokens += self.tokens_per_step

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens, "nonfinite_steps": self.nonfinite_steps,
                "rng": fckpt.rng_state(self.device)}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.step, self.nonfinite_steps = d["step"], d["nonfinite_steps"]
        self.tokens = d.get("tokens", self.step * self.tokens_per_step)
        fckpt.set_rng_state(d["rng"], self.device)


def as_current_layout(loaded: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's trainer state in today's layout: those written before TrainState kept its
    fields (step, nonfinite_steps, rng) at the top level."""
    if "train_state" not in loaded:
        loaded = {**loaded, "train_state": {k: loaded[k] for k in ("step", "nonfinite_steps", "rng")}}
    return loaded


# ---------------------------------------------------------------------------------------- checkpoints

class Checkpointer:
    """Saves and resumes the model, the optimizer and the stateful ``entries`` (name -> object with
    ``state_dict``/``load_state_dict``: the train state, the scheduler, the data loader).

    ``every``: steps between checkpoints; 0 = only at the end and on SIGTERM; -1 = never."""

    def __init__(self, c, env, paths, model, optimizer, entries: dict[str, Any], fingerprint: dict[str, Any],
                 log: Callable[[str], None]):
        self.c, self.env, self.root, self.output_dir = c, env, paths.checkpoint_dir, paths.output_dir
        self.model, self.optimizer, self.entries = model, optimizer, entries
        self.fingerprint, self.log = fingerprint, log
        self.every, self.keep = c.checkpoint_every, c.keep_checkpoints

    def save(self, step: int) -> str | None:
        """Write checkpoint ``step`` (every rank calls this); None, or why the write failed."""
        from torch.distributed.checkpoint.api import CheckpointException

        trainer_state = {name: obj.state_dict() for name, obj in self.entries.items()}
        trainer_state.update(fingerprint=self.fingerprint, config=self.c.as_dict())
        try:
            fckpt.save(self.root, step, self.model, self.optimizer, trainer_state, self.env, keep=self.keep)
        except (OSError, RuntimeError, CheckpointException) as exc:  # e.g. read-only folder, full disk (torch.save's
            # RuntimeError): stop, keep metrics + summary
            if self.env.local_rank == 0:  # its half-written folder would only hold the space a summary needs
                fckpt.remove_unfinished(self.root, step)
            return fresume.failure_reason(exc)
        return None

    def maybe_save(self, step: int, *, last: bool, stopping: bool, healthy: bool) -> str | None:
        """Save if the policy says so at the end of ``step``: on SIGTERM (``stopping``) unless saving
        is off; else periodically and after the last step, when the step was ``healthy`` (finite)."""
        if stopping:
            return self.save(step) if self.every >= 0 else None
        periodic = self.every > 0 and step % self.every == 0
        final = last and self.every >= 0
        return self.save(step) if (periodic or final) and healthy else None

    def failure_message(self, step: int, why: str) -> str:
        done = [s for s, _ in fckpt.complete_checkpoints(self.root)] if self.env.is_main else []
        # with nothing to resume, only --resume False starts over where metrics.jsonl holds steps (train.rerun)
        over = "" if done else f": with {rerun.START_OVER}"
        return (f"fp8lab: stopped at step {step}: writing its checkpoint to --checkpoint-dir "
                f"{fpaths.shareable_path(str(self.root), self.output_dir)!r} failed ({why}). "
                f"metrics.jsonl and summary.json are written; a restart with a writable checkpoint folder "
                f"resumes from {f'step {done[0]}' if done else 'the start (no complete checkpoint)'}{over}.")

    def resume(self) -> tuple[int, dict[str, tuple]] | None:
        """Load the newest complete checkpoint that loads (older ones if it does not) into the model,
        the optimizer and the entries; (its step, schedule settings that changed) or None (a fresh start).

        Raises ValueError when it was written by another run (fp8lab.train.resume.check), or when
        checkpoints exist and none loads: the model may hold part of a failed load."""
        if not self.c.resume:
            return None
        if self.env.is_main:
            fckpt.remove_partial(self.root)
        candidates = fdist.broadcast_object([str(p) for _, p in fckpt.complete_checkpoints(self.root)], self.env)
        unreadable = []
        for cand in candidates:
            loaded = self._load(cand, unreadable)
            if loaded is None:
                continue
            step = loaded["train_state"]["step"]
            new_settings = fresume.check(loaded["fingerprint"], self.fingerprint, cand, step,
                                         self.c.resume_with_new_settings)
            for name, obj in self.entries.items():
                obj.load_state_dict(loaded[name])
            return step, new_settings
        if unreadable:
            raise ValueError(f"--checkpoint-dir: no checkpoint in {self.root.name!r} loads ({'; '.join(unreadable)}); "
                             "move the unreadable ones away, or start afresh with --resume False or another "
                             "--checkpoint-dir")
        return None

    def _load(self, cand: str, unreadable: list[str]) -> dict[str, Any] | None:
        from torch.distributed.checkpoint.api import CheckpointException

        try:
            return as_current_layout(fckpt.load(cand, self.model, self.optimizer, self.env))
        except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
            unreadable.append(f"{Path(cand).name}: {fresume.failure_reason(exc)}")
            self.log(f"fp8lab: checkpoint {Path(cand).name} does not load ({fresume.failure_reason(exc)}); trying an "
                     "older one")
            return None


# ---------------------------------------------------------------------------------------- non-finite guard

class NonFiniteGuard:
    """FP8 overflow guard: a step with a non-finite loss or gradient norm drops its update (the
    weights stay); ``max_bad`` of them in a row stop the run."""

    def __init__(self, max_bad: int, state: TrainState):
        self.max_bad, self.state = max_bad, state
        self.in_a_row = 0

    def skip(self, loss: float, grad_norm: float) -> bool:
        """Count this step; True when its update must be skipped."""
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.in_a_row = 0
            return False
        self.in_a_row += 1
        self.state.nonfinite_steps += 1
        return True

    @property
    def healthy(self) -> bool:
        return self.in_a_row == 0

    @property
    def stop(self) -> bool:
        return self.in_a_row >= self.max_bad

    def skip_line(self, step: int) -> str:
        return (f"fp8lab: step {step} skipped: non-finite loss or gradient "
                f"({self.in_a_row} in a row, {self.state.nonfinite_steps} in total; limit {self.max_bad} in a row)")

    def nothing_trained_message(self, steps: int) -> str:
        """A run whose every step was skipped, fewer than ``max_bad`` of them: it trained nothing."""
        return (f"fp8lab: all {steps} steps had a non-finite loss or gradient and were skipped: nothing was trained "
                f"(the weights are the initial ones; fewer steps than --max-bad-steps {self.max_bad}, so the guard "
                "did not stop it). Try --recipe current, a larger margin, a lower --lr, or --precision bf16.")

    def stop_message(self, step: int) -> str:
        return (f"fp8lab: stopped at step {step}: {self.in_a_row} steps in a row had a non-finite loss or "
                f"gradient (--max-bad-steps {self.max_bad}). Weights are those of step {step - self.in_a_row}; "
                f"the newest checkpoint is left as it was. Try --recipe current, a larger margin, a lower --lr, "
                f"or --precision bf16.")


# ---------------------------------------------------------------------------------------- SIGTERM, SIGINT

class StopFlag:
    """Set by SIGTERM (spot interruption, torchrun/SageMaker stop) or SIGINT (Ctrl-C, a notebook's
    interrupt): checkpoint and leave after this step. A second Ctrl-C interrupts at once (KeyboardInterrupt)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.set = False
        self.forced = False  # a second Ctrl-C came
        self.name = "SIGTERM"  # the signal that set it
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum, frame) -> None:
        if self.set and signum == signal.SIGINT:
            self.forced = True  # a checkpoint it cut short is no failure of the disk: the run stops at once
            raise KeyboardInterrupt
        self.set, self.name = True, signal.Signals(signum).name

    def uninstall(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
        self._old = {}


@contextmanager
def stopping_at_once(signum: int = signal.SIGTERM) -> Iterator[None]:
    """Inside, ``signum`` stops the run at once as a Ctrl-C does (a KeyboardInterrupt naming the signal): the export
    has no step to finish first, and its staged files are removed on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(num, frame):
        raise KeyboardInterrupt(signal.Signals(num).name)

    old = signal.signal(signum, _raise)
    try:
        yield
    finally:
        signal.signal(signum, old)


# ---------------------------------------------------------------------------------------- metrics

def show_progress(choice: str, is_main: bool) -> bool:
    if not is_main or choice == "off":
        return False
    if choice == "on":
        return True
    return watched()  # one rule for every bar


def max_reserved_gib(device) -> float | None:
    """Peak GPU memory reserved by torch's caching allocator (None on CPU). Under CUDA graphs this is
    the footprint: a graph's private pool stays reserved while its tensors count as freed."""
    import torch

    return torch.cuda.max_memory_reserved(device) / 2**30 if device.type == "cuda" else None


def max_mem_gib(device) -> float:
    """Peak GPU memory allocated by torch; on CPU the process's peak resident memory."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


@dataclass(frozen=True)
class RunInfo:
    """What every step record repeats about the run."""

    precision: str
    backend: str  # resolved, "none" for the plain HF model
    recipe: str | None  # kind, when FP8 is on
    model: str
    world_size: int
    gpu_name: str
    peak: float | None  # dense BF16 FLOP/s for MFU
    flops_per_token: float
    tokens_per_step: int


@dataclass
class StepResult:
    loss: float  # mean over ranks (non-finite when skipped)
    grad_norm: float
    lr: float
    skipped: bool
    stop: bool  # some rank got SIGTERM


class StepMetrics:
    """Times each step, writes its record to metrics.jsonl, prints its lines (rank 0), sums the run up."""

    def __init__(self, c, env, output_dir: Path, info: RunInfo):
        self.c, self.env, self.output_dir, self.info = c, env, output_dir, info
        self.log = None
        self.bar = None
        self.mirror = ftrackers.Mirror(None)  # --tracker: metrics.jsonl's records mirrored (rank 0)
        self._t0 = 0.0

    def open(self, total_steps: int, first_step: int, resumed_from: int | None) -> None:
        from tqdm.auto import tqdm

        if self.env.is_main:
            self.log = fmetrics.MetricsLog(self.output_dir / "metrics.jsonl", resume_step=resumed_from)
            if self.log.torn:
                print(f"fp8lab: metrics.jsonl: dropped {self.log.torn} incomplete line(s) (a write cut off by a kill); "
                      f"the records up to step {resumed_from} (the checkpoint) are kept, later steps are redone",
                      flush=True)
            # the process's environment names MLflow's tracking server, as MLflow itself reads it (SageMaker's managed
            # MLflow sets MLFLOW_TRACKING_URI in the job)
            self.mirror = ftrackers.start(self.c.tracker, output_dir=self.output_dir, tracker_dir=self.c.tracker_dir,
                                          run_name=Path(self.output_dir).name, params=self.c.as_dict(),
                                          environ=os.environ)
        self.bar = tqdm(total=total_steps, initial=first_step - 1, unit="step", dynamic_ncols=True,
                        disable=not show_progress(self.c.progress, self.env.is_main),
                        desc=f"{self.info.model} {self.c.precision}")

    def emit(self, line: str) -> None:
        if self.bar is not None and not self.bar.disable:
            self.bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def write_record(self, rec: dict[str, Any]) -> None:
        """Another record of this step (e.g. fp8lab.fp8.stats'), rank 0; written before the step's own."""
        if self.log is not None:
            self.log.write(rec)
            self.mirror.write(rec)

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        """Seconds since :meth:`start`, once the GPU has finished the step."""
        import torch

        if self.env.device.type == "cuda":
            torch.cuda.synchronize(self.env.device)
        return time.perf_counter() - self._t0

    def record(self, state: TrainState, r: StepResult, dt: float, *, profiled: bool, val_loss: float | None,
               skip_line: str | None) -> None:
        i = self.info
        tps = i.tokens_per_step / dt
        gn = r.grad_norm
        rec = {"step": state.step, "tokens": state.tokens, "loss": None if r.skipped else r.loss,
               "lr": r.lr, "grad_norm": gn if math.isfinite(gn) else None, "step_time_s": dt,
               "tokens_per_sec": tps, "tokens_per_sec_per_gpu": tps / i.world_size,
               "mfu": fmetrics.mfu(i.flops_per_token, tps / i.world_size, i.peak),
               "max_mem_gib": max_mem_gib(self.env.device),
               "precision": i.precision, "backend": i.backend, "recipe": i.recipe, "model": i.model,
               "world_size": i.world_size, "gpu_name": i.gpu_name}
        if self.env.device.type == "cuda":
            rec["max_reserved_gib"] = max_reserved_gib(self.env.device)
        if r.skipped:
            rec.update(skipped=True, nonfinite_steps=state.nonfinite_steps)
        if profiled:
            rec["profiled"] = True  # slowed by the profiler: benchmarks/throughput.py leaves it out of its statistics
        if val_loss is not None:
            rec["val_loss"] = val_loss
        if not self.env.is_main:
            return
        self.log.write(rec)
        self.mirror.write(rec)
        if self.c.print_metrics:
            self.emit(fmetrics.step_line({**rec, "loss": r.loss, "grad_norm": gn}))
            if val_loss is not None:
                self.emit(fmetrics.val_line(state.step, val_loss))
        if skip_line:
            self.emit(skip_line)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{r.loss:.4f}", refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        if self.log is not None:
            self.log.close()
        self.mirror.close()

    def summary(self, paths, status: str, message: str | None, state: TrainState, total_steps: int,
                val_loss: float | None, resumed_from: int | None, wall_s: float) -> dict[str, Any]:
        c, i = self.c, self.info
        recs = fmetrics.read_metrics(self.output_dir / "metrics.jsonl") if self.env.is_main else []
        good = [r for r in recs if r.get("loss") is not None]
        steady = [r["tokens_per_sec_per_gpu"] for r in good[min(10, len(good) // 2):]]
        mfus = [r["mfu"] for r in good[min(10, len(good) // 2):] if r.get("mfu") is not None]
        med = lambda xs: sorted(xs)[len(xs) // 2] if xs else None  # noqa: E731
        exported = status in ("completed", "eval_failed") and c.save_model
        return {
            "status": status, "message": message, "model": fpaths.shareable_path(c.model, paths.output_dir),
            "precision": c.precision, "backend": i.backend, "recipe": i.recipe, "world_size": self.env.world_size,
            "gpu_name": i.gpu_name, "steps": state.step, "total_steps": total_steps, "tokens": state.tokens,
            "final_loss": good[-1]["loss"] if good else None, "first_loss": good[0]["loss"] if good else None,
            "val_loss": val_loss, "nonfinite_steps": state.nonfinite_steps, "resumed_from_step": resumed_from,
            "tokens_per_sec_per_gpu_median": med(steady), "mfu_median": med(mfus),
            "mfu_peak": "dense BF16 peak of the GPU, for BF16 and FP8 alike" if i.peak else None,
            # shareable: relative to the run folder, never an absolute machine path (fp8lab.core.paths)
            "output_dir": ".", "checkpoint_dir": fpaths.shareable_path(str(paths.checkpoint_dir), paths.output_dir),
            "model_dir": fpaths.shareable_path(str(paths.model_dir), paths.output_dir) if exported else None,
            "wall_s": wall_s,
        }

    def write_summary(self, summary: dict[str, Any], plot: bool, checkpoints: list[int] = ()) -> str | None:
        """summary.json, atomically (a temporary file, then a rename), and loss.png; None, or why
        summary.json could not be written (the one before, if any, stays whole), after the run's own stop
        message (a failed checkpoint's), saying which ``checkpoints`` (steps) are kept."""
        path = self.output_dir / "summary.json"
        try:
            ownership.write_file(path, json.dumps(summary, indent=2) + "\n")
            ownership.record(self.output_dir, path.name, "metrics.jsonl")
        except OSError as exc:
            kept = (f"checkpoint step_{max(checkpoints):08d} is kept" if checkpoints else "no checkpoint is complete")
            before = f"{summary['message']} " if summary.get("message") else ""
            return (f"{before}fp8lab: writing summary.json in {self.output_dir.name!r} failed "
                    f"({fresume.failure_reason(exc)}); metrics.jsonl is kept and {kept}: free space and re-run the "
                    "same command")
        if plot:
            plot_loss(self.output_dir)
        return None


def plot_loss(output_dir: Path) -> None:
    """loss.png of this run (fp8lab.views.plots); a plotting problem never fails a finished run."""
    try:
        import io
        import warnings

        import matplotlib

        matplotlib.use("Agg", force=False)
        # up the order, and here only: pandas and matplotlib load when a finished run draws loss.png
        from fp8lab.analysis import load_runs
        from fp8lab.views.plots import loss_figure  # matplotlib, as above

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fig = loss_figure(load_runs([output_dir]), smoothing_span=10)
            png = io.BytesIO()
            fig.savefig(png, format="png", dpi=100)
        ownership.write_file(output_dir / "loss.png", png.getvalue())
        ownership.record(output_dir, "loss.png")
    except Exception as exc:  # noqa: BLE001
        print(f"fp8lab: loss.png not written ({type(exc).__name__}: {exc})", file=sys.stderr)


# ---------------------------------------------------------------------------------------- profiler

class StepProfiler:
    """torch.profiler from the first to the last of ``steps`` (or the run's end); the other steady
    steps' times (not the run's first step: allocation, autotuning) are the comparison."""

    def __init__(self, steps: tuple, total_steps: int, first_step: int, device, output_dir: Path, is_main: bool,
                 emit: Callable[[str], None]):
        self.range = (min(steps), max(steps)) if steps else None
        self.total_steps, self.first_step, self.device = total_steps, first_step, device
        self.output_dir, self.is_main, self.emit = output_dir, is_main, emit
        self.prof = None
        self.wall: list[float] = []  # profiled steps
        self.steady: list[float] = []  # the others

    def start(self, step: int) -> None:
        if self.range and step == self.range[0]:
            self.prof = fprofiling.start(self.device)

    def done(self, step: int, dt: float) -> bool:
        """Book step ``step``'s time; True when it was profiled (its record says so)."""
        if self.prof is None:
            if step > self.first_step:
                self.steady.append(dt)
            return False
        self.wall.append(dt)
        if step == self.range[1] or step == self.total_steps:
            self.prof.__exit__(None, None, None)
            if self.is_main:
                self.emit("fp8lab: profile: " + fprofiling.write(self.prof, self.wall, self.steady, self.output_dir))
            self.prof = None
        return True

    def close(self) -> None:
        if self.prof is not None:  # the run ended inside the profiled range
            self.prof.__exit__(None, None, None)
            self.prof = None
