"""--fp8-all-gather under two gloo ranks (issue 32): the plan decides it once per run, records why in
config.json, and refuses ``on`` with the reason and the allowed values before any step where the
backend has no FP8 all-gather (the CPU's emulated FP8 here; TE on a GPU); and torchao's float8 all-gather
itself, as fp8lab converts for it, gathers FP8 weights under FSDP2 across two gloo ranks (torch's CPU
``_scaled_mm`` runs torchao's float8 GEMMs: slow, but the same wiring the GPU runs)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab.core.paths import REPO_ROOT
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


# scripts/setup.sh installs torchao here on a CPU machine, off the venv's path (see there); a GPU venv has it installed
CPU_TORCHAO = Path(sys.prefix) / "cpu-tests" / "torchao"


def test_torchao_fp8_all_gather_across_two_gloo_ranks_gathers_fp8_weights():
    import importlib.util

    if not (CPU_TORCHAO / "torchao").is_dir() and importlib.util.find_spec("torchao") is None:
        pytest.skip("needs torchao (bash scripts/setup.sh puts it in .venv/cpu-tests/torchao on a CPU machine)")
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    from fp8_all_gather_check import problems

    path = [str(REPO_ROOT), str(CPU_TORCHAO) if CPU_TORCHAO.is_dir() else None, ENV.get("PYTHONPATH")]
    def check():
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                            str(REPO_ROOT / "benchmarks" / "fp8_all_gather_check.py"), "--device", "cpu"],
                           capture_output=True, text=True, timeout=240,
                           env={**ENV, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, path))})
        return p, p.stdout + p.stderr

    p, out = check()
    if p.returncode != 0 and "terminate called without an active exception" in out:
        # a gloo rank's C++ abort, seen twice in ~20 CI runs (sessions 20 and 22; benchmarks/logs/session22/ci-run.md),
        # not yet understood: one more run, which must pass in full
        p, out = check()
    assert p.returncode == 0 and "fp8_all_gather_check: " in out, out[-3000:]
    res = json.loads(out.split("fp8_all_gather_check: ", 1)[1].splitlines()[0])
    assert res["world"] == 2 and res["problems"] == problems(res) == []
    fp8, bf16 = res["fp8_all_gather"], res["bf16_all_gather"]
    assert fp8["gathered_dtypes"] == ["torch.bfloat16", "torch.float8_e4m3fn"]  # FP8 linears; norms stay bf16
    assert bf16["gathered_dtypes"] == ["torch.bfloat16"] and any("Float8" in t for t in fp8["weight_types"])
    assert 0 < fp8["gathered_bytes"] < 0.75 * bf16["gathered_bytes"]
