"""The memory modes' rule (fp8lab.plan.memory_modes) as the layout and the plan apply it: plain wherever a run fits,
otherwise the first mode that fits and whose loss check is committed; refusals that name the mode that would fit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from fp8lab.core.hardware import Machine
from fp8lab.model.models import get_config
from fp8lab.plan import evidence as fevidence, layout as fl, memory_modes
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.evidence import Evidence
from fp8lab.plan.runplan import plan_run

H100 = Machine("cuda", "NVIDIA H100 80GB HBM3", 79.2, te_usable=True, fp8=True)
CPU = Machine("cpu", "cpu", 24.0)
CHECKED = Evidence(memory_modes=("bf16-moments", "fp8-exp-avg"))
LLAMA_8B = "data/reference/configs/llama-3.1-8b"


def _plan(model, precision="fp8", evidence=CHECKED, **kw):
    return plan_run(TrainConfig(model=model, precision=precision, device="cpu", **kw), H100, evidence)


def test_the_bytes_per_parameter_are_counted_per_mode():
    cfg = get_config("llama-7b")
    n = 6_738_415_616  # llama-7b's parameters (its run records' `params`)
    for mode, per_param in (("plain", 16), ("bf16-moments", 10), ("fp8-exp-avg", 9)):
        e = fl.estimate_memory(cfg, precision="bf16", micro_batch_size=1, seq_len=2048, memory_mode=mode)
        assert e.states == pytest.approx(per_param * n / 2**30)


@pytest.mark.parametrize("model", ["llama-1b", "gptneo-125m", "data/reference/configs/qwen2.5-3b"])
def test_auto_keeps_the_plain_layout_wherever_it_fits(model):
    auto, plain = _plan(model), _plan(model, memory="plain")
    assert auto.memory_mode == memory_modes.PLAIN
    assert auto.layout == plain.layout and auto.weight_cache == plain.weight_cache


@pytest.mark.parametrize("model,mode", [("llama-7b", "bf16-moments"), ("data/reference/configs/mistral-7b-v0.3",
                                                                          "bf16-moments"), (LLAMA_8B, "fp8-exp-avg")])
def test_auto_takes_the_least_lossy_checked_mode_that_fits_one_h100(model, mode):
    bf16, fp8 = _plan(model, "bf16"), _plan(model, "fp8")
    assert bf16.memory_mode == fp8.memory_mode == mode  # one mode and one layout for both runs of a pair
    assert bf16.layout == fp8.layout
    assert fp8.layout.memory.peak <= H100.memory_gib - fl.HEADROOM_GIB
    assert "bytes of state per parameter" in fp8.reasons["memory"] and "plain" in fp8.reasons["memory"]
    assert not fp8.weight_cache and fp8.reasons["fp8_weight_cache"].startswith(f"--memory {mode}")
    assert fp8.options()["memory"] == mode and fp8.decisions()["memory"] == mode


def test_llama_7b_fp8_gets_activation_checkpointing_since_its_saved_fp8_weights_do_not_fit():
    """Measured on an H100: FP8 at 1 x 2048 without checkpointing ran out of memory in bf16-moments (each block's FP8
    weights are saved for backward); BF16 fitted there. The one layout of the pair recomputes blocks."""
    cfg = get_config("llama-7b")
    no_ckpt = fl.estimate_memory(cfg, precision="fp8", micro_batch_size=1, seq_len=2048, memory_mode="bf16-moments")
    assert no_ckpt.peak > H100.memory_gib and no_ckpt.fp8_cache > 12
    assert _plan("llama-7b").layout.activation_checkpointing


def test_a_mode_without_its_loss_check_is_not_automatic_and_the_refusal_names_it():
    with pytest.raises(ValueError, match=r"--memory bf16-moments fits .*auto uses it once its loss check"):
        _plan("llama-7b", evidence=Evidence())
    with pytest.raises(ValueError, match=r"--memory fp8-exp-avg fits"):
        _plan(LLAMA_8B, evidence=Evidence(memory_modes=("bf16-moments",)))
    assert _plan("llama-7b", evidence=Evidence(), memory="bf16-moments").memory_mode == "bf16-moments"


def test_a_mode_whose_loss_check_failed_is_named_with_its_measured_gap():
    failed = Evidence(memory_mode_gaps=(("bf16-moments", 1.67), ("fp8-exp-avg", 12.86)))
    with pytest.raises(ValueError, match=r"--memory bf16-moments fits .*loss check did not pass \(\+1\.67% from the"):
        _plan("llama-7b", evidence=failed)
    assert _plan("llama-7b", evidence=failed, memory="bf16-moments").memory_mode == "bf16-moments"


def test_the_committed_loss_check_makes_offload_automatic_and_keeps_the_failed_gaps():
    """The committed loss checks: TE's FusedAdam modes failed theirs (data/results/memory-modes-h100/loss.json), offload
    held against plain runs of the same code (memory-offload-h100): auto may take offload only, and the packaged
    evidence carries each mode's gap for the refusal."""
    packaged = json.loads((Path(fevidence.__file__).parent / fevidence.FILE).read_text())
    assert packaged["memory_modes"]["holds"] == ["offload"]
    gaps = packaged["memory_modes"]["gap_pct"]
    assert set(gaps) == {"bf16-moments", "fp8-exp-avg", "offload"}
    assert all(gaps[m] > 0.57 for m in ("bf16-moments", "fp8-exp-avg")) and abs(gaps["offload"]) < 0.5


def test_auto_refuses_with_the_modes_it_tried():
    with pytest.raises(ValueError, match=r"memory modes tried: plain, bf16-moments, fp8-exp-avg"):
        plan_run(TrainConfig(model="llama-7b", precision="fp8", device="cpu", seq_len=2048),
                 Machine("cuda", "NVIDIA A10G", 22.0, te_usable=True, fp8=True), CHECKED)


@pytest.mark.parametrize("kw,why", [(dict(), "needs a CUDA GPU with Transformer Engine"),
                                    (dict(param_dtype="fp32"), "needs bf16 parameters")])
def test_a_named_mode_that_cannot_run_here_is_refused_naming_what_can(kw, why):
    machine = H100 if kw else CPU
    with pytest.raises(ValueError, match=rf"--memory bf16-moments {why}.*allowed here: auto \| plain"):
        plan_run(TrainConfig(model="llama-tiny", device="cpu", memory="bf16-moments", **kw), machine, CHECKED)
    assert plan_run(TrainConfig(model="llama-tiny", device="cpu"), CPU, CHECKED).memory_mode == memory_modes.PLAIN


def test_a_bad_value_names_the_option_and_the_choices():
    with pytest.raises(ValueError, match=r"--memory.*auto, plain, bf16-moments, fp8-exp-avg|--memory.*auto \| plain"):
        TrainConfig(memory="fp4")


def test_the_evidence_lists_the_modes_whose_loss_check_holds(tmp_path):
    folder = tmp_path / fevidence.MEMORY_MODES_STUDIES[0]
    folder.mkdir()
    (folder / "loss.json").write_text(json.dumps({"modes": {"bf16-moments": {"holds": True, "gap_pct": 0.1},
                                                            "fp8-exp-avg": {"holds": False, "gap_pct": 12.861}}}))
    data = fevidence.from_results(tmp_path)
    assert data["memory_modes"]["holds"] == ["bf16-moments"]
    assert data["memory_modes"]["gap_pct"] == {"bf16-moments": 0.1, "fp8-exp-avg": 12.86}
    assert Evidence.from_dict(data).memory_modes == ("bf16-moments",)
    assert dict(Evidence.from_dict(data).memory_mode_gaps) == {"bf16-moments": 0.1, "fp8-exp-avg": 12.86}
    assert Evidence.from_dict(fevidence.from_results(tmp_path / "none")).memory_modes == ()


def test_each_mode_is_judged_by_the_folder_that_checked_it_the_later_folder_last(tmp_path):
    early, late = (tmp_path / s for s in fevidence.MEMORY_MODES_STUDIES)
    for folder, modes in ((early, {"bf16-moments": {"holds": False, "gap_pct": 1.67}, "offload": {"holds": False,
                                                                                                  "gap_pct": 3.0}}),
                          (late, {"offload": {"holds": True, "gap_pct": -0.2}})):
        folder.mkdir()
        (folder / "loss.json").write_text(json.dumps({"modes": modes}))
    data = fevidence.from_results(tmp_path)
    assert data["memory_modes"]["holds"] == ["offload"]
    assert data["memory_modes"]["gap_pct"] == {"bf16-moments": 1.67, "offload": -0.2}
    assert data["memory_modes"]["studies"] == list(fevidence.MEMORY_MODES_STUDIES)


def test_a_sagemaker_job_runs_the_mode_its_plan_chose():
    from fp8lab import launch as L

    spec = L.JobSpec(model="llama-7b", precision="fp8", instance_type="ml.p5.4xlarge", steps=100,
                     role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET,
                     options={"memory": "bf16-moments"})
    assert spec.plan.memory_mode == "bf16-moments" and spec.layout.activation_checkpointing
    assert L.hyperparameters(spec)["memory"] == "bf16-moments"


# ------------------------------------------------------------------------------------ offload: plain's states on the host

P5_GPU = Machine("cuda", "NVIDIA H100 80GB HBM3", 79.2, host_memory_gib=256.0, te_usable=True, fp8=True)  # ml.p5.4xlarge
WITH_OFFLOAD = Evidence(memory_modes=("offload", "bf16-moments", "fp8-exp-avg"))


def _p5(model, precision="fp8", evidence=WITH_OFFLOAD, machine=P5_GPU, **kw):
    return plan_run(TrainConfig(model=model, precision=precision, device="cpu", **kw), machine, evidence)


def test_offload_keeps_4_bytes_per_parameter_on_the_gpu_and_12_on_the_host():
    cfg = get_config("llama-7b")
    n = 6_738_415_616
    e = fl.estimate_memory(cfg, precision="bf16", micro_batch_size=1, seq_len=2048, memory_mode="offload")
    assert e.states == pytest.approx(4 * n / 2**30) and e.host == pytest.approx(12 * n / 2**30)
    # two staging slots (12 bytes each), the gradients (4) and the first step's new moments (8); the embedding the
    # largest chunk
    staged = 36 * cfg.vocab_size * cfg.hidden_size / 2**30
    assert e.step == pytest.approx(e.states + staged)
    assert fl.estimate_memory(cfg, precision="bf16", micro_batch_size=1, seq_len=2048).host == 0


@pytest.mark.parametrize("model", ["llama-7b", "data/reference/configs/mistral-7b-v0.3", LLAMA_8B])
def test_auto_takes_offload_first_where_its_check_holds_and_the_host_holds_its_states(model):
    bf16, fp8 = _p5(model, "bf16"), _p5(model, "fp8")
    assert bf16.memory_mode == fp8.memory_mode == "offload" and bf16.layout == fp8.layout
    assert not fp8.layout.activation_checkpointing  # 4 bytes per parameter leave room for the activations
    assert fp8.weight_cache  # plain's FP8 weight cache stays: offload changes where states live, not the step
    assert fp8.layout.memory.peak <= P5_GPU.memory_gib - fl.HEADROOM_GIB
    assert fp8.layout.memory.host <= fl.HOST_SHARE * P5_GPU.host_memory_gib
    assert "4 bytes of state per parameter (plain did not fit)" in fp8.reasons["memory"]


@pytest.mark.parametrize("model", ["llama-7b", "data/reference/configs/mistral-7b-v0.3", LLAMA_8B])
def test_offload_accumulates_twice_the_tokens_per_step_its_host_copies_cost_the_same_per_step(model):
    lay = _p5(model).layout
    # at most MAX_GRAD_ACCUM micro-batches: the 8B's 128K-vocabulary logits leave room for micro-batch 2 only
    want = 131_072 if model == LLAMA_8B else 262_144
    assert lay.micro_batch_size * lay.seq_len * lay.grad_accum == want
    assert lay.grad_accum == min(fl.OFFLOAD_TOKENS_PER_GPU_STEP // (lay.micro_batch_size * 2048), fl.MAX_GRAD_ACCUM)
    assert "twice the usual" in lay.reasons["grad_accum"]
    big = Machine("cuda", "a 192 GB GPU", 178.0, host_memory_gib=256.0, te_usable=True, fp8=True)
    plain = _p5(model, machine=big).layout  # fits plain: the usual target, the same reasons line as ever
    assert plain.memory_mode == "plain" and "twice" not in plain.reasons["grad_accum"]
    assert plain.micro_batch_size * plain.seq_len * plain.grad_accum == fl.TOKENS_PER_GPU_STEP
    named = _p5(model, memory="offload", grad_accum=8).layout  # an explicit accumulation wins
    assert named.grad_accum == 8


@pytest.mark.parametrize("model", ["llama-7b", "data/reference/configs/mistral-7b-v0.3", LLAMA_8B])
def test_with_the_committed_evidence_the_plain_commands_train_the_7_8b_models_on_one_p5_gpu(model):
    """`fp8lab train --model M --precision bf16|fp8` and nothing else, on one H100 with P5's host memory per GPU."""
    committed = fevidence.load()
    plans = [plan_run(TrainConfig(model=model, precision=p, device="cpu"), P5_GPU, committed) for p in ("bf16", "fp8")]
    assert [pl.memory_mode for pl in plans] == ["offload", "offload"] and plans[0].layout == plans[1].layout
    assert "offload" in plans[1].reasons["memory"]


def test_offload_is_not_taken_where_the_host_memory_is_unknown_or_too_small():
    assert _p5("llama-7b", machine=H100).memory_mode == "bf16-moments"  # a Machine made by hand: host unknown
    small = Machine("cuda", "NVIDIA H100 80GB HBM3", 79.2, host_memory_gib=64.0, te_usable=True, fp8=True)
    assert _p5("llama-7b", machine=small).memory_mode == "bf16-moments"
    with pytest.raises(ValueError, match=r"--memory offload: its states take 100 GiB of host memory with the export's "
                                         r"copy \(--save-model\), more than 85% of the 64 GiB this GPU's process has"):
        _p5("llama-7b", machine=small, memory="offload")
    with pytest.raises(ValueError, match=r"take 75 GiB of host memory, more than 85% of the 64 GiB"):
        _p5("llama-7b", machine=small, memory="offload", save_model=False)
    assert _p5("llama-7b", machine=H100, memory="offload").memory_mode == "offload"  # by name: the user knows


def test_the_exports_copy_of_the_masters_counts_against_the_host():
    """One H100 of the device's machines has 128 GiB of host memory: llama-7b's 75 GiB of states and its export's 25
    fit in 85%; Llama-3.1-8B's 90 + 30 do not, unless the run saves no model."""
    device = Machine("cuda", "NVIDIA H100 80GB HBM3", 79.2, host_memory_gib=128.0, te_usable=True, fp8=True)
    assert _p5("llama-7b", machine=device).memory_mode == "offload"
    assert _p5(LLAMA_8B, machine=device).memory_mode == "fp8-exp-avg"  # (bf16-moments does not fit one H100 there)
    assert _p5(LLAMA_8B, machine=device, save_model=False).memory_mode == "offload"


def test_a_refusal_names_offload_where_it_would_fit_and_its_check_is_missing():
    with pytest.raises(ValueError, match=r"--memory offload fits .*auto uses it once its loss check is committed"):
        _p5("llama-7b", evidence=Evidence())


def test_offload_is_refused_on_a_cpu_naming_what_runs_there():
    with pytest.raises(ValueError, match=r"--memory offload needs a CUDA GPU .*allowed here: auto \| plain$"):
        plan_run(TrainConfig(model="llama-tiny", device="cpu", memory="offload"), CPU, WITH_OFFLOAD)


def test_a_gpu_without_te_may_offload_but_not_use_fused_adam():
    no_te = Machine("cuda", "NVIDIA H100 80GB HBM3", 79.2, host_memory_gib=256.0, fp8=True,
                    unusable=(("te", "not installed"),))
    with pytest.raises(ValueError, match=r"--memory bf16-moments needs a CUDA GPU with Transformer Engine.*allowed "
                                         r"here: auto \| plain \| offload$"):
        plan_run(TrainConfig(model="llama-tiny", device="cpu", memory="bf16-moments", backend="none"), no_te,
                 WITH_OFFLOAD)
    assert plan_run(TrainConfig(model="llama-tiny", device="cpu", memory="offload", backend="none"), no_te,
                    WITH_OFFLOAD).memory_mode == "offload"


def test_a_p5_4xlarge_job_plans_llama_7b_with_its_states_in_the_instances_memory():
    from fp8lab import launch as L
    from fp8lab.core.hardware import INSTANCES

    assert INSTANCES["ml.p5.4xlarge"].host_gib_per_gpu == 256 and INSTANCES["ml.p5.48xlarge"].host_gib_per_gpu == 256
    spec = L.JobSpec(model="llama-7b", precision="fp8", instance_type="ml.p5.4xlarge", steps=100,
                     role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, options={"memory": "offload"})
    assert spec.plan.memory_mode == "offload" and spec.plan.machine.host_memory_gib == 256
    assert L.hyperparameters(spec)["memory"] == "offload"


def test_the_host_memory_is_the_containers_limit_where_lower(tmp_path):
    from fp8lab.core.hardware import cpu_memory_gib

    machine = cpu_memory_gib(limits=())
    (tmp_path / "max").write_text("max\n")
    (tmp_path / "limit").write_text(str(2**30) + "\n")
    assert cpu_memory_gib(limits=(str(tmp_path / "max"),)) == machine
    assert cpu_memory_gib(limits=(str(tmp_path / "none"), str(tmp_path / "limit"))) == 1.0
