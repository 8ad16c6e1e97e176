"""`fp8lab env` must answer on any machine and explain what is not usable."""
from __future__ import annotations

import json
import subprocess
import sys

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
