"""The SageMaker job's image and its Transformer Engine: the table, the plan-time decision, and the
job's requirements (the real staged code folder and the real SDK request of a dry run)."""
from __future__ import annotations

import dataclasses

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
        *L.job_base_requirements(), f"transformer-engine[pytorch,core_cu13]=={pins()['transformer-engine']}"]
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


def test_the_staged_code_plans_as_the_launch_did_with_the_data_folder_elsewhere(tmp_path):
    """A job re-plans on its instance: the evidence the plan's auto rules follow and the default corpus and
    tokenizers travel inside the staged package, so the job decides as `fp8lab launch plan` did and finds its
    data, whatever the instance's data/ holds; staging works with FP8LAB_DATA_DIR outside the checkout."""
    import json
    import os
    import subprocess
    import sys

    from fp8lab.core.paths import SHIPPED_FILES, shipped_path

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    stage = ("import sys; from fp8lab.launch.requests import stage_source; print(stage_source(sys.argv[1]))")
    subprocess.run([sys.executable, "-c", stage, str(tmp_path / "code")], env={**env, "FP8LAB_DATA_DIR": str(elsewhere)},
                   capture_output=True, text=True, timeout=120, check=True)
    staged = tmp_path / "code"
    for name in SHIPPED_FILES:
        assert (staged / "fp8lab" / "shipped" / name).read_bytes() == shipped_path(name).read_bytes()
    probe = ("import json; from fp8lab.plan import evidence; from fp8lab.data.tokens import shipped_tokenizer_path; "
             "from fp8lab.records.data_format import default_corpus; import dataclasses; "
             "print(json.dumps([dataclasses.asdict(evidence.load()), str(shipped_tokenizer_path()), "
             "[str(p) for p in default_corpus()]]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=staged,
                         env={**{k: v for k, v in env.items() if k != "FP8LAB_DATA_DIR"}, "PYTHONPATH": str(staged)},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    from fp8lab.plan import evidence

    there, tokenizer, corpus = json.loads(out.strip().splitlines()[-1])
    assert there == json.loads(json.dumps(dataclasses.asdict(evidence.load())))  # the same values as here
    assert tokenizer.startswith(str(staged / "fp8lab" / "shipped")) and corpus[0].startswith(str(staged / "fp8lab"))
