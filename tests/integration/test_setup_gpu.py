"""scripts/setup.sh's decisions on NVIDIA machines, run for real on this CPU machine: a fake
``nvidia-smi`` on PATH reports the GPU (H100, A100, T4), and the venv's ``python`` is a stub that
records every call (pip, ipykernel, fp8lab env) and answers the script's probes (Python, torch and
CUDA versions), so nothing is downloaded or installed. The real GPU branch runs on the H200 in
benchmarks/gpu_setup_check.sh.
"""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from fp8lab.core.paths import REPO_ROOT
from fp8lab.core.pins import pins

SETUP = REPO_ROOT / "scripts" / "setup.sh"
GPUS = {"H100": "NVIDIA H100 80GB HBM3, 9.0", "A100": "NVIDIA A100-SXM4-80GB, 8.0", "T4": "Tesla T4, 7.5"}

# The venv's python (and PYTHON): records its arguments, one call a line; answers the probe from
# $STATE/probe; a pip install of torch== switches the probe to $STATE/probe_after; a pip install of
# nvcc puts an nvcc where pip's NVIDIA package would; `python -m venv DIR` makes DIR/bin/python a copy.
STUB = r"""#!/usr/bin/env bash
printf '%s\n' "$*" >>"$STATE/calls"
case "$1" in
  --version) echo "Python 3.12.3" ;;
  -m)
    if [ "$2" = venv ]; then d="${@: -1}"; mkdir -p "$d/bin"; cp "$0" "$d/bin/python"; : >"$d/bin/activate"; fi
    if [ "$2" = ipykernel ]; then  # where ipykernel puts the kernel: in the venv, in the user's folder
      [ "$4" = --sys-prefix ] && k="$(dirname "$0")/../share/jupyter/kernels/fp8lab" || k="$HOME/.local/share/jupyter/kernels/fp8lab"
      mkdir -p "$k"; : >"$k/kernel.json"; fi
    if [ "$2" = pip ] && [[ " $* " == *" torch=="* ]] && [ -f "$STATE/probe_after" ]; then cp "$STATE/probe_after" "$STATE/probe"; fi
    if [ "$2" = pip ] && [[ "$*" == *nvidia-cuda-nvcc* ]]; then mkdir -p "$STATE/site/nvidia/cuda_nvcc/bin"; : >"$STATE/site/nvidia/cuda_nvcc/bin/nvcc"; chmod +x "$STATE/site/nvidia/cuda_nvcc/bin/nvcc"; fi
    exit 0 ;;
  -c)
    case "$2" in
      *fp8lab-probe*) cat "$STATE/probe" ;;
      *'version_info[:2]'*) cut -d' ' -f1 "$STATE/probe" ;;
      *transformer_engine*) [ -f "$STATE/te" ] && cat "$STATE/te" || exit 1 ;;
      *sysconfig*) echo "$STATE/site" ;;
      *getsitepackages*) echo "$STATE/system-site" ;;
      *nvidia.cudnn*) exit 1 ;;
      *'print("fp8lab"'*) echo "fp8lab 0.1.0 torch stub" ;;
      *'import torch'*) [ "$(cut -d' ' -f2 "$STATE/probe")" != - ] || exit 1 ;;  # torch imports where the probe has one
    esac ;;
esac
exit 0
"""


def _setup(tmp: Path, gpu: str | None, probe: str, *, venv: bool = True, probe_after: str | None = None,
           te: str | None = None, kit: bool = False, wheels: bool = False, extra_env: dict | None = None):
    """Run setup.sh with the fakes; (exit code, output, recorded calls as argument lists)."""
    state, fakebin = tmp / "state", tmp / "bin"
    for d in (state, fakebin, state / "site"):
        d.mkdir(parents=True, exist_ok=True)
    stub = fakebin / "python-stub"
    stub.write_text(STUB)
    stub.chmod(0o755)
    (state / "probe").write_text(probe + "\n")
    if probe_after:
        (state / "probe_after").write_text(probe_after + "\n")
    if te:
        (state / "te").write_text(te + "\n")
    if gpu:
        smi = fakebin / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\necho '{GPUS[gpu]}'\n")
        smi.chmod(0o755)
    venv_dir = tmp / "venv"
    if venv:
        (venv_dir / "bin").mkdir(parents=True)
        (venv_dir / "bin" / "python").write_text(STUB)
        (venv_dir / "bin" / "python").chmod(0o755)
        (venv_dir / "bin" / "activate").write_text("")
    kit_dir = tmp / "kit"
    if kit:
        (kit_dir / "payload" / "torchao").mkdir(parents=True)
        te_pin = pins()["transformer-engine"]
        (kit_dir / "payload" / f"transformer_engine_torch-{te_pin}-cp312-cp312-linux_x86_64.whl").write_text("")
        (kit_dir / "payload" / "torchao" / f"torchao-{pins()['torchao']}-cp310-abi3-manylinux_2_28_x86_64.whl").write_text("")
        (kit_dir / "install_te.sh").write_text('printf "install_te %s\\n" "$*" >>"$STATE/calls"\n')
    env = {"PATH": f"{fakebin}:/usr/bin:/bin", "HOME": str(tmp), "STATE": str(state), "TMPDIR": str(tmp),
           "PYTHON": str(stub), "FP8LAB_VENV": str(venv_dir), "FP8LAB_TE_KIT": str(kit_dir), **(extra_env or {})}
    if wheels:
        env["FP8LAB_WHEELS"] = str(tmp / "wheels")
    out = subprocess.run(["bash", str(SETUP)], env=env, capture_output=True, text=True, timeout=120)
    calls = [shlex.split(line) for line in (state / "calls").read_text().splitlines()] if (state / "calls").exists() else []
    return out.returncode, out.stdout + out.stderr, calls


def _pip_installs(calls):
    return [c for c in calls if c[:2] == ["-m", "pip"] and "install" in c]


def _te_builds(calls):
    return [c for c in _pip_installs(calls) if any(a.startswith("transformer_engine[") for a in c)]


def test_h100_without_toolkit_builds_the_pinned_te_with_pips_nvcc(tmp_path):
    rc, out, calls = _setup(tmp_path, "H100", "3.12 2.11.0+cu130 13.0", venv=False,
                            extra_env={"CUDA_HOME": str(tmp_path / "no-toolkit")})
    assert rc == 0, out
    p = pins()
    # the system torch is the pinned release: reused through a venv that sees the system packages
    assert ["-m", "venv", "--system-site-packages", str(tmp_path / "venv")] in calls
    # where that Python is itself a venv, its packages are reached by a .pth in the new venv
    pth = tmp_path / "state" / "site" / "fp8lab-system-packages.pth"
    assert pth.read_text().splitlines() == [str(tmp_path / "state" / "system-site")]
    assert not [c for c in _pip_installs(calls) if any(a.startswith("torch==") for a in c)]
    assert [c for c in _pip_installs(calls) if "nvidia-cuda-nvcc==13.0.*" in c], out  # no nvcc on PATH
    (build,) = _te_builds(calls)
    assert "--no-build-isolation" in build and "-c" in build
    assert build[build.index("-c") + 1] == "fp8lab/constraints-gpu.txt"
    assert f"transformer_engine[pytorch,core_cu13]=={p['transformer-engine']}" in build
    assert f"torchao=={p['torchao']}" in build
    # TE's debug API, which reads the FP8 health statistics (--fp8-stats-source auto: te-debug), pinned
    assert [c for c in _pip_installs(calls) if f"nvdlfw-inspect=={p['nvdlfw-inspect']}" in c], out
    fp8lab_install = next(c for c in _pip_installs(calls) if "-e" in c)
    assert "fp8lab/constraints-gpu.txt" in fp8lab_install  # fp8lab's own deps under the same pins
    assert ["-m", "fp8lab", "env", "--check"] in calls  # ends by checking TE and FP8
    assert "NVIDIA H100" in out and "compute capability 9.0" in out


def test_a100_gets_emulated_only_by_name_and_no_te(tmp_path):
    rc, out, calls = _setup(tmp_path, "A100", "3.12 2.11.0+cu128 12.8")
    assert rc == 0, out
    assert not _te_builds(calls) and not [c for c in calls if c and c[0] == "install_te"]
    assert not [c for c in _pip_installs(calls) if any(a.startswith("nvdlfw-inspect") for a in c)]  # no TE to debug
    assert "NVIDIA A100-SXM4-80GB has compute capability 8.0 < 8.9" in out
    assert "emulated" in out and "--backend emulated" in out


def test_t4_with_a_cpu_torch_in_the_venv_gets_the_pinned_cuda_torch(tmp_path):
    rc, out, calls = _setup(tmp_path, "T4", "3.11 2.13.0+cpu -", probe_after="3.11 2.11.0+cu128 12.8")
    assert rc == 0, out
    (torch_install,) = [c for c in _pip_installs(calls) if any(a.startswith("torch==") for a in c)]
    assert f"torch=={pins()['torch']}" in torch_install
    assert not _te_builds(calls) and "Tesla T4 has compute capability 7.5 < 8.9" in out


def test_h100_with_cuda12_and_a_toolkit_builds_core_cu12_without_pips_nvcc(tmp_path):
    cuda_home = tmp_path / "cuda"
    (cuda_home / "bin").mkdir(parents=True)
    (cuda_home / "bin" / "nvcc").write_text("")
    (cuda_home / "bin" / "nvcc").chmod(0o755)
    rc, out, calls = _setup(tmp_path, "H100", "3.12 2.11.0+cu128 12.8", extra_env={"CUDA_HOME": str(cuda_home)})
    assert rc == 0, out
    assert not [c for c in _pip_installs(calls) if any("nvcc" in a for a in c)]
    (build,) = _te_builds(calls)
    assert f"transformer_engine[pytorch,core_cu12]=={pins()['transformer-engine']}" in build


def test_h200_offline_with_the_kit_reuses_its_wheels_and_never_reaches_an_index(tmp_path):
    rc, out, calls = _setup(tmp_path, "H100", "3.12 2.11.0+cu130 13.0", kit=True, wheels=True)
    assert rc == 0, out
    assert ["install_te", str(tmp_path / "state" / "site")] in calls  # the kit's prebuilt TE, into the venv
    assert not _te_builds(calls)
    kit_torchao = [c for c in _pip_installs(calls) if any("torchao-" in a for a in c)]
    assert kit_torchao and "--no-index" in kit_torchao[0]
    for c in _pip_installs(calls):  # offline: every pip install reads the local wheel folder only
        assert "--no-index" in c, c
    assert all(c[c.index("--find-links") + 1] == str(tmp_path / "wheels")
               for c in _pip_installs(calls) if "--find-links" in c)


def test_te_already_at_the_pin_is_left_alone(tmp_path):
    rc, out, calls = _setup(tmp_path, "H100", "3.12 2.11.0+cu130 13.0", te=pins()["transformer-engine"])
    assert rc == 0, out
    assert not _te_builds(calls) and "already installed" in out


def test_no_gpu_takes_the_cpu_branch_unchanged(tmp_path):
    rc, out, calls = _setup(tmp_path, None, "3.11 2.13.0+cpu -")
    assert rc == 0, out
    installs = _pip_installs(calls)
    assert installs and all("fp8lab/constraints-gpu.txt" not in c for c in installs)
    assert ["-r", "requirements.txt"] == installs[-1][installs[-1].index("-r"):installs[-1].index("-r") + 2]
    assert not _te_builds(calls) and ["-m", "fp8lab", "env", "--check"] not in calls


def test_no_gpu_installs_torch_and_fp8lab_under_the_lock_then_checks(tmp_path):
    rc, out, calls = _setup(tmp_path, None, "3.11 - -", venv=False, probe_after="3.11 2.13.0+cpu -")
    assert rc == 0, out
    lock = (REPO_ROOT / "requirements-cpu.lock").read_text()
    cpu_torch = next(l.split(": ")[1] for l in lock.splitlines() if l.startswith("# cpu-torch: "))
    installs = [c for c in _pip_installs(calls) if "--target" not in c]  # torchao's off-path copy aside
    assert [c[-1] for c in installs[:1]] == [cpu_torch]  # the lock's CPU torch, first
    for c in installs:  # torch and fp8lab both under the lock's pins, without byte-compiling ~250 packages
        assert c[c.index("-c") + 1] == "requirements-cpu.lock" and "--no-compile" in c, c
    assert ["-m", "pip", "--disable-pip-version-check", "check"] in calls
    assert "pinned by requirements-cpu.lock" in out


def test_a_second_run_finds_the_stamp_and_installs_nothing(tmp_path):
    rc, out, calls = _setup(tmp_path, None, "3.11 2.13.0+cpu -")
    assert rc == 0 and _pip_installs(calls), out
    stamp = (tmp_path / "venv" / ".fp8lab-setup").read_text().splitlines()
    assert stamp[0].startswith("fp8lab ") and stamp[1] == "fp8lab 0.1.0 torch stub"
    (tmp_path / "state" / "calls").unlink()
    rc, out, calls = _setup(tmp_path, None, "3.11 2.13.0+cpu -", venv=False)
    assert rc == 0, out
    assert "is up to date" in out and "ready: fp8lab 0.1.0 torch stub" in out
    assert not _pip_installs(calls) and not [c for c in calls if c[:2] == ["-m", "ipykernel"]]
    # another torch (or a changed lock, pyproject, fp8lab version) is another key: a full run
    rc, out, calls = _setup(tmp_path, None, "3.11 2.13.0+cpu -", venv=False,
                            extra_env={"FP8LAB_TORCH_SPEC": "torch==2.12.0"})
    assert rc == 0 and "is up to date" not in out, out
    fp8lab_install = next(c for c in _pip_installs(calls) if "-e" in c)
    assert "-c" not in fp8lab_install  # the lock's pins are for its own torch: resolved afresh
    assert "without requirements-cpu.lock" in out


def test_the_kernel_fp8lab_is_registered_for_the_venv_and_for_studio(tmp_path):
    rc, out, calls = _setup(tmp_path, None, "3.11 2.13.0+cpu -")
    assert rc == 0, out
    kernels = [c for c in calls if c[:3] == ["-m", "ipykernel", "install"]]
    assert {c[3] for c in kernels} == {"--sys-prefix", "--user"}
    assert all(c[c.index("--name") + 1] == "fp8lab" for c in kernels)


@pytest.mark.skipif(os.name != "posix", reason="bash script")
def test_setup_is_valid_bash():
    assert subprocess.run(["bash", "-n", str(SETUP)]).returncode == 0


def test_readme_setup_and_env_give_the_same_install_command_and_pins():
    from fp8lab.core.pins import CONSTRAINTS, INSTALL_COMMAND, install_hint

    readme = (REPO_ROOT / "README.md").read_text()
    assert f"`{INSTALL_COMMAND}`" in readme and "fp8lab/constraints-gpu.txt" in readme
    assert f"```bash\n{INSTALL_COMMAND}\n```" in (REPO_ROOT / "docs" / "setup.md").read_text()
    assert f"PINS={CONSTRAINTS.relative_to(REPO_ROOT).as_posix()}" in SETUP.read_text()
    assert INSTALL_COMMAND in install_hint() and pins()["transformer-engine"] in install_hint()
    for name in ("torch", "transformer-engine", "torchao"):  # the README states the pinned versions
        assert pins()[name] in readme


def test_no_gpu_puts_torchao_off_the_venv_s_path_for_the_cpu_all_gather_test(tmp_path):
    rc, out, calls = _setup(tmp_path, None, "3.11 2.13.0+cpu -")
    assert rc == 0, out
    tao = [c for c in _pip_installs(calls) if any(a.startswith("torchao==") for a in c)]
    assert len(tao) == 1 and "--no-deps" in tao[0] and f"torchao=={pins()['torchao']}" in tao[0]
    assert tao[0][tao[0].index("--target") + 1] == str(tmp_path / "venv" / "cpu-tests" / "torchao")
    assert "for the CPU test of its FSDP2 float8 all-gather" in out


def test_triton_for_the_cpu_kernel_test_only_where_asked_and_off_the_venv_s_path(tmp_path):
    """FP8LAB_CPU_TRITON=1 (.ci/run) adds triton and the numpy its interpreter needs to the venv's cpu-tests/;
    a plain set-up (a workshop's) does not download its ~640 MB."""
    def triton_installs(calls):
        return [c for c in _pip_installs(calls) if any(a.startswith("triton==") for a in c)]

    rc, out, calls = _setup(tmp_path / "plain", None, "3.11 2.13.0+cpu -")
    assert rc == 0, out
    assert triton_installs(calls) == [] and "Triton loss kernel" not in out
    rc, out, calls = _setup(tmp_path / "ci", None, "3.11 2.13.0+cpu -", extra_env={"FP8LAB_CPU_TRITON": "1"})
    assert rc == 0, out
    (tri,) = triton_installs(calls)
    assert "--no-deps" in tri and {"triton==3.6.0", "numpy==2.2.6"} <= set(tri)
    assert tri[tri.index("--target") + 1] == str(tmp_path / "ci" / "venv" / "cpu-tests" / "triton")
    assert "for the CPU test of fp8lab's Triton loss kernel" in out
