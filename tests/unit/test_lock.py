"""requirements-cpu.lock, the CPU / CI stack with every package pinned (scripts/lock.sh makes it, scripts/setup.sh
installs with it as pip constraints): it covers what pyproject.toml and requirements.txt ask for, pins no torch and
no CUDA package (set-up installs the CPU torch its header names), agrees with fp8lab/constraints-gpu.txt where the
two pin the same package, and leaves out the SageMaker SDK parts fp8lab never imports."""
from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from fp8lab.core.paths import REPO_ROOT
from fp8lab.core.pins import pins

SETUP = REPO_ROOT / "scripts" / "setup.sh"
LOCK = REPO_ROOT / re.search(r"^LOCK=(\S+)$", SETUP.read_text(), re.M).group(1)
EXTRAS = ("dev", "aws", "notebooks", "tensorboard", "mlflow")  # what set-up installs (scripts/setup.sh's EXTRAS_ARGS)


def _lock_lines() -> list[tuple[str, str, str | None]]:
    """(canonical name, version, marker or None) for every pin of the lock."""
    out = []
    for line in LOCK.read_text().splitlines():
        if not line or line.startswith(("#", " ")):
            continue
        spec, _, marker = line.partition(";")
        name, version = spec.strip().split("==")
        out.append((canonicalize_name(name), version, marker.strip() or None))
    return out


def _lock_here() -> dict[str, str]:
    """The lock's pins that apply to this interpreter and platform."""
    here = {}
    for name, version, marker in _lock_lines():
        if marker is None or Marker(marker).evaluate():
            assert name not in here, f"{name} pinned twice for this platform"
            here[name] = version
    return here


def _header(field: str) -> str:
    return re.search(rf"^# {field}: (.+)$", LOCK.read_text(), re.M).group(1).strip()


def _wanted() -> list[Requirement]:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in EXTRAS:
        reqs += project["optional-dependencies"][extra]
    reqs += [l.split("#")[0].strip() for l in (REPO_ROOT / "requirements.txt").read_text().splitlines()]
    return [Requirement(r) for r in reqs if r]


def test_setup_installs_with_the_lock_and_the_extras_it_was_made_for():
    text = SETUP.read_text()
    assert '-e ".[dev,aws,notebooks,tensorboard,mlflow]"' in text and f"EXTRAS=({' '.join(EXTRAS)})" in (REPO_ROOT / "scripts" / "lock.sh").read_text()
    assert f"LOCK={LOCK.name}" in (REPO_ROOT / "scripts" / "lock.sh").read_text()


def test_every_requirement_is_pinned_by_the_lock_within_its_range():
    here = _lock_here()
    cpu_torch = Requirement(_header("cpu-torch"))
    for req in _wanted():
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        if name == "torch":  # installed first by set-up, from the header's spec
            assert req.specifier.contains(str(next(iter(cpu_torch.specifier)).version)), (req, cpu_torch)
            continue
        assert name in here, f"{req} is not in {LOCK.name}: run `bash scripts/lock.sh`"
        assert req.specifier.contains(here[name], prereleases=True), f"{LOCK.name} pins {name}=={here[name]}, outside {req}"
    assert "flask" in here  # moto[server]'s own requirement: extras are resolved, not dropped


def test_no_torch_and_no_cuda_package_in_the_lock():
    names = {n for n, _, _ in _lock_lines()}
    assert "torch" not in names
    cuda = sorted(n for n in names if n.startswith(("nvidia-", "cuda-")) or n == "triton")
    assert not cuda, f"CUDA packages in the CPU lock: {cuda}"
    # torch's own dependencies are pinned (resolved against the CPU build's metadata)
    assert {"sympy", "networkx", "filelock", "jinja2", "fsspec"} <= names
    assert _header("cpu-torch").startswith("torch==")
    assert sys.version_info[:2] >= tuple(int(x) for x in _header("python").lstrip(">=").split("."))


def test_lock_and_gpu_constraints_agree_where_they_overlap():
    gpu = {canonicalize_name(k): v for k, v in pins().items()}
    lock = {}
    for name, version, _ in _lock_lines():
        lock.setdefault(name, set()).add(version)
    for name in sorted(set(gpu) & set(lock)):
        assert lock[name] == {gpu[name]}, f"{name}: {LOCK.name} {sorted(lock[name])}, constraints-gpu.txt {gpu[name]}"
    # torch differs on purpose (the CPU build set-up installs first; it is not in the lock): GPU torch's own
    # dependencies are the GPU branch's to resolve
    assert "torch" not in lock and Version(_header("cpu-torch").split("==")[1]).release[:2] >= (2, 6)


def test_only_the_sagemaker_sdk_parts_fp8lab_imports():
    names = {n for n, _, _ in _lock_lines()}
    assert {"sagemaker-core", "sagemaker-train", "boto3"} <= names
    # the meta-package and the serving / pipeline parts (which brought s3fs 0.4.2 by backtracking) stay out
    left_out = {"sagemaker", "sagemaker-serve", "sagemaker-mlops", "s3fs", "pyiceberg"}
    assert not names & left_out, names & left_out


def test_a_set_up_venv_holds_exactly_the_lock_s_versions():
    """In a venv made by scripts/setup.sh (its stamp is there), every installed package the lock pins is at its pin."""
    if not (Path(sys.prefix) / ".fp8lab-setup").is_file():
        pytest.skip("this venv was not made by scripts/setup.sh (no .fp8lab-setup stamp)")
    from importlib.metadata import distributions

    here = _lock_here()
    installed = {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}
    off = {n: (installed[n], v) for n, v in here.items() if n in installed and installed[n] != v}
    assert not off, f"installed (lock): {off}"
    missing = sorted(n for n in here if n not in installed)
    assert not missing, f"pinned but not installed: {missing}"
