"""What a job runs, run here: the staged code channel, fp8lab/train/sm_entry.py and the real trainer on CPU.

The job's command line is built the way the SDK's torchrun driver builds it (its own
``hyperparameters_to_cli_args`` on the request's hyperparameters), then executed from a copy
of the code channel with SageMaker's output variables set. Its log lines are the input of the
metric-definition regexes; its ``/opt/ml/output/data`` becomes the output.tar.gz ``collect`` reads.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile

import pytest

pytest.importorskip("sagemaker.train")
from fp8lab import launch as L  # noqa: E402

import moto_env as menv  # noqa: E402  (tests/sagemaker/, on sys.path through tests/conftest.py)
endpoint, aws = menv.endpoint, menv.aws  # fixtures


def _driver_cli_args(hyperparameters: dict) -> list[str]:
    """The SDK driver's own conversion of hyperparameters to ``--key value`` arguments."""
    import sagemaker.train.container_drivers.common.utils as drv
    from sagemaker.train.utils import safe_serialize  # what ModelTrainer does to each value

    return drv.hyperparameters_to_cli_args({k: safe_serialize(v) for k, v in hyperparameters.items()})


@pytest.fixture(scope="module")
def job_run(tmp_path_factory):
    """One tiny job, as the container would run it on one node (CPU: no torchrun, no TE)."""
    tmp = tmp_path_factory.mktemp("job")
    code = L.stage_source(tmp / "code")
    spec = L.JobSpec(model="llama-tiny", precision="bf16", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET,
                     steps=3, seq_len=32, micro_batch_size=2)
    hp = L.hyperparameters(spec)
    # CPU stand-ins for what the GPU job uses: plain HF layers instead of TE, validation at step 2.
    hp.update({"backend": "none", "val-every": 2})
    out = tmp / "opt_ml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "PYTHON"))}
    env.update(SM_MODEL_DIR=str(out / "model"), SM_OUTPUT_DATA_DIR=str(out / "output" / "data"),
               FP8LAB_CHECKPOINT_DIR=str(out / "checkpoints"), FP8LAB_FAILURE_FILE=str(out / "output" / "failure"),
               PYTHONDONTWRITEBYTECODE="1")
    (out / "output").mkdir(parents=True)
    cmd = [sys.executable, "fp8lab/train/sm_entry.py", *_driver_cli_args(hp)]
    res = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return {"stdout": res.stdout, "out": out, "code": code}


def test_code_channel_layout(job_run):
    code = job_run["code"]
    assert (code / "fp8lab" / "train" / "sm_entry.py").is_file() and (code / "fp8lab" / "train" / "entry.py").is_file()
    shipped = code / "fp8lab" / "shipped"  # the default data, inside the package as a wheel has it
    assert list((shipped / "corpus").iterdir()) and (shipped / "tokenizer.json").is_file()
    assert not (code / "data").exists() and (code / "fp8lab" / "plan" / "evidence.json").is_file()
    assert "transformers" in (code / "requirements.txt").read_text()
    assert not list(code.rglob("__pycache__"))


def test_metric_definitions_read_the_trainer_lines(job_run):
    lines = [ln for ln in job_run["stdout"].splitlines() if ln.startswith("fp8lab-metrics")]
    records = [json.loads(ln) for ln in (job_run["out"] / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    train_lines = [ln for ln in lines if " loss=" in ln]
    val_lines = [ln for ln in lines if "val_loss=" in ln]
    assert len(train_lines) == 3 == len(records) and val_lines
    defs = {k: re.compile(v) for k, v in L.METRIC_DEFINITIONS.items()}
    for line, rec in zip(train_lines, records):
        got = {k: float(m.group(1)) for k, rx in defs.items() if (m := rx.search(line))}
        assert set(got) == set(defs) - {"validation:loss"}  # " loss=" never matches a val_loss line
        assert got["train:loss"] == pytest.approx(rec["loss"], abs=1e-6)
        assert got["train:tokens_per_sec_per_gpu"] == pytest.approx(rec["tokens_per_sec_per_gpu"], abs=0.05)
        assert got["train:mfu"] == pytest.approx(rec["mfu"] or 0.0, abs=1e-4)
        assert got["train:step_time_s"] == pytest.approx(rec["step_time_s"], abs=1e-4)
        assert got["train:lr"] == pytest.approx(rec["lr"], rel=1e-3)
        assert got["train:grad_norm"] == pytest.approx(rec["grad_norm"], abs=1e-4)
        assert L.parse_metric_line(line)["step"] == rec["step"]
    for line in val_lines:
        assert defs["train:loss"].search(line) is None
        assert float(defs["validation:loss"].search(line).group(1)) == L.parse_metric_line(line)["val_loss"]


def test_collect_reads_the_jobs_real_output(job_run, aws):
    """The job's output data dir as SageMaker would archive it, read back by collect()."""
    sess, rec, boto = aws
    names = L.launch(L.plan_sweep(["llama-tiny"], ["bf16"], [1], role=menv.ROLE, bucket=menv.BUCKET, steps=3),
                     dry_run=False, session=sess, out=lambda s: None)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for f in sorted((job_run["out"] / "output" / "data").rglob("*")):
            tar.add(f, arcname=str(f.relative_to(job_run["out"] / "output" / "data")), recursive=False)
    boto.client("s3").put_object(Bucket=menv.BUCKET, Key=f"fp8lab/p5-sweep/output/{names[0]}/output/output.tar.gz",
                                 Body=buf.getvalue())
    df = L.collect(names, session=sess, out=lambda s: None)
    records = [json.loads(ln) for ln in (job_run["out"] / "output" / "data" / "metrics.jsonl").read_text().splitlines()]
    assert list(df.step) == [r["step"] for r in records]
    assert df.loss.tolist() == pytest.approx([r["loss"] for r in records])
    assert set(df.source) == {"s3:output.tar.gz"} and set(df.job) == set(names)


def test_fp8_without_transformer_engine_fails_fast_with_the_reason(tmp_path):
    code = L.stage_source(tmp_path / "code")
    from fp8lab.train import sm_entry

    if sm_entry.preflight(["--precision", "fp8", "--backend", "te"]) is None:
        pytest.skip("Transformer Engine imports on this machine")
    (tmp_path / "output").mkdir()
    env = {**os.environ, "FP8LAB_FAILURE_FILE": str(tmp_path / "output" / "failure")}
    spec = L.JobSpec(model="llama-1b", precision="fp8", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, steps=3)
    res = subprocess.run([sys.executable, "fp8lab/train/sm_entry.py", *_driver_cli_args(L.hyperparameters(spec))],
                         cwd=code, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    reason = (tmp_path / "output" / "failure").read_text()
    assert reason.startswith("fp8lab: FP8 was requested with backend 'te' but Transformer Engine does not import")
    assert "install_te=True" in reason
    assert "fp8lab-metrics" not in res.stdout  # nothing trained
    # The BF16 twin runs the same TE layers, so it needs TE too; without TE layers it does not.
    assert "BF16 was requested with backend 'te'" in sm_entry.preflight(["--precision", "bf16", "--backend", "te"])
    assert sm_entry.preflight(["--precision", "bf16", "--backend", "none"]) is None
    assert sm_entry.preflight(["--precision=fp8", "--backend=torchao"]) is None  # CPU: no GPU to check


def test_the_job_entry_checks_the_backend_its_launch_planned():
    """A job launched with --backend auto runs the backend its plan chose (FP8LAB_PLANNED): that one is checked."""
    from fp8lab.train import sm_entry

    if sm_entry.preflight(["--precision", "bf16", "--backend", "te"]) is None:
        pytest.skip("Transformer Engine imports on this machine")
    asked = ["--precision", "bf16", "--backend", "auto"]
    assert sm_entry.preflight(asked) is None  # nothing planned: auto is left to the trainer's own plan
    assert "BF16 was requested with backend 'te'" in sm_entry.preflight(asked, {"backend": "te"})
    assert sm_entry.preflight(asked, {"backend": "none"}) is None
