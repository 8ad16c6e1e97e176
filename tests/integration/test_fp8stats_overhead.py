"""benchmarks/fp8stats_overhead.sh / .py (issue 31): the cost of the FP8 health statistics, and the GPU check that
lets --fp8-stats-source auto pick TE's debug API. The script runs for real on this CPU (emulated backend, a tiny
model: no speed claim); the check's rules are fed runs as the GPU would write them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab.plan import fp8_stats as fp8stats
from fp8lab.core.paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import fp8stats_overhead as fo  # noqa: E402


@pytest.mark.slow
def test_the_script_compares_each_arm_with_the_off_run(tmp_path):
    env = {**os.environ, "MODEL": "llama-tiny", "SMOKE": "1", "VARIANT": "emulated-fp8-delayed", "STEPS": "16",
           "ARMS": "0 5:fp8lab", "STUDY": "sources", "EXTRA": "--seq-len 32 --micro-batch-size 2", "OUT": str(tmp_path),
           "PYTHON": sys.executable}
    subprocess.run(["bash", str(REPO_ROOT / "benchmarks" / "fp8stats_overhead.sh")], env=env, check=True,
                   capture_output=True, text=True, timeout=600)
    result = json.loads((tmp_path / "sources.json").read_text())
    assert result["off"]["every"] == 0 and result["off"]["sampled_steps"] == 0
    (on,) = result["on"]
    assert on["source"] == "fp8lab" and on["every"] == 5 and on["stats_steps"] == [5, 10, 15]  # the records came along
    assert on["stats_sources"] == ["fp8lab"] and on["sampled_steps"] == 1 and "overhead_pct" in on  # step 15 timed
    assert "--fp8-stats-source fp8lab" in on["command"]


def _arm(**kw):
    base = {"run": "llama-1b-default-fp8-stats10-te-debug", "every": 10, "source": "te-debug", "command": "python -m ...",
            "date": "2026-12-02T00:00:00Z", "grad_accum": 4, "stats_steps": [10, 20, 30], "stats_sources": ["te-debug"],
            "stats_rows": {"activation": 88, "weight": 88, "gradient": 88}, "median_step_time_s": 1.27, "sample_cost_s": 0.3}
    return {**base, **kw}


def test_the_te_debug_check_passes_only_on_complete_records_within_the_cost_goal():
    every = fp8stats.default_every("te", 4)
    ok = fo.te_debug_check([_arm()], 30)
    assert ok["passed"] and ok["problems"] == [] and ok["default_every"] == every
    assert ok["cost_at_default_pct"] == pytest.approx(100 * 0.3 / (every * 1.27))
    assert not fo.te_debug_check([_arm(stats_steps=[10, 20])], 30)["passed"]  # a sampled step without its record
    assert not fo.te_debug_check([_arm(stats_sources=["fp8lab"])], 30)["passed"]  # read by the hooks instead
    assert not fo.te_debug_check([_arm(stats_rows={"activation": 88, "weight": 88, "gradient": 44})], 30)["passed"]
    costly = fo.te_debug_check([_arm(sample_cost_s=every * 1.27 * (fp8stats.COST_GOAL_PCT + 0.5) / 100)], 30)
    assert not costly["passed"] and "cost at the default interval" in costly["problems"][0]
    assert fo.te_debug_check([_arm(source="fp8lab")], 30) == {"passed": False, "problems": ["no --fp8-stats-source te-debug run"]}
