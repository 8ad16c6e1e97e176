"""--tracker: a CPU run's metrics.jsonl mirrored into TensorBoard event files (read back with TensorBoard's own
reader) and an MLflow run (read back with MLflow's client from a local store); a tracker that is not installed is
refused before any compute, one that fails mid-run costs no training; a SageMaker job's request says where
SageMaker collects the tracker's output."""
from __future__ import annotations

import json
import shutil

import pytest

from fp8lab import launch as L
from fp8lab.records import metrics as fmetrics
from fp8lab.train import entry as ftrain
from fp8lab.train import trackers

RUN = ["--model", "llama-tiny", "--precision", "fp8", "--backend", "emulated", "--steps", "6", "--seq-len", "32",
       "--micro-batch-size", "2", "--val-every", "3", "--fp8-stats-every", "2", "--data", "tokens", "--plot", "False",
       "--save-model", "False", "--progress", "off", "--print-metrics", "False", "--checkpoint-every", "-1"]


@pytest.fixture
def here(prepared, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(prepared, tmp_path / "tokens")
    return tmp_path


def _expected(run) -> tuple[dict[str, list], dict[str, list]]:
    """metrics.jsonl's series per key, as the tracker should have them: (step -> value) for steps and FP8 health."""
    recs = fmetrics.read_metrics(run / "metrics.jsonl") + fmetrics.read_metrics(run / "metrics.jsonl", "fp8_stats")
    series: dict[str, list] = {}
    for r in recs:
        for k, v in trackers.scalars(r).items():
            series.setdefault(k, []).append((r["step"], v))
    series = {k: sorted(v) for k, v in series.items()}
    return series, {k: [s for s, _ in v] for k, v in series.items()}


def test_tensorboard_event_files_hold_metrics_jsonl_s_series(here):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert ftrain.main([*RUN, "--output-dir", "run", "--tracker", "tensorboard"]) == 0
    run = here / "run"
    steps = fmetrics.read_metrics(run / "metrics.jsonl")
    ea = EventAccumulator(str(run / "tensorboard"))
    ea.Reload()
    tags = set(ea.Tags()["scalars"])
    assert {"loss", "val_loss", "tokens_per_sec_per_gpu", "lr", "grad_norm"} <= tags
    assert {f"fp8_health/{k}/{w}_max" for k in ("activation", "weight", "gradient") for w in ("underflow", "saturation")} <= tags
    # the loss series equals metrics.jsonl's, step by step (TensorBoard keeps float32)
    assert [(e.step, e.value) for e in ea.Scalars("loss")] == [
        (r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in steps]
    assert [e.step for e in ea.Scalars("val_loss")] == [3, 6]
    series, _ = _expected(run)
    for key in ("tokens_per_sec_per_gpu", "fp8_health/weight/underflow_max", "fp8_health/gradient/saturation_max"):
        assert [(e.step, e.value) for e in ea.Scalars(key)] == [(s, pytest.approx(v, rel=1e-6, abs=1e-12))
                                                                for s, v in series[key]]
    stats = fmetrics.read_metrics(run / "metrics.jsonl", "fp8_stats")
    assert [s for s, _ in series["fp8_health/activation/underflow_max"]] == [r["step"] for r in stats] == [2, 4, 6]
    assert "mfu" not in tags  # a CPU has no MFU: null in metrics.jsonl, no point in the tracker


def test_mlflow_against_a_local_file_store(here, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    store = (here / "mlruns").resolve().as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)  # the environment's tracking URI, as in a SageMaker job
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store only where asked
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "fp8lab-test")
    assert ftrain.main([*RUN, "--output-dir", "run", "--tracker", "mlflow"]) == 0
    client = MlflowClient(tracking_uri=store)
    exp = client.get_experiment_by_name("fp8lab-test")
    (run_info,) = client.search_runs([exp.experiment_id])
    assert run_info.info.status == "FINISHED" and run_info.info.run_name == "run"
    assert run_info.data.params["model"] == "llama-tiny" and run_info.data.params["tracker"] == "mlflow"
    series, _ = _expected(here / "run")
    for key in ("loss", "val_loss", "tokens_per_sec_per_gpu", "fp8_health/activation/underflow_max"):
        got = [(m.step, m.value) for m in client.get_metric_history(run_info.info.run_id, key)]
        assert sorted(got) == [(s, pytest.approx(v)) for s, v in series[key]], key
    assert not (here / "run" / "mlflow").exists()  # the environment's store, not the local default


def test_a_missing_tracker_is_refused_before_compute_and_a_failing_one_costs_no_training(here, monkeypatch, capsys):
    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    assert ftrain.main([*RUN, "--output-dir", "refused", "--tracker", "tensorboard"]) == ftrain.EXIT_BAD_OPTIONS
    assert "--tracker tensorboard needs the tensorboard package" in capsys.readouterr().err
    assert not (here / "refused" / "metrics.jsonl").exists()
    monkeypatch.undo()
    monkeypatch.chdir(here)
    pytest.importorskip("tensorboard")

    def broken(self, step, values):
        if step >= 3:
            raise OSError("disk full")

    monkeypatch.setattr(trackers.TensorBoardTracker, "log", broken)
    assert ftrain.main([*RUN, "--output-dir", "run", "--tracker", "tensorboard"]) == 0
    assert "--tracker stopped (OSError: disk full); training goes on" in capsys.readouterr().out
    assert [r["step"] for r in fmetrics.read_metrics(here / "run" / "metrics.jsonl")] == list(range(1, 7))
    with pytest.raises(ValueError, match="tracker='wandb' is invalid|--tracker"):
        ftrain.parse_args(["--tracker", "wandb"])


def test_a_job_s_tracker_writes_where_sagemaker_collects_it(tmp_path):
    pytest.importorskip("sagemaker.train")
    kw = dict(model="llama-1b", precision="fp8", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, tokens=10**9)
    tb = L.JobSpec(**kw, options={"tracker": "tensorboard"})
    req = L.build_requests(tb)[0]
    where = req["TensorBoardOutputConfig"]
    assert where["LocalPath"] == "/opt/ml/output/tensorboard"  # copied to S3 by SageMaker while the job runs
    base = f"s3://{L.PLACEHOLDER_BUCKET}/fp8lab/p5-sweep/output/tensorboard/"
    assert where["S3OutputPath"].startswith(base) and req["TrainingJobName"].startswith(where["S3OutputPath"][len(base):])
    assert req["HyperParameters"]["tracker"] == "tensorboard"
    assert req["HyperParameters"]["tracker-dir"] == "/opt/ml/output/tensorboard"
    assert "tensorboard" in (L.stage_source(tmp_path / "tb", tracker="tensorboard") / "requirements.txt").read_text().split()
    arn = "arn:aws:sagemaker:us-east-1:111122223333:mlflow-tracking-server/fp8lab"
    ml = L.JobSpec(**kw, options={"tracker": "mlflow"}, mlflow_tracking_uri=arn)
    req = L.build_requests(ml)[0]
    assert req["Environment"]["MLFLOW_TRACKING_URI"] == arn and "TensorBoardOutputConfig" not in req
    assert L.job_name(ml) == L.job_name(L.JobSpec(**kw, options={"tracker": "mlflow"}))  # where it logs: not the job
    reqs = (L.stage_source(tmp_path / "ml", tracker="mlflow") / "requirements.txt").read_text().split()
    assert {"mlflow", "sagemaker-mlflow"} <= set(reqs)
    assert "TensorBoardOutputConfig" not in L.build_requests(L.JobSpec(**kw))[0]
    with pytest.raises(ValueError, match="JobSpec.mlflow_tracking_uri=.* is invalid; allowed: None, or with options="):
        L.JobSpec(**kw, mlflow_tracking_uri=arn)
    with pytest.raises(ValueError, match="tracker_dir"):
        L.JobSpec(**kw, options={"tracker": "tensorboard", "tracker_dir": "/tmp/x"})


def test_mlflow_s_default_store_is_a_local_file_in_the_run_folder(tmp_path):
    """No MLFLOW_TRACKING_URI: the run's own local store, <output-dir>/mlflow/mlflow.db (MLflow's SQLite file)."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    mirror = trackers.start("mlflow", output_dir=tmp_path / "run", tracker_dir=None, run_name="run",
                            params={"model": "llama-tiny", "steps": 2, "model_overrides": {}}, environ={})
    assert mirror.tracker is not None
    for step, loss in ((1, 6.25), (2, 6.0)):
        mirror.write({"step": step, "loss": loss, "tokens_per_sec_per_gpu": 1000.0 + step, "mfu": None})
    mirror.write({"record": "fp8_stats", "step": 2, "layers": [
        {"layer": "blocks.0.attn.qkv", "kind": "activation", "underflow": 0.01, "saturation": 0.0},
        {"layer": "blocks.1.attn.qkv", "kind": "activation", "underflow": 0.03, "saturation": None}]})
    mirror.close()
    assert (tmp_path / "run" / "mlflow" / "mlflow.db").is_file()
    client = MlflowClient(tracking_uri=trackers.local_store(tmp_path / "run" / "mlflow"))
    (run,) = client.search_runs([client.get_experiment_by_name("fp8lab").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [(1, 6.25), (2, 6.0)]
    assert client.get_metric_history(run.info.run_id, "fp8_health/activation/underflow_max")[0].value == 0.03
    assert "mfu" not in run.data.metrics and run.data.params == {"model": "llama-tiny", "steps": "2"}
