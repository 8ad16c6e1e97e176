"""Notebook 04 executed for real (papermill): defaults and a non-default sweep, values read back."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

pytest.importorskip("sagemaker.train")
from fp8lab import launch as L  # noqa: E402
from fp8lab.notebooks import read_glued, run  # noqa: E402

_spec = importlib.util.spec_from_file_location("moto_env", Path(__file__).parent / "sagemaker" / "moto_env.py")
menv = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(menv)

TS = re.compile(r"-\d{14}$")
# The placeholder role's account is AWS's documentation example, shown on purpose in the parameters cell.
ALLOWED = L._public_registry_accounts() | {"111122223333"}


def _check(vals, plan, executed: Path):
    assert vals["dry_run"] is True
    assert vals["n_jobs"] == len(plan.jobs)
    assert vals["total_cost_usd"] == pytest.approx(plan.total_cost_usd, abs=0.01)
    assert vals["total_gpu_hours"] == pytest.approx(plan.total_gpu_hours, abs=1e-3)
    assert vals["plan_names"] == plan.names
    assert [TS.sub("", n) for n in vals["job_names"]] == plan.names
    text = executed.read_text()
    assert text.count("CreateTrainingJob request for") == 1  # show_requests=1; the rest as differences
    assert text.count("as the first request except") == len(plan.jobs) - 1
    menv.assert_clean(ALLOWED, text)
    # printed requests carry no account id, not even the placeholder's
    assert "arn:aws:iam::<account-id>:role/fp8lab-sagemaker-execution-role" in text


@pytest.mark.slow
def test_notebook_04_defaults_plan_the_blog_sweep_without_aws(tmp_path):
    res = run(["04"], {}, output_dir=tmp_path, progress=False)
    vals = read_glued(res[0].output)
    plan = L.plan_sweep(["llama-1b", "llama-7b"], ["bf16", "fp8"], [1, 2, 4], tokens=24_000_000_000,
                        role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET)
    _check(vals, plan, res[0].output)
    assert vals["n_jobs"] == 12 and vals["price_per_hour"] == 113.07 and vals["n_metric_rows"] == 0


def test_notebook_04_custom_sweep(tmp_path):
    params = {"models": ["llama-1b", "gptneo-1.3b"], "precisions": ["bf16", "fp8"], "instance_counts": [1, 2],
              "tokens": 2_000_000_000, "price_per_hour": 98.32, "region": "us-west-2"}
    res = run(["04"], params, output_dir=tmp_path, progress=False)
    vals = read_glued(res[0].output)
    plan = L.plan_sweep(params["models"], params["precisions"], params["instance_counts"], tokens=params["tokens"],
                        price_per_hour=98.32, region="us-west-2", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET)
    _check(vals, plan, res[0].output)
    assert vals["n_jobs"] == 8 and vals["price_per_hour"] == 98.32
    assert "us-west-2.amazonaws.com/pytorch-training" in res[0].output.read_text()
