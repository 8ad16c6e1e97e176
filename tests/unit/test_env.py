"""`fp8lab env` must answer on any machine and explain what is not usable."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from fp8lab import env


def test_report_matches_this_machine():
    rep = env.report()
    assert rep.torch == torch.__version__
    assert rep.gpu_count == torch.cuda.device_count()
    assert "emulated" in rep.backends and rep.backends["emulated"] is None
    if not torch.cuda.is_available():
        assert rep.gpu_name is None and not rep.fp8_tensor_cores
        assert "no CUDA GPU" in rep.fp8_reason
        # TE and torchao need CUDA here: they must be reported as unusable, with a reason
        assert rep.backends["te"] and rep.backends["torchao"]
    assert "emulated" in rep.usable_backends()


def test_cli_json_and_text():
    out = subprocess.run([sys.executable, "-m", "fp8lab", "env", "--json"], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout)
    assert data["torch"] == torch.__version__ and set(data["backends"]) >= {"te", "torchao", "emulated"}
    text = subprocess.run([sys.executable, "-m", "fp8lab", "env"], capture_output=True, text=True, check=True).stdout
    assert "FP8 tensor cores" in text and "Transformer Engine" in text


def test_cli_unknown_command_lists_commands():
    out = subprocess.run([sys.executable, "-m", "fp8lab", "bogus"], capture_output=True, text=True)
    assert out.returncode == 2 and "env" in out.stderr and "train" in out.stderr


# ---- backend 'auto' on a GPU machine without Transformer Engine: refused, never emulated -------

def _gpu_without_te(monkeypatch, fp8_problem=None, torchao=None):
    """A GPU machine as Machine.detect sees it (H100, or a Tesla T4 where ``fp8_problem``), without TE."""
    import types

    import fp8lab.fp8.backends as backends

    reasons = {"emulated": None, "te": "Transformer Engine is not installed (...)", "torchao": torchao or "not installed"}
    monkeypatch.setattr(backends, "available_backends", lambda: dict(reasons))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(backends, "fp8_gpu_problem", lambda: fp8_problem)
    gpu = ("Tesla T4", 7, 5) if fp8_problem else ("NVIDIA H100 80GB HBM3", 9, 0)
    props = types.SimpleNamespace(name=gpu[0], major=gpu[1], minor=gpu[2], total_memory=16 * 2**30)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: props)


def test_auto_on_an_fp8_gpu_without_te_is_refused_with_the_install_command(monkeypatch):
    from fp8lab.fp8.convert import BackendUnavailableError, pick_backend
    from fp8lab.core.pins import INSTALL_COMMAND

    _gpu_without_te(monkeypatch)
    with pytest.raises(BackendUnavailableError) as err:
        pick_backend("auto")
    msg = str(err.value)
    assert INSTALL_COMMAND in msg and "Transformer Engine is not installed" in msg and "'emulated'" in msg
    assert pick_backend("emulated") == "emulated"  # explicit emulated still runs on a GPU machine


def test_auto_names_torchao_when_it_is_the_usable_hardware_backend(monkeypatch):
    from fp8lab.fp8.convert import BackendUnavailableError, pick_backend

    _gpu_without_te(monkeypatch, torchao=None)
    import fp8lab.fp8.backends as backends
    monkeypatch.setattr(backends, "available_backends", lambda: {"emulated": None, "te": "no TE", "torchao": None})
    with pytest.raises(BackendUnavailableError, match="'torchao' \\(usable here\\) or 'emulated'"):
        pick_backend("auto")


def test_auto_below_cc_8_9_says_emulated_only_by_name(monkeypatch):
    from fp8lab.fp8.convert import BackendUnavailableError, pick_backend

    _gpu_without_te(monkeypatch, fp8_problem="GPU Tesla T4 has compute capability 7.5; FP8 needs >= 8.9")
    with pytest.raises(BackendUnavailableError, match="Tesla T4 .*only emulated FP8 runs here: pass backend 'emulated'"):
        pick_backend("auto")


def test_pick_backend_follows_the_trainers_auto_rule(monkeypatch):
    """convert.pick_backend('auto') is fp8lab.fp8.backends.auto_fp8_backend (the plan's rule) on this process's machine, not a copy of it."""
    import fp8lab.fp8.backends as rules  # the auto rule's home, read by the plan and by pick_backend
    from fp8lab.fp8.convert import pick_backend

    seen = []
    monkeypatch.setattr(rules, "auto_fp8_backend", lambda machine: (seen.append(machine) or "torchao", "stand-in"))
    assert pick_backend("auto") == "torchao" and seen[0].device == ("cuda" if torch.cuda.is_available() else "cpu")


def test_the_trainer_refuses_auto_fp8_on_a_gpu_without_te_before_any_compute():
    """The trainer's plan (fp8lab.plan.runplan.plan_run, torch-free: what Machine.detect saw) refuses 'auto' FP8 on an
    FP8 GPU without TE with the install command, and on a GPU below cc 8.9 says emulated only, by name."""
    from fp8lab.core.hardware import Machine
    from fp8lab.plan.runplan import plan_run
    from fp8lab.train.entry import TrainConfig

    no_te = (("te", "Transformer Engine is not installed (...)"), ("torchao", "not installed"))
    h100 = Machine("cuda", "NVIDIA H100 80GB HBM3", 79.2, fp8=True, unusable=no_te)
    with pytest.raises(ValueError, match="bash scripts/setup.sh"):
        plan_run(TrainConfig(precision="fp8", backend="auto"), h100)
    assert plan_run(TrainConfig(precision="fp8", backend="emulated"), h100).backend == "emulated"
    t4 = Machine("cuda", "Tesla T4", 15.0, fp8=False, unusable=no_te)
    with pytest.raises(ValueError, match="Tesla T4 has no FP8 tensor cores.*only emulated FP8 runs here"):
        plan_run(TrainConfig(precision="fp8", backend="auto"), t4)
    cpu = Machine("cpu", "cpu", 24.0, unusable=no_te)  # no GPU: auto is the emulator, as before
    assert plan_run(TrainConfig(precision="fp8", backend="auto"), cpu).backend == "emulated"


def test_env_reports_the_refusal_and_check_fails_on_an_fp8_gpu_without_te(monkeypatch):
    _gpu_without_te(monkeypatch)
    auto, refusal = env._auto_choice()
    assert auto is None and "bash scripts/setup.sh" in refusal
    base = dict(python="3.12", platform="Linux", torch="2.11.0", cuda="13.0", gpu_count=1, gpu_name="NVIDIA H100",
                compute_capability="9.0", fp8_tensor_cores=True, fp8_reason=None, transformer_engine=None,
                transformer_engine_error="not installed", torchao=None, torchao_error="not installed",
                transformers="5", backends={"emulated": None, "te": "not installed", "torchao": "not installed"},
                auto_backend=None, auto_refusal=refusal)
    ok, line = env.EnvReport(**base).check()
    assert not ok and "NVIDIA H100" in line
    assert "backend 'auto'       refused" in str(env.EnvReport(**base))
    ok, line = env.EnvReport(**{**base, "gpu_name": "Tesla T4", "compute_capability": "7.5",
                                 "fp8_tensor_cores": False}).check()
    assert ok and "emulated FP8 only" in line and "Tesla T4" in line
    ok, line = env.EnvReport(**{**base, "transformer_engine": "2.20.2", "auto_backend": "te",
                                 "backends": {"emulated": None, "te": None, "torchao": "x"}}).check()
    assert ok and "Transformer Engine 2.20.2 usable" in line


def test_env_check_on_this_cpu_machine_passes():
    out = subprocess.run([sys.executable, "-m", "fp8lab", "env", "--check"], capture_output=True, text=True)
    if not torch.cuda.is_available():
        assert out.returncode == 0 and "no CUDA GPU" in out.stdout


def test_env_says_who_reads_the_fp8_casts_by_the_plans_rule(monkeypatch):
    from fp8lab.fp8 import backends, stats as fp8stats, te_debug
    from fp8lab.plan import evidence

    rep = env.report()
    if rep.auto_backend == "emulated":  # this CPU machine: the emulator's own quantizers
        assert rep.fp8_stats_source == fp8stats.OWN and "emulated backend" in rep.fp8_stats_reason
        assert "FP8 health read by   fp8lab (emulated backend" in str(rep)
    monkeypatch.setattr(te_debug, "unavailable", lambda: None)  # this machine as Machine.detect would see it
    monkeypatch.setattr(backends, "installed_te", lambda: "2.20.2")
    monkeypatch.setattr(evidence, "load", lambda: evidence.Evidence(te_debug=True, te_debug_te="2.20.2"))
    assert env._fp8_stats_choice("te")[0] == fp8stats.TE_DEBUG
    monkeypatch.setattr(evidence, "load", lambda: evidence.Evidence())  # installed, but its GPU check not committed
    source, why = env._fp8_stats_choice("te")
    assert source == fp8stats.OWN and "check.json" in why
    monkeypatch.setattr(te_debug, "unavailable", lambda: "nvdlfw-inspect is not installed (pip install nvdlfw-inspect)")
    source, why = env._fp8_stats_choice("te")
    assert source == fp8stats.OWN and "nvdlfw-inspect is not installed" in why
    assert env._fp8_stats_choice(None) == (None, "no FP8 backend 'auto' runs here")
