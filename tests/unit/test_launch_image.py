"""The SageMaker job's image and its Transformer Engine: the table, the plan-time decision, and the
job's requirements (the real staged code folder and the real SDK request of a dry run)."""
from __future__ import annotations

import pytest

from fp8lab import launch as L
from fp8lab.launch import image
from fp8lab.launch.plan import as_plan
from fp8lab.core.pins import MIN_TE, pins, te_supported

pytest.importorskip("sagemaker.train")


def _spec(**kw):
    return L.JobSpec(**{"model": "llama-1b", "precision": "fp8", "role": L.PLACEHOLDER_ROLE,
                        "bucket": L.PLACEHOLDER_BUCKET, "tokens": 1_000_000_000, **kw})


def test_the_table_names_the_default_image_and_its_te():
    assert L.JobSpec.framework_version in image.IMAGE_TE  # the default image is in the table
    te, source = image.IMAGE_TE["2.9"]
    assert te == "2.8" and "Dockerfile.gpu" in source and "TE_VERSION=2.8" in source
    assert MIN_TE == (2, 9)
    assert not te_supported("2.8") and not te_supported(None) and te_supported("2.9.0") and te_supported("2.20.2")


def test_the_default_image_s_te_is_too_old_so_the_job_installs_the_pinned_one(tmp_path):
    spec = _spec()
    assert not spec.install_te and image.installs_te(spec)
    line = image.te_in_job(spec)
    assert "ships TE 2.8" in line and f"installs transformer-engine {pins()['transformer-engine']}" in line
    plan = as_plan(spec)
    assert line in plan.summary()["transformer_engine"] and line in L.format_cost_table(plan)
    req = L.build_requests(spec)[0]
    env = req["Environment"]
    assert env["PIP_NO_BUILD_ISOLATION"] == "false" and env["NVTE_FRAMEWORK"] == "pytorch"
    staged = L.stage_source(tmp_path / "code", image.installs_te(spec), spec.framework_version)
    # the default image (2.9) is built on CUDA 13: the job installs TE's core for CUDA 13
    assert (staged / "requirements.txt").read_text().splitlines() == [
        *L.JOB_REQUIREMENTS, f"transformer-engine[pytorch,core_cu13]=={pins()['transformer-engine']}"]
    assert image.job_requirements(True, "2.8") == [f"transformer-engine[pytorch,core_cu12]=={pins()['transformer-engine']}"]
    assert image.job_requirements(True, "2.99") == [f"transformer-engine[pytorch]=={pins()['transformer-engine']}"]
    assert (staged / "fp8lab" / "constraints-gpu.txt").is_file()  # the pins travel with the package
    # TE's debug API, pinned like TE: --fp8-stats-source auto can read the job's FP8 health through it
    assert f"nvdlfw-inspect=={pins()['nvdlfw-inspect']}" in (staged / "requirements.txt").read_text().splitlines()


def test_an_image_with_a_supported_te_installs_nothing(monkeypatch, tmp_path):
    monkeypatch.setitem(image.IMAGE_TE, "2.9", ("2.10", "test"))
    spec = _spec()
    assert not image.installs_te(spec) and "which fp8lab supports" in image.te_in_job(spec)
    assert "PIP_NO_BUILD_ISOLATION" not in L.build_requests(spec)[0]["Environment"]
    assert image.installs_te(_spec(install_te=True))  # asked for: installed anyway
    assert "asked (install_te=True)" in image.te_in_job(_spec(install_te=True))


def test_an_unknown_image_installs_the_pinned_te():
    spec = _spec(framework_version="2.99")
    assert image.image_te("2.99") is None and image.installs_te(spec)
    assert "does not know" in image.te_in_job(spec)


def test_the_staged_code_carries_the_results_auto_decisions_read(tmp_path):
    """A job re-plans on its instance: the committed checks behind --fp8-all-gather and --fp8-attention auto travel
    with the code, so the job decides as `fp8lab launch plan` did, whatever the instance's data/ holds."""
    import json
    import os
    import subprocess
    import sys

    from fp8lab.core.paths import REPO_ROOT
    from fp8lab.plan.runplan import decision_results

    staged = L.stage_source(tmp_path / "code")
    for result in decision_results():  # a check not committed yet (e.g. TE's debug API's) is not there either
        copy = staged / result.relative_to(REPO_ROOT)
        assert copy.read_bytes() == result.read_bytes() if result.exists() else not copy.exists()
    probe = ("import json; from fp8lab import plan, fp8attn; from fp8lab.plan import fp8_stats as fp8stats; print(json.dumps([plan.FP8_ALL_GATHER_CHECKED, "
             "fp8attn.loss_checked(), fp8attn.study_crossover(), fp8stats.TE_DEBUG_CHECKED, str(fp8attn.LOSS_RESULT)]))")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FP8LAB_DATA_DIR")}
    out = subprocess.run([sys.executable, "-c", probe], cwd=staged, env={**env, "PYTHONPATH": str(staged)},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    from fp8lab.plan import fp8attn, runplan as plan
    from fp8lab.plan import fp8_stats as fp8stats

    checked, loss, crossover, te_debug, where = json.loads(out.strip().splitlines()[-1])
    assert where.startswith(str(staged))  # the staged package, not this checkout
    assert [checked, loss, crossover, te_debug] == [plan.FP8_ALL_GATHER_CHECKED, fp8attn.loss_checked(),
                                                    fp8attn.study_crossover(), fp8stats.TE_DEBUG_CHECKED]
