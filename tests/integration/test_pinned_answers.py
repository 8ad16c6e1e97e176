"""Every answer unchanged (issue 47): the numbers `fp8lab launch plan`, the scaling model's calibration and the
`Answer` gave before the results index changed how the committed runs are read, pinned in
``pinned_answers.json`` (written by the code of that time, reading every result file), compared
exactly. A deliberate change of an answer (new runs, a new rule) rewrites that file in the same commit,
and says why; a speed-up never does. E.g. llama-7b, 24B tokens on one P5: $7,391 (BF16) -> $5,252 (FP8)."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from fp8lab.launch.cli import main as launch_main
from fp8lab.analysis.scaling import committed_calibration
from committed_answer import committed_answer

PINNED = json.loads((Path(__file__).with_name("pinned_answers.json")).read_text(encoding="utf-8"))
_answer = committed_answer  # read once per test process (tests/helpers/committed_answer.py)


def _same(got, want, where):
    if isinstance(want, float):
        assert got == pytest.approx(want, rel=1e-12, abs=0), where
    else:
        assert got == want, where


def test_the_example_of_the_issue():
    plan = PINNED["plans"]["llama-7b-6-counts"]["stdout"]  # the README's row is P5's GPU's now: the plan keeps it
    assert "7,391" in plan and "5,252" in plan
    got = _answer().row("llama-7b", priced=True)  # the README's row is P5's GPU's, whose memory-mode runs price nothing
    assert (round(got["cost_bf16"]), round(got["cost_fp8"])) == (7391, 5252)


def test_answer_numbers_unchanged():
    got = _answer().numbers()
    assert sorted(got) == sorted(PINNED["numbers"])
    for model, want in PINNED["numbers"].items():
        assert sorted(got[model]) == sorted(want), model
        for key, value in want.items():
            _same(got[model][key], value, (model, key))


def test_verdict_unchanged():
    assert _answer().verdict() == PINNED["verdict"]


def test_calibration_unchanged():
    cal, want = committed_calibration(), PINNED["calibration"]
    for key in ("link_efficiency", "overlap", "overhead_ms"):
        _same(getattr(cal, key), want[key], key)
    assert cal.describe() == want["describe"]


@pytest.mark.parametrize("name", sorted(PINNED["plans"]))
def test_launch_plan_unchanged(name):
    plan = PINNED["plans"][name]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert launch_main(plan["argv"]) == 0
    assert buf.getvalue() == plan["stdout"]


def pin() -> dict:
    """The answers as the code gives them now: what ``pinned_answers.json`` holds."""
    cal = committed_calibration()
    plans = {}
    for name, plan in PINNED["plans"].items():
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            launch_main(plan["argv"])
        plans[name] = {"argv": plan["argv"], "stdout": buf.getvalue()}
    return {"calibration": {"describe": cal.describe(), **{k: getattr(cal, k) for k in ("link_efficiency", "overlap",
                                                                                         "overhead_ms")}},
            "numbers": _answer().numbers(), "plans": plans, "verdict": _answer().verdict()}


if __name__ == "__main__":  # a deliberate change of the answers (new runs): `python tests/integration/test_pinned_answers.py`
    Path(__file__).with_name("pinned_answers.json").write_text(json.dumps(pin(), indent=1, sort_keys=True) + "\n",
                                                               encoding="utf-8")
