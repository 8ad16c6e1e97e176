"""What a checkpoint must agree on with the run resuming from it, and how new settings take over.

A checkpoint records the options that shape training (its *fingerprint*): the model and its
layers, precision, the backend and recipe that ran (the plan's, never "auto"), the data (a digest of the tokens' source,
fp8lab.data.tokens.identity), sequence length, global batch, seed, and the optimisation schedule
(total steps, warm-up, learning rates, AdamW settings, clipping). The batch layout is checked as
the global batch: micro-batch x accumulation x ranks may be split differently on resume (another
world size), since the loader gives every optimizer step the same samples whatever the split. A run resuming with
different values is refused with every difference listed, because the result would match neither run
(e.g. a 200-step run resumed as a 300-step one: its cosine schedule had already decayed).

``--resume-with-new-settings`` (``TrainConfig.resume_with_new_settings``) continues anyway when
only the schedule differs (steps/tokens, --warmup-steps, --lr, --min-lr, --weight-decay,
--beta1/2, --grad-clip). The schedule is then defined as the new run's: from the checkpoint's step
``s`` on, the learning rate is what a fresh run with the new options has at step ``s`` (warm-up,
then cosine to the new --min-lr at the new last step), and the new AdamW settings apply from the
next update; weights, AdamW moments and the data position continue from the checkpoint.

It may also change the LM head's precision (--fp8-lm-head) where both runs compute the head in the
fused loss's chunks: there it keeps no FP8 state (each step scales from the tensors themselves), so
only the numerics differ. Layout and model options (everything else in the fingerprint) cannot
change: that would be another run.
"""
from __future__ import annotations

from typing import Any

from fp8lab.core.paths import shareable_text
from fp8lab.model.user import identity
from fp8lab.plan import lora as lora_plan

# fingerprint keys that --resume-with-new-settings may change: the schedule, and the head's precision where both
# runs compute it in the fused loss's chunks (no FP8 state there; over the full logits TE's layer keeps scales)
SCHEDULE_KEYS = ("total_steps", "warmup_steps", "lr", "min_lr", "weight_decay", "beta1", "beta2", "grad_clip")
HEAD_KEY = "fp8_lm_head"
# recorded for that rule, not compared: the fused loss holds no state, and runs were never refused over it
INFO_KEYS = ("fused_loss",)
NEW_SETTINGS_FLAG = "--resume-with-new-settings"


def fingerprint(plan, data: str | None = None) -> dict[str, Any]:
    """What must not change between a checkpoint and the run resuming from it, from the run's plan
    (fp8lab.plan.runplan.RunPlan): the request's options, and where the request may say "auto" the plan's
    effective values (layout, backend, recipe), so an "auto" run and its explicit equivalent agree and
    an "auto" that picks otherwise on another machine does not.

    ``data``: the tokens' identity (fp8lab.data.tokens.identity); None leaves it out."""
    c, lay = plan.config, plan.layout
    # a model folder is identified by its config.json's hash (it may move, e.g. into a SageMaker channel)
    extra = {} if data is None else {"data": data}
    return {**extra, "model": identity(c.model), "model_overrides": c.model_overrides, "precision": c.precision,
            "backend": plan.backend_label, "recipe": plan.recipe.spec() if plan.recipe_kind else None,
            "fuse": lora_plan.fuses(c), "fp8_lm_head": plan.fp8_lm_head, "fused_loss": plan.fused_loss,
            "seq_len": lay.seq_len, "seed": c.seed,
            "bf16_edge_blocks": c.bf16_edge_blocks,
            "global_batch": lay.micro_batch_size * lay.grad_accum * plan.world_size,
            "total_steps": plan.total_steps, "warmup_steps": plan.warmup_steps, "lr": c.lr, "min_lr": c.min_lr,
            "weight_decay": c.weight_decay, "beta1": c.beta1, "beta2": c.beta2, "grad_clip": c.grad_clip,
            "lora": [c.lora_rank, c.lora_alpha, c.lora_dropout, c.lora_targets] if c.lora_rank else None}


# Checkpoints written before the fingerprint held the plan's backend and recipe recorded the request,
# "auto" included; such a value says nothing about what ran, so it is not compared (as before).
REQUESTED_BEFORE = ("backend", "recipe")


def differences(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """key -> (checkpoint's value, this run's), for keys both know (older checkpoints record fewer)."""
    return {k: (saved[k], v) for k, v in current.items()
            if k in saved and saved[k] != v and k not in INFO_KEYS
            and not (k in REQUESTED_BEFORE and saved[k] == "auto")}


def check(saved: dict[str, Any], current: dict[str, Any], where: str, step: int, allow_new: bool) -> dict[str, tuple]:
    """Raise ValueError listing the differences unless none, or only those ``allow_new`` may change (the schedule;
    the head's precision where both runs chunk the loss).

    Returns the differences accepted under ``allow_new`` (empty when the runs agree)."""
    diff = differences(saved, current)
    if not diff:
        return {}
    listed = ", ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in diff.items())
    in_chunks = saved.get("fused_loss") is True and current.get("fused_loss") is True
    fixed = [k for k in diff if k not in SCHEDULE_KEYS and not (k == HEAD_KEY and in_chunks)]
    if "data" in fixed:  # another corpus: that is another run, started in its own folder
        raise ValueError(
            f"checkpoint {where} was trained on other data ({listed}); resume with the same --data, or start "
            f"afresh in a new --output-dir (or another --checkpoint-dir)")
    if fixed:
        raise ValueError(
            f"checkpoint {where} was written by a different run ({listed}); use the same options, or start "
            f"afresh in a new --output-dir (and --checkpoint-dir)"
            + (f" ({', '.join(fixed)} cannot change with {NEW_SETTINGS_FLAG})" if allow_new else ""))
    if not allow_new:
        # where the LM head's precision differs (auto may choose otherwise than a checkpoint's run did), the option
        # that continues the checkpoint as it ran
        head = f"; --fp8-lm-head {diff[HEAD_KEY][0]} continues it as it ran" if HEAD_KEY in diff else ""
        raise ValueError(
            f"checkpoint {where} was written with other settings ({listed}){head}; resume with the same options, "
            f"pass {NEW_SETTINGS_FLAG} to continue from step {step} with the new ones (see fp8lab.train.resume), "
            "or start afresh in a new --output-dir (and --checkpoint-dir)")
    if current["total_steps"] <= step:
        raise ValueError(f"--steps/--tokens give {current['total_steps']} steps but checkpoint {where} is at step "
                         f"{step}; allowed with {NEW_SETTINGS_FLAG}: more than {step} steps")
    return diff


def apply_new_settings(scheduler, c, lr_at, step: int) -> None:
    """Make the loaded optimizer (the scheduler's) follow the new options from ``step`` on (see the module doc)."""
    groups = scheduler.optimizer.param_groups  # fp8lab.train.optim.make_optimizer: [matrices (decayed), the rest]
    for i, group in enumerate(groups):
        group["initial_lr"] = c.lr
        group["betas"] = (c.beta1, c.beta2)
        group["weight_decay"] = c.weight_decay if i == 0 else 0.0
        group["lr"] = c.lr * lr_at(step)
    scheduler.base_lrs = [c.lr for _ in groups]
    scheduler.last_epoch = step
    scheduler._last_lr = [g["lr"] for g in groups]


def failure_reason(exc: BaseException) -> str:
    """One line saying why a checkpoint did not load (torch's CheckpointException wraps per-rank errors)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, inner = next(iter(failures.items()))
        # (exception, traceback)
        inner = inner[0] if isinstance(inner, tuple) and inner else getattr(inner, "exc", inner)
        text = shareable_text(str(inner)).strip().split(". ")[0].splitlines()
        return f"{type(exc).__name__} on rank {rank}: {type(inner).__name__}: {text[0] if text else ''}"[:300]
    text = shareable_text(str(exc)).strip().split(". ")[0].splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
