"""FP8 all-gather under FSDP2 on the GPU (issue 32; skipped without one): torchao's float8 all-gather,
as ``--fp8-all-gather on`` wires it, gathers FP8 weights (fewer bytes), hands the Float8Linear layers
FP8 weights, and computes the loss the bf16 all-gather computes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fp8lab.core.paths import REPO_ROOT

pytestmark = pytest.mark.gpu


def test_torchao_fp8_all_gather_on_a_one_rank_fsdp2_mesh():
    from fp8lab.fp8.backends import get_backend

    reason = get_backend("torchao").available()
    if reason:
        pytest.skip(f"torchao backend not usable: {reason}")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                        str(REPO_ROOT / "benchmarks" / "fp8_all_gather_check.py")], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1",  # keep the parent's path: TE and torchao may live there
                            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))})
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "fp8_all_gather_check: " in out, out[-3000:]
    res = json.loads(out.split("fp8_all_gather_check: ", 1)[1].splitlines()[0])
    bf16, fp8 = res["bf16_all_gather"], res["fp8_all_gather"]
    assert bf16["float8_linears"] == fp8["float8_linears"] > 0
    assert not any("Float8" in t for t in bf16["weight_types"])  # bf16 weights, cast inside each layer
    assert any("Float8" in t for t in fp8["weight_types"]), fp8  # the gathered weights arrive as FP8
    assert 0 < fp8["gathered_bytes"] < 0.75 * bf16["gathered_bytes"], res  # the linears' bytes halve
    assert fp8["loss"] == pytest.approx(bf16["loss"], rel=2e-2)  # the same tensorwise casts, before or after the gather
    assert res["problems"] == []  # the check's own rule (what check.json's "passed" records) agrees
