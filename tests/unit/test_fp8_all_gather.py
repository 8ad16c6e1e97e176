"""The FP8 all-gather decision: on for FP8 under FSDP2 on torchao, off (with why) elsewhere,
``on`` refused with the reason where it cannot run; convert_model refuses it for other backends."""
from __future__ import annotations

import pytest

from fp8lab.plan.config import TrainConfig
from fp8lab.fp8.convert import convert_model
from fp8lab.core.hardware import Machine
from fp8lab.model.models import build_model
from fp8lab.plan.evidence import Evidence
from fp8lab.plan.runplan import plan_run

P5 = Machine.planned("H100 80GB", 8, True)  # a P5 node's eight ranks, as a SageMaker job plans it


CHECKED = Evidence(fp8_all_gather=True)


def _plan(machine=P5, evidence=CHECKED, **kw):
    return plan_run(TrainConfig(model="llama-1b", precision="fp8", parallel="fsdp", **kw), machine, evidence)


def test_auto_is_on_for_fp8_under_fsdp2_on_torchao_and_off_with_the_reason_elsewhere():
    p = _plan(backend="torchao", recipe="current", evidence=Evidence())  # no GPU check committed: auto waits
    assert p.fp8_all_gather is False and "off until its GPU check is committed" in p.reasons["fp8_all_gather"]
    on = _plan(backend="torchao", recipe="current", fp8_all_gather="on", evidence=Evidence())
    assert on.fp8_all_gather is True and on.reasons["fp8_all_gather"] == "--fp8-all-gather on"
    p = _plan(backend="torchao", recipe="current")
    assert p.fp8_all_gather is True and p.decisions()["fp8_all_gather"] is True
    assert "half the bytes" in p.reasons["fp8_all_gather"]
    te = _plan(backend="te")
    assert te.fp8_all_gather is False and "needs --backend torchao" in te.reasons["fp8_all_gather"]
    one = _plan(Machine.planned("H100 80GB", 1, True), backend="torchao", recipe="current")
    assert one.fp8_all_gather is False and "several ranks" in one.reasons["fp8_all_gather"]
    bf16 = plan_run(TrainConfig(model="llama-1b", precision="bf16", parallel="fsdp", backend="torchao"), P5)
    assert bf16.fp8_all_gather is False and "--precision fp8" in bf16.reasons["fp8_all_gather"]
    off = _plan(backend="torchao", recipe="current", fp8_all_gather="off")
    assert off.fp8_all_gather is False and off.reasons["fp8_all_gather"] == "--fp8-all-gather off"


def test_on_is_refused_where_it_cannot_run():
    with pytest.raises(ValueError, match=r"--fp8-all-gather on needs --backend torchao.*allowed here: auto \| off"):
        _plan(backend="te", fp8_all_gather="on")
    with pytest.raises(ValueError, match="--fp8-all-gather on needs --parallel fsdp on several ranks"):
        _plan(Machine.planned("H100 80GB", 1, True), backend="torchao", recipe="current", fp8_all_gather="on")
    with pytest.raises(ValueError, match=r"--fp8-all-gather='yes' is invalid; allowed: auto \| on \| off"):
        TrainConfig(fp8_all_gather="yes")
    assert _plan(backend="torchao", recipe="current", fp8_all_gather="on").fp8_all_gather is True


def test_convert_model_refuses_fp8_all_gather_without_torchao():
    with pytest.raises(ValueError, match="fp8_all_gather=True needs backend torchao; 'emulated' has no FP8 all-gather"):
        convert_model(build_model("llama-tiny"), backend="emulated", fp8_all_gather=True)
    with pytest.raises(ValueError, match="fp8_all_gather must be True or False"):
        convert_model(build_model("llama-tiny"), backend="emulated", fp8_all_gather="on")
    assert convert_model(build_model("llama-tiny"), backend="emulated").fp8lab_conversion.backend == "emulated"


def test_the_committed_gpu_check_holds_and_is_what_auto_reads():
    import json

    from fp8lab.core.paths import RESULTS_DIR
    from fp8lab.plan import evidence

    check = json.loads((RESULTS_DIR / evidence.FP8_ALL_GATHER_STUDY / "check.json").read_text())
    assert check["gpu"].startswith("NVIDIA") and check["result"]["world"] >= 1 and check["command"]
    fp8, bf16 = check["result"]["fp8_all_gather"], check["result"]["bf16_all_gather"]
    assert "torch.float8_e4m3fn" in fp8["gathered_dtypes"] and fp8["gathered_bytes"] < 0.75 * bf16["gathered_bytes"]
    assert check["passed"] is True and check["problems"] == [] and evidence.load().fp8_all_gather is True
    p = plan_run(TrainConfig(model="llama-1b", precision="fp8", parallel="fsdp", backend="torchao", recipe="current"), P5)
    assert p.fp8_all_gather is True and "checked on a GPU: fp8-all-gather-h200" in p.reasons["fp8_all_gather"]


def test_a_failed_or_missing_gpu_check_leaves_auto_off(tmp_path):
    from fp8lab.plan import evidence

    assert evidence.from_results(tmp_path)["fp8_all_gather"]["passed"] is False
    (tmp_path / evidence.FP8_ALL_GATHER_STUDY).mkdir()
    (tmp_path / evidence.FP8_ALL_GATHER_STUDY / "check.json").write_text(
        '{"passed": false, "problems": ["the same loss within 2%"]}')
    assert evidence.from_results(tmp_path)["fp8_all_gather"]["passed"] is False
