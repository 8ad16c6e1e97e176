"""fp8lab.train.resume: a checkpoint's fingerprint records what the plan runs (backend, recipe, layout), not "auto"."""
from __future__ import annotations

import pytest

from fp8lab.train import resume
from fp8lab.core.hardware import Machine
from fp8lab.plan.runplan import plan_run
from fp8lab.train.entry import TrainConfig

H200 = Machine("cuda", "NVIDIA H200", 139.8, te_usable=True, fp8=True)
# the same GPU where Transformer Engine does not import: "auto" picks another backend there
H200_NO_TE = Machine("cuda", "NVIDIA H200", 139.8, fp8=True, unusable=(("te", "transformer_engine not installed"),))
FIXED = dict(model="llama-1b", micro_batch_size=4, grad_accum=2, seq_len=1024)  # the same layout anywhere


def test_an_auto_run_and_its_explicit_equivalent_share_a_fingerprint():
    auto = resume.fingerprint(plan_run(TrainConfig(**FIXED, precision="fp8"), H200))
    explicit = resume.fingerprint(plan_run(TrainConfig(**FIXED, precision="fp8", backend="te", recipe="delayed"), H200))
    assert auto == explicit
    assert (auto["backend"], auto["recipe"]) == ("te", "delayed")
    assert resume.check(auto, explicit, "step_00000010", 10, allow_new=False) == {}


def test_resuming_where_auto_picks_another_backend_is_refused():
    """A BF16 "auto" run on TE's layers resumed where TE is missing would load into the plain model."""
    c = TrainConfig(**FIXED, precision="bf16")
    saved = resume.fingerprint(plan_run(c, H200))
    here = resume.fingerprint(plan_run(c, H200_NO_TE))
    assert (saved["backend"], here["backend"]) == ("te", "none")
    with pytest.raises(ValueError, match=r"different run \(backend: 'te' there, 'none' here\)"):
        resume.check(saved, here, "step_00000010", 10, allow_new=True)


def test_another_recipe_is_another_run_and_bf16_runs_record_none():
    delayed = resume.fingerprint(plan_run(TrainConfig(**FIXED, precision="fp8"), H200))
    current = resume.fingerprint(plan_run(TrainConfig(**FIXED, precision="fp8", recipe="current"), H200))
    assert resume.differences(delayed, current) == {"recipe": ("delayed", "current")}
    bf16 = resume.fingerprint(plan_run(TrainConfig(**FIXED, precision="bf16", recipe="current"), H200))
    assert bf16["recipe"] is None  # no FP8 math: the recipe shapes nothing


def test_a_checkpoint_that_recorded_the_request_still_resumes():
    """Checkpoints written before this fingerprint recorded backend/recipe "auto": not compared, as before."""
    here = resume.fingerprint(plan_run(TrainConfig(**FIXED, precision="fp8"), H200))
    old = {**here, "backend": "auto", "recipe": "auto"}
    assert resume.differences(old, here) == {}
    assert resume.differences({**here, "backend": "emulated"}, here) == {"backend": ("emulated", "te")}


def test_a_checkpoint_whose_head_ran_in_bf16_is_continued_by_naming_that():
    """An FP8 run's head follows --fp8-lm-head auto (in FP8 in the fused loss's chunks on an FP8 GPU): a checkpoint
    written with the head in BF16 is refused with the option that continues it as it ran, and continues with the
    head in FP8 under --resume-with-new-settings where both chunk the loss (there the head keeps no FP8 state)."""
    from fp8lab.plan.evidence import Evidence

    fp8 = dict(FIXED, precision="fp8", fused_loss="on")
    checked = Evidence(fp8_head=True)  # the head's GPU check committed: auto runs it in FP8
    saved = resume.fingerprint(plan_run(TrainConfig(**fp8, fp8_lm_head=False), H200, checked))
    here = resume.fingerprint(plan_run(TrainConfig(**fp8), H200, checked))
    assert (saved["fp8_lm_head"], here["fp8_lm_head"]) == (False, True)
    with pytest.raises(ValueError, match=r"fp8_lm_head: False there, True here\); --fp8-lm-head False continues it "
                                         r"as it ran.*--resume-with-new-settings"):
        resume.check(saved, here, "step_00000010", 10, allow_new=False)
    # the head keeps no FP8 state: --resume-with-new-settings continues the checkpoint with the head in FP8
    assert resume.check(saved, here, "step_00000010", 10, allow_new=True) == {"fp8_lm_head": (False, True)}
    # over the full logits the head is TE's FP8 layer, which keeps scaling state: there it is another run
    full = {**here, "fused_loss": False}
    with pytest.raises(ValueError, match=r"\(fp8_lm_head cannot change with --resume-with-new-settings\)"):
        resume.check({**saved, "fused_loss": False}, full, "step_00000010", 10, allow_new=True)
    with pytest.raises(ValueError, match=r"\(fp8_lm_head cannot change with --resume-with-new-settings\)"):
        resume.check({k: v for k, v in saved.items() if k != "fused_loss"}, here, "step_00000010", 10,
                     allow_new=True)  # (a checkpoint from before the fused loss was recorded: not known)
    # the fused loss itself is recorded for that rule, not compared
    assert resume.differences({**here, "fused_loss": False}, here) == {}
    # beside another layout option it is still another run
    with pytest.raises(ValueError, match=r"\(seq_len cannot change with --resume-with-new-settings\)"):
        resume.check(saved, {**here, "seq_len": 64}, "step_00000010", 10, allow_new=True)
    again = resume.fingerprint(plan_run(TrainConfig(**fp8, fp8_lm_head=False), H200, checked))
    assert resume.check(saved, again, "step_00000010", 10, allow_new=False) == {}
