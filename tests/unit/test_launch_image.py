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
    """The default: the newest SageMaker PyTorch image whose torch fp8lab is tested with and whose TE it supports."""
    from fp8lab.core.paths import REPO_ROOT

    assert L.JobSpec.framework_version == image.DEFAULT_VERSION == "2.13"
    im = image.IMAGES["2.13"]
    assert (im.name, im.torch, im.te) == ("pytorch:2.13-cu133-amzn2023-sagemaker", "2.13.0", "2.17.0")
    assert "deep-learning-containers" in im.source and "Transformer Engine 2.17.0" in im.source
    # 2.14 is listed but ships a torch newer than any fp8lab is tested with: no default
    assert image.IMAGES["2.14"].torch == "2.14.0" and image.NEWEST_TESTED_TORCH == (2, 13)
    lock = (REPO_ROOT / "requirements-cpu.lock").read_text()
    assert "# cpu-torch: torch==2.13.0" in lock  # NEWEST_TESTED_TORCH is the CPU tier's torch
    assert [v for v, i in image.IMAGES.items() if te_supported(i.te)] == ["2.11", "2.12", "2.13", "2.14"]
    te, source = image.IMAGES["2.9"].te, image.IMAGES["2.9"].source
    assert te == "2.8" and "Dockerfile.gpu" in source and "TE_VERSION=2.8" in source
    assert MIN_TE == (2, 9)
    assert not te_supported("2.8") and not te_supported(None) and te_supported("2.9.0") and te_supported("2.20.2")


def test_a_dry_run_p5_te_job_names_a_current_image_and_builds_nothing(tmp_path):
    spec = _spec()
    assert spec.plan.backend == "te" and not image.installs_te(spec) and not spec.builds_te
    line = image.te_in_job(spec)
    assert "pytorch:2.13-cu133-amzn2023-sagemaker ships TE 2.17.0" in line and "no TE build" in line
    req = L.build_requests(spec)[0]
    uri = req["AlgorithmSpecification"]["TrainingImage"]
    registry = uri.split(".")[0]
    assert uri == f"{registry}.dkr.ecr.us-east-1.amazonaws.com/pytorch:2.13-cu133-amzn2023-sagemaker"
    # the region's DLC registry, the one the SDK's own table names for pytorch-training there
    assert L.build_requests(_spec(framework_version="2.9"))[0]["AlgorithmSpecification"]["TrainingImage"].startswith(
        f"{registry}.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.9")
    assert "PIP_NO_BUILD_ISOLATION" not in req["Environment"] and "NVTE_FRAMEWORK" not in req["Environment"]
    staged = L.stage_source(tmp_path / "code", image.installs_te(spec), spec.framework_version)
    assert (staged / "requirements.txt").read_text().splitlines() == L.job_base_requirements()  # no transformer-engine
    plan = as_plan(spec)
    assert line in plan.summary()["transformer_engine"] and line in L.format_cost_table(plan)


def test_an_image_with_too_old_a_te_builds_the_pinned_one_and_its_start_up_says_so(tmp_path):
    old, new = _spec(framework_version="2.9"), _spec()
    assert not old.install_te and image.installs_te(old) and old.builds_te
    line = image.te_in_job(old)
    assert "ships TE 2.8" in line and f"installs transformer-engine {pins()['transformer-engine']}" in line
    assert "adds 20 min to the start-up estimate" in line
    env = L.build_requests(old)[0]["Environment"]
    assert env["PIP_NO_BUILD_ISOLATION"] == "false" and env["NVTE_FRAMEWORK"] == "pytorch"
    staged = L.stage_source(tmp_path / "code", image.installs_te(old), old.framework_version)
    # the 2.9 image is built on CUDA 13: the job installs TE's core for CUDA 13
    assert (staged / "requirements.txt").read_text().splitlines() == [
        *L.job_base_requirements(), f"transformer-engine[pytorch,core_cu13]=={pins()['transformer-engine']}"]
    assert image.job_requirements(True, "2.8") == [f"transformer-engine[pytorch,core_cu12]=={pins()['transformer-engine']}"]
    assert image.job_requirements(True, None, "example.com/mine:1") == [
        f"transformer-engine[pytorch]=={pins()['transformer-engine']}"]
    assert (staged / "fp8lab" / "constraints-gpu.txt").is_file()  # the pins travel with the package
    # TE's debug API, pinned like TE: --fp8-stats-source auto can read the job's FP8 health through it
    assert f"nvdlfw-inspect=={pins()['nvdlfw-inspect']}" in (staged / "requirements.txt").read_text().splitlines()
    # the start-up estimate follows: the TE build's time on top, nothing else differs
    for est in (L.Estimate(), as_plan(new).estimate):
        assert est.seconds(old) - est.seconds(new) == pytest.approx(image.TE_BUILD_S)
    assert as_plan(old).jobs[0].est_hours - as_plan(new).jobs[0].est_hours == pytest.approx(image.TE_BUILD_S / 3600)
    assert image.installs_te(_spec(install_te=True))  # asked for: installed anyway
    assert "asked (install_te=True)" in image.te_in_job(_spec(install_te=True))


def test_any_image_by_its_uri(tmp_path):
    uri = "123456789012.dkr.ecr.us-west-2.amazonaws.com/my-images/pytorch-te:2025.1"
    spec = _spec(image_uri=uri)
    assert image.image_te(spec.framework_version, uri) is None and image.installs_te(spec)
    assert "does not know" in image.te_in_job(spec) and uri in image.te_in_job(spec)
    req = L.build_requests(spec)[0]
    assert req["AlgorithmSpecification"]["TrainingImage"] == uri and req["Environment"]["NVTE_FRAMEWORK"] == "pytorch"
    assert L.job_name(spec) != L.job_name(_spec())  # another image, another job
    # a URI of an image the table lists: its TE is known, nothing is built
    known = _spec(image_uri="763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch:2.12-cu130-amzn2023-sagemaker")
    assert image.image_te(known.framework_version, known.image_uri) == "2.12.0" and not image.installs_te(known)
    for bad in ("not an image", "pytorch", ""):
        with pytest.raises(ValueError, match="JobSpec.image_uri=.* is invalid; allowed: None"):
            _spec(image_uri=bad)
    with pytest.raises(ValueError, match=r"JobSpec.framework_version='2.99' is invalid; allowed: 2.8, 2.9, .*image_uri"):
        _spec(framework_version="2.99")


def test_the_cli_takes_an_image_uri(capsys):
    from fp8lab.launch.cli import main

    uri = "123456789012.dkr.ecr.us-east-1.amazonaws.com/mine:1"
    assert main(["plan", "--models", "llama-1b", "--precisions", "fp8", "--instance-counts", "1",
                 "--image-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "mine:1 ships a TE this table does not know; the job installs transformer-engine" in out
    assert "123456789012" not in out  # the account in a given URI is masked, as in every printout


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
