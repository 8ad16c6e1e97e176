"""LoRA options a run cannot take are refused when the options are validated, in one line naming the option and what
is allowed, before any model is built or planned: a LoRA option changed from its default without ``--lora-rank``
(it would be ignored: a full fine-tune), a rank above the adapted projections' smallest dimension (a huge one was
blamed on the batch by the memory plan), and ``--export-merged True`` with ``--save-model False`` (nothing written).
The defaults, as JobSpec and the notebooks pass them, still validate."""
from __future__ import annotations

import dataclasses
import re

import pytest

from fp8lab.core.hardware import Machine
from fp8lab.plan import lora as lora_plan
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.runplan import plan_run
from fp8lab.train import entry

CPU = Machine("cpu", "cpu", 24.0)
DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}  # each option's declared default


def _refused(flag: str, value: str, allowed: str) -> str:
    """The one-line refusal ``--flag=value is invalid; allowed: ...`` (fp8lab.plan.config._bad), as a regex."""
    return "^" + re.escape(f"{flag}={value} is invalid; allowed: {allowed}") + "[^\n]*$"


@pytest.mark.parametrize("name, value, flag", [
    ("lora_alpha", 5, "--lora-alpha"),
    ("lora_dropout", 0.1, "--lora-dropout"),
    ("lora_targets", "q_proj", "--lora-targets"),
])
def test_a_lora_option_without_a_rank_is_refused_naming_it_and_its_default(name, value, flag):
    allowed = f"{DEFAULTS[name]!r} without --lora-rank, or --lora-rank N to train adapters (LoRA is off without it"
    with pytest.raises(ValueError, match=_refused(flag, repr(value), allowed)):
        TrainConfig(**{name: value})


def test_export_merged_without_a_rank_keeps_its_own_reason():
    with pytest.raises(ValueError, match=_refused("--export-merged", "True", "False without --lora-rank, or "
                                                  "--lora-rank N to train adapters (a full fine-tune's model folder "
                                                  "is already whole)")):
        TrainConfig(export_merged=True)


def test_the_lora_defaults_given_explicitly_still_validate_without_a_rank():
    # what JobSpec's hyperparameters and a replayed config.json carry: every option, at its default
    TrainConfig(lora_rank=0, lora_alpha=16, lora_dropout=0, lora_targets="all", export_merged=False)
    TrainConfig(**{k: DEFAULTS[k] for k in ("lora_alpha", "lora_dropout", "lora_targets", "export_merged")})


def test_a_default_config_with_a_rank_of_16_validates_and_plans():
    c = TrainConfig(lora_rank=16)
    assert (c.lora_rank, c.lora_alpha, c.lora_targets) == (16, 16.0, "all")
    plan_run(c, CPU)
    TrainConfig(lora_rank=16, lora_alpha=5, lora_dropout=0.1, lora_targets="q_proj,v_proj", export_merged=True)


@pytest.mark.parametrize("model, targets, most, smallest", [
    ("llama-tiny", "all", 32, "k_proj: 64 -> 32"),  # 4 query heads, 2 KV heads of 16
    ("llama-tiny", "q_proj,gate_proj", 64, "q_proj: 64 -> 64"),
    ("gptneo-tiny", "c_fc", 64, "c_fc: 64 -> 256"),
])
def test_a_rank_above_the_adapted_projections_smallest_dimension_is_refused(model, targets, most, smallest):
    TrainConfig(model=model, lora_targets=targets, lora_rank=most)  # valid (if pointless): B A has full rank
    allowed = (f"{lora_plan.RANK_ALLOWED}, at most {most} for --model {model}: the smallest in or out features of "
               f"the adapted projections ({smallest})")
    with pytest.raises(ValueError, match=_refused("--lora-rank", str(most + 1), allowed)):
        TrainConfig(model=model, lora_targets=targets, lora_rank=most + 1)


def test_a_huge_rank_is_blamed_on_the_rank_not_on_the_batch(capsys):
    # the memory plan refused it before, naming --micro-batch-size and --seq-len; the options' check runs first
    allowed = (f"{lora_plan.RANK_ALLOWED}, at most 32 for --model llama-tiny: the smallest in or out features of "
               "the adapted projections (k_proj: 64 -> 32)")
    with pytest.raises(ValueError, match=_refused("--lora-rank", "100000000", allowed)):
        TrainConfig(lora_rank=100_000_000, micro_batch_size=4, seq_len=256)
    assert entry.main(["--lora-rank", "100000000", "--device", "cpu", "--seq-len", "256", "--dry-run", "True"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fp8lab train: error: --lora-rank=100000000 is invalid; allowed: an integer >= 0")
    assert "at most 32 for --model llama-tiny" in err and "\n" not in err
    assert "--micro-batch-size" not in err and "--seq-len" not in err


def test_export_merged_needs_save_model():
    allowed = ("False with --save-model False (the merged model is written into the model folder, beside the "
               "adapters), or --save-model True")
    with pytest.raises(ValueError, match=_refused("--export-merged", "True", allowed)):
        TrainConfig(lora_rank=8, export_merged=True, save_model=False)
    TrainConfig(lora_rank=8, export_merged=True, save_model=True)
    TrainConfig(lora_rank=8, export_merged=False, save_model=False)  # the adapters trained, nothing written: asked


def test_the_command_line_refuses_a_lora_option_without_a_rank(capsys):
    assert entry.main(["--lora-alpha", "5", "--device", "cpu", "--dry-run", "True"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("fp8lab train: error: --lora-alpha=5.0 is invalid; allowed: 16.0 without --lora-rank, or "
                   "--lora-rank N to train adapters (LoRA is off without it: the option would be ignored)")
    with pytest.raises(ValueError, match=r"^--export-merged=True is invalid; allowed: False with --save-model False"):
        entry.parse_args(["--lora-rank", "8", "--export-merged", "True", "--save-model", "False"])


def test_a_job_with_the_lora_defaults_still_plans_and_one_with_an_ignored_option_is_refused():
    from fp8lab import launch as L  # the launcher: only this test needs it

    base = dict(model="llama-1b", precision="fp8", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, steps=10)
    defaults = {k: DEFAULTS[k] for k in ("lora_alpha", "lora_dropout", "lora_targets", "export_merged")}
    L.JobSpec(**base, options={"task": "sft", **defaults})
    L.JobSpec(**base, options={"task": "sft", "lora_rank": 16, **defaults})
    with pytest.raises(ValueError, match=r"the trainer would refuse this job: --lora-alpha=32\.0 is invalid; allowed: "
                                         r"16\.0 without --lora-rank"):
        L.JobSpec(**base, options={"task": "sft", "lora_alpha": 32.0})
