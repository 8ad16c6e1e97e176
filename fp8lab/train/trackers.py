"""Where users keep their runs: ``--tracker tensorboard|mlflow`` mirrors metrics.jsonl into TensorBoard event files or
an MLflow run, as it is written (rank 0). ``none`` (the default) writes metrics.jsonl only.

The same metrics as metrics.jsonl, under its own keys (:func:`scalars`): per step ``loss``, ``val_loss``,
``tokens_per_sec_per_gpu``, ``mfu``, ``lr``, ``grad_norm``, ``step_time_s``; per FP8 health record
(``fp8lab.fp8.stats``) the worst underflow and saturation of each operand kind over the layers
(``fp8_health/<kind>/underflow_max``, ``.../saturation_max``). Where each writes:

* ``tensorboard``: event files in ``--tracker-dir`` (default ``<output-dir>/tensorboard``); a SageMaker job writes
  them to its TensorBoard output path (``fp8lab.launch`` sets ``TensorBoardOutputConfig`` and this folder), which
  SageMaker copies to S3 while the job runs. Needs the ``tensorboard`` package (``pip install 'fp8lab[tensorboard]'``).
* ``mlflow``: the tracking URI ``MLFLOW_TRACKING_URI`` of the environment (SageMaker's managed MLflow: the tracking
  server's ARN, with the ``sagemaker-mlflow`` plugin; a ``file:`` store where MLflow allows it), else a local store in
  ``--tracker-dir`` (default ``<output-dir>/mlflow``): ``mlflow.db``, the SQLite file MLflow 3 recommends over its
  ``./mlruns`` folder store (in maintenance mode since 3.x, refused unless ``MLFLOW_ALLOW_FILE_STORE=true``);
  experiment ``MLFLOW_EXPERIMENT_NAME`` or ``fp8lab``; the run's options as parameters. Needs ``mlflow``
  (``pip install 'fp8lab[mlflow]'``).

A tracker that cannot be imported is refused before the run starts (:func:`check_available`, an option error).
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any, Mapping

from fp8lab.fp8.stats import RECORD as FP8_STATS_RECORD
from fp8lab.plan.options import TRACKERS  # noqa: F401 (the vocabulary, declared with the other options)

STEP_SCALARS = ("loss", "val_loss", "tokens_per_sec_per_gpu", "mfu", "lr", "grad_norm", "step_time_s")
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow")}  # tracker -> (module, extra)


def check_available(tracker: str) -> None:
    """Refuse a tracker whose package is not installed (before any compute), saying how to install it."""
    if tracker in PACKAGES:
        module, extra = PACKAGES[tracker]
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"--tracker {tracker} needs the {module} package, which is not installed: "
                             f"pip install 'fp8lab[{extra}]' (or --tracker none)")


def scalars(rec: Mapping[str, Any]) -> dict[str, float]:
    """The tracker's scalars of one metrics.jsonl record (see the module doc); nothing for other records."""
    if rec.get("record") == FP8_STATS_RECORD:
        out: dict[str, float] = {}
        for layer in rec.get("layers", []):
            for what in ("underflow", "saturation"):
                v = layer.get(what)
                if isinstance(v, (int, float)):
                    key = f"fp8_health/{layer.get('kind')}/{what}_max"
                    out[key] = max(out.get(key, float("-inf")), float(v))
        return out
    if "record" in rec:
        return {}
    return {k: float(rec[k]) for k in STEP_SCALARS
            if isinstance(rec.get(k), (int, float)) and not isinstance(rec[k], bool)}


def default_dir(tracker: str, output_dir: Path) -> Path:
    """Where a tracker writes without ``--tracker-dir``: ``<output-dir>/tensorboard`` or ``<output-dir>/mlflow``."""
    return Path(output_dir) / ("tensorboard" if tracker == "tensorboard" else "mlflow")


class TensorBoardTracker:
    def __init__(self, folder: Path, run_name: str):
        from torch.utils.tensorboard import SummaryWriter  # tensorboard (optional): loaded only for this tracker

        self.folder = Path(folder)
        self.writer = SummaryWriter(log_dir=str(self.folder), comment=run_name)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, global_step=step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


class MlflowTracker:
    def __init__(self, uri: str, experiment: str, run_name: str, params: dict[str, Any], artifacts: Path | None = None):
        from mlflow.tracking import MlflowClient  # mlflow (optional): loaded only for this tracker

        self.client = MlflowClient(tracking_uri=uri)
        found = self.client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found is not None else self.client.create_experiment(
            experiment, artifact_location=artifacts.resolve().as_uri() if artifacts else None)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        from mlflow.entities import Param

        self.client.log_batch(self.run_id, params=[Param(k, str(v)[:6000]) for k, v in sorted(params.items())])

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()])

    def close(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


def local_store(folder: Path) -> str:
    """The tracking URI of a local MLflow store in ``folder``: its SQLite file ``mlflow.db``."""
    return f"sqlite:///{(Path(folder) / 'mlflow.db').resolve()}"


def open_tracker(tracker: str, *, output_dir: Path, tracker_dir: str | None, run_name: str,
                 params: dict[str, Any], environ: Mapping[str, str]):
    """The tracker of a run (None for ``none``); ``environ``: where MLflow's tracking URI and experiment are read."""
    if tracker == "tensorboard":
        return TensorBoardTracker(Path(tracker_dir) if tracker_dir else default_dir(tracker, output_dir), run_name)
    if tracker == "mlflow":
        flat = {k: v for k, v in params.items() if isinstance(v, (str, int, float, bool)) or v is None}
        experiment = environ.get("MLFLOW_EXPERIMENT_NAME") or "fp8lab"
        if environ.get("MLFLOW_TRACKING_URI"):
            return MlflowTracker(environ["MLFLOW_TRACKING_URI"], experiment, run_name, flat)
        local = Path(tracker_dir) if tracker_dir else default_dir(tracker, output_dir)
        local.mkdir(parents=True, exist_ok=True)
        return MlflowTracker(local_store(local), experiment, run_name, flat, artifacts=local / "artifacts")
    return None


def start(tracker: str, **where: Any) -> "Mirror":
    """The run's mirror (:func:`open_tracker`'s arguments); a tracker that cannot start (its server unreachable) is
    left out with one line saying so: the run trains, metrics.jsonl keeps every record."""
    mirror = Mirror(None)
    mirror._guard(lambda: setattr(mirror, "tracker", open_tracker(tracker, **where)))
    return mirror


class Mirror:
    """The records of metrics.jsonl, mirrored into a tracker as they are written (``None`` tracker: nothing).

    A tracker that fails (a tracking server gone mid-run, a full disk) is dropped with one line saying so: training
    goes on and metrics.jsonl keeps every record."""

    def __init__(self, tracker):
        self.tracker = tracker

    def write(self, rec: Mapping[str, Any]) -> None:
        if self.tracker is None or not isinstance(rec.get("step"), int):
            return
        values = scalars(rec)
        if values:
            self._guard(lambda: self.tracker.log(rec["step"], values))

    def close(self) -> None:
        if self.tracker is not None:
            self._guard(self.tracker.close)
            self.tracker = None

    def _guard(self, call) -> None:
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - any tracker's error: the run goes on, metrics.jsonl has it all
            print(f"fp8lab: --tracker stopped ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                  "training goes on, metrics.jsonl keeps every record", flush=True)
            self.tracker = None
