"""--fp8-all-gather under two gloo ranks (issue 32): the plan decides it once per run, records why in
config.json, and refuses ``on`` with the reason and the allowed values before any step where the
backend has no FP8 all-gather (the CPU's emulated FP8 here; TE on a GPU)."""
from __future__ import annotations

import json
import subprocess

import pytest

from test_train_processes import ENV, common, run, torchrun

pytestmark = pytest.mark.slow


def test_fp8_all_gather_is_a_plan_decision_under_fsdp2(prepared, tmp_path):
    base = ["--precision", "fp8", "--backend", "emulated", "--parallel", "fsdp", "--micro-batch-size", "1",
            "--grad-accum", "2"]
    auto = tmp_path / "auto"
    run(torchrun(common(prepared, auto, 2, *base)))
    plan = json.loads((auto / "config.json").read_text())["plan"]
    assert plan["fp8_all_gather"] is False
    assert plan["reasons"]["fp8_all_gather"].startswith("auto: off (needs --backend torchao")
    on = tmp_path / "on"
    p = subprocess.run(torchrun(common(prepared, on, 2, *base, "--fp8-all-gather", "on")), env=ENV,
                       capture_output=True, text=True, timeout=240)
    assert p.returncode != 0
    assert "--fp8-all-gather on needs --backend torchao" in p.stderr and "allowed here: auto | off" in p.stderr
    assert not (on / "metrics.jsonl").exists()  # refused before any step
