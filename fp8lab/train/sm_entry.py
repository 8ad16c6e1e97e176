"""Entry script of fp8lab's SageMaker jobs: check the container can do what was asked, then train.

The SDK's torchrun driver runs ``torchrun ... fp8lab/train/sm_entry.py --model ... --precision ...``
from the code channel (``/opt/ml/input/data/code``), so this file runs as a script, not as
part of the package: it first puts the folder holding ``fp8lab/`` on ``sys.path``.

Why a preflight: a job on an image without Transformer Engine (or an FP8 job on a GPU without
FP8 tensor cores) would otherwise fail after the requirements install and data preparation, with
the reason only in the logs and a generic FailureReason. Here it stops at once and writes the reason to
SageMaker's failure file, which becomes the job's ``FailureReason``.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

FAILURE_FILE = "/opt/ml/output/failure"  # SageMaker shows its content as FailureReason


def preflight(argv: list[str], planned: dict | None = None) -> str | None:
    """None when the job can run as asked, else a message saying what is missing and how to fix it.

    The options are read by the trainer's own parser (bad ones are left to it: exit 2 with its
    message). ``planned``: the plan made at launch (``RunPlan.decisions()``, FP8LAB_PLANNED): its backend is
    the one checked (a job launched with ``--backend auto`` runs what was planned), else the one asked.
    Transformer Engine is checked for every job on ``te``: the BF16 twin of an FP8 job runs the same TE
    layers (with FP8 off), so it needs TE as much as the FP8 job does.
    """
    # run as a script, this file imports fp8lab only once __main__ has put the folder holding it on sys.path
    from fp8lab.train.entry import parse_args

    try:
        c = parse_args(argv)
    except ValueError:
        return None  # the trainer reports it
    precision, backend = c.precision, (planned or {}).get("backend", c.backend)
    if backend == "te":
        try:
            import transformer_engine.pytorch  # noqa: F401
        except Exception as exc:  # ImportError, or a CUDA/ABI mismatch raised while loading
            return (
                f"fp8lab: {precision.upper()} was requested with backend 'te' but Transformer Engine does not "
                f"import in this container ({type(exc).__name__}: {exc}). Use an image that ships TE, or "
                "launch with JobSpec(install_te=True) so the job installs the pinned transformer-engine[pytorch] "
                "(fp8lab/constraints-gpu.txt) from its requirements file."
            )
    if precision != "fp8":
        return None
    try:
        import torch
    except Exception as exc:  # pragma: no cover - every training image has torch
        return f"fp8lab: torch does not import ({exc})"
    if torch.cuda.is_available():
        # run as a script: fp8lab imports only once __main__ set its path
        from fp8lab.fp8.backends import fp8_gpu_problem

        problem = fp8_gpu_problem()
        if problem is not None:
            return (f"fp8lab: FP8 needs FP8 tensor cores: {problem}. "
                    "Use ml.p5.* / ml.p5e.* / ml.p5en.* / ml.p6-b200.*, or precision='bf16'.")
    return None


def _report_failure(message: str) -> None:
    """Write the reason where SageMaker reads it (first writer wins, as the SDK's drivers do)."""
    print(message, file=sys.stderr, flush=True)
    path = Path(os.environ.get("FP8LAB_FAILURE_FILE", FAILURE_FILE))
    if path.parent.is_dir() and not path.exists():
        path.write_text(message + "\n")


def main(argv: list[str] | None = None) -> int:
    # run as a script, this file imports fp8lab only once __main__ has put the folder holding it on sys.path
    from fp8lab.plan.runplan import PLANNED_ENV
    from fp8lab.train.entry import main as train_main  # as above

    argv = list(sys.argv[1:] if argv is None else argv)
    text = os.environ.get(PLANNED_ENV)  # the launch's plan: the trainer re-plans here and refuses a different one
    planned = json.loads(text) if text else None
    problem = preflight(argv, planned)
    if problem:
        _report_failure(problem)
        return 2
    return int(train_main(argv, planned=planned) or 0)


if __name__ == "__main__":
    here = Path(__file__).resolve().parent
    # Run as a script, sys.path[0] is fp8lab/train/ itself: replace it by the folder holding fp8lab/ so
    # that ``import fp8lab`` works and fp8lab's modules cannot shadow top-level ones.
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.path.insert(0, str(here.parents[1]))
    raise SystemExit(main())
