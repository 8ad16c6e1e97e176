"""The run's record, a component of the trainer (as those of fp8lab.train.components): what a run says about
itself before its first step. It owns

* the start lines: the layout, CUDA graphs, a raised max_seq_len, FP8 attention and the fused loss, and after
  set-up the run's one-line description, its data, MFU's peak and where it resumed;
* ``--dry-run``'s summary;
* ``config.json``, made by one function, :func:`config_record`, from the plan.

config.json's shape: the options as flat keys, each decided one (``RunPlan.options()``, the device and the progress
bar) at the value that ran, never "auto", as readers of config.json (fp8lab.analysis) expect; the provenance and the
command; the run's facts (parameters, FLOPs per token, the step it resumed from) and sources (the model's, the data's,
the conversion); then ``requested`` (what was asked, "auto" included), ``plan`` (``RunPlan.record()``: every decision
and why) and ``built`` (what the trainer refined when it built the plan: a weight cache or kept weights the model could
not take, the AdamW kernels, the captured CUDA graphs). Old run folders' keys (``*_resolved``, ``*_active``, ...)
are read by ``fp8lab.analysis.run_config.normalize_config``.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Callable

from fp8lab.core import paths as fpaths
from fp8lab.data import tokens as fdata
from fp8lab.model import user as user_model
from fp8lab.model.models import count_parameters
from fp8lab.plan.fp8attn import BWD_ENV, FP8_DPA_BWD
from fp8lab.records import metrics as fmetrics
from fp8lab.records import ownership
from fp8lab.records.data_format import PRETRAIN
from fp8lab.train.components import show_progress
from fp8lab.train import replay

SHARED = ("model", "data", "output_dir", "checkpoint_dir", "model_dir")  # paths config.json keeps shareable


def config_record(plan, *, built: dict[str, Any], sources: dict[str, Any], argv: list[str] | None, output_dir: Path,
                  resumed_from: int | None, flops_per_token: float, environ: dict[str, str] | None = None,
                  replayed_from: str | None = None) -> dict[str, Any]:
    """config.json of the run of ``plan`` (see the module doc): flat options as they ran, provenance, facts,
    sources, ``requested``, ``plan`` and ``built``. ``environ``: where TE's FP8-attention backward is read.
    ``replayed_from``: the config.json this run replays (``fp8lab.train.replay``): recorded as ``replayed_from``."""
    c, m = plan.config, plan.machine
    requested = c.as_dict()
    flat = {**requested, **plan.options(), "device": m.device,
            "progress": "on" if show_progress(c.progress, True) else "off"}
    # the Python API's equivalent command: the layout as it ran, --activation-checkpointing as asked (auto, the
    # default, left out) and the other decided options as asked
    as_typed = {**requested, **plan.layout.options(), "activation_checkpointing": c.activation_checkpointing}
    shared = fpaths.shareable_run_record(as_typed, type(c)().as_dict(), argv, output_dir, SHARED)
    record = {**flat, **fmetrics.provenance(m.name, m.world_size, argv), **shared,
              "flops_per_token": flops_per_token, "params": count_parameters(plan.model_config).total,
              "resumed_from_step": resumed_from, **sources,
              "requested": {**requested, **{k: shared[k] for k in SHARED if k in shared}},
              "plan": plan.record(), "built": built}
    if replayed_from is not None:
        record["replayed_from"] = replay.replayed_from(replayed_from, output_dir)
    if plan.fp8_attention:  # which backward TE's FP8 attention ran (fp8lab.plan.fp8attn)
        record["plan"][BWD_ENV] = (os.environ if environ is None else environ).get(BWD_ENV)
    return record


class RunRecord:
    """The run's start lines, its dry-run summary and its config.json (rank 0 writes; every rank may log)."""

    def __init__(self, plan, env, paths, argv: list[str] | None, log: Callable[..., None],
                 replayed_from: str | None = None):
        self.plan, self.env, self.paths, self.argv, self.log = plan, env, paths, argv, log
        self.replayed_from = replayed_from

    @property
    def model_name(self) -> str:
        """--model as step records, logs and summaries show it: never an absolute machine path (fp8lab.core.paths)."""
        return fpaths.shareable_path(self.plan.config.model, self.paths.output_dir)

    def plan_lines(self) -> None:
        """The plan's lines, first thing: the layout, CUDA graphs, the FP8 recipe, a named shape's raised max_seq_len,
        FP8 attention and the fused loss (each where there is a decision to show). With FP8 attention on, TE's
        NVTE_FP8_DPA_BWD is set to fp8lab's default where the environment does not set it (TE reads it at each
        attention call)."""
        p, c, log = self.plan, self.plan.config, self.log
        reasons, gpu = p.reasons, p.machine.gpu
        log(f"fp8lab: {p.layout.header()}")
        if gpu or c.cuda_graphs != "auto":  # on a CPU auto is always off: nothing to say
            log(f"fp8lab: {p.graphs.describe()}")
        if p.fp8 and p.backend:
            log(f"fp8lab: FP8 recipe {p.recipe.kind}: {reasons['recipe']}")
        if "max_seq_len" in reasons:
            log(f"fp8lab: {reasons['max_seq_len']}")
        if p.fp8_attention:  # set before anything runs; the user's value wins
            os.environ.setdefault(BWD_ENV, FP8_DPA_BWD)
            bwd = f"; {BWD_ENV}={os.environ[BWD_ENV]} (1: backward in FP8 too, 0: backward in BF16)"
            log(f"fp8lab: FP8 attention on: {reasons['fp8_attention']}{bwd}")
        elif p.fp8 and (gpu or c.fp8_attention != "auto"):
            log(f"fp8lab: FP8 attention off: {reasons['fp8_attention']}")
        if p.fp8 and (p.fp8_primary_weights or c.fp8_weights != "auto"):
            log(f"fp8lab: FP8 weights: {reasons['fp8_weights']}")
        if p.fused_loss or gpu or c.fused_loss != "auto":  # a CPU's auto: nothing to say
            log(f"fp8lab: fused loss {'on' if p.fused_loss else 'off'}: {reasons['fused_loss']}")

    def dry_run_summary(self) -> dict[str, Any]:
        p, lay = self.plan, self.plan.layout
        return {"status": "dry_run", "model": self.model_name, "precision": p.config.precision,
                "backend": p.backend_label,
                "world_size": self.env.world_size, "gpu_name": p.machine.name, **lay.options(),
                "cuda_graphs": p.graphs.active, "memory_estimate_gib": round(lay.memory.peak, 1),
                "memory_gib": round(p.machine.memory_gib, 1), "reasons": lay.reasons}

    def sources(self, manifest: dict[str, Any], inner, conversion) -> dict[str, Any]:
        """Where the model, its conversion and the data came from (config.json's ``model_source``, ...)."""
        source = user_model.describe(self.plan.config.model)
        if source["source"] != "named":
            source["params_from_config"] = count_parameters(self.plan.model_config).total
        return {"model_source": {**source, "params_built": sum(t.numel() for t in inner.parameters())},
                "conversion": dataclasses.asdict(conversion) if conversion is not None else None,
                "data_manifest": {**{k: manifest[k] for k in ("source", "vocab_size", "tokenizer_sha256")},
                                  # which tokenizer made the tokens, and what they train (older folders: BPE text)
                                  "tokenizer_source": manifest.get("tokenizer_source", fdata.BPE_SOURCE),
                                  "task": manifest.get("task", PRETRAIN),
                                  **({"template": manifest["template"]} if "template" in manifest else {})}}

    def write(self, *, built: dict[str, Any], sources: dict[str, Any], resumed_from: int | None, info,
              data_dir: Path) -> None:
        """config.json (:func:`config_record`), then the run's opening lines (rank 0)."""
        record = config_record(self.plan, built=built, sources=sources, argv=self.argv,
                               output_dir=self.paths.output_dir,
                               resumed_from=resumed_from, flops_per_token=info.flops_per_token,
                               replayed_from=self.replayed_from)
        out = self.paths.output_dir
        ownership.write_file(out / "config.json", json.dumps(record, indent=2, default=str) + "\n")
        ownership.record(out, "config.json")
        self.start_lines(info, data_dir, resumed_from)

    def start_lines(self, info, data_dir: Path, resumed_from: int | None) -> None:
        p, c, log = self.plan, self.plan.config, self.log
        layers = (f" via {info.backend} ({p.recipe.describe()})" if p.fp8 and p.backend
                  else (f" on {info.backend} layers, FP8 off" if p.backend else ""))
        # --precision bf16 whose math runs in fp32 (a CPU on auto, or --compute-dtype fp32) is named by what it computes
        # in, as everywhere else (analysis.labels.math_dtype: "fp32 hf" in tables, "fp32" in notebook 03)
        shown = (f"{p.compute_dtype} (asked as bf16)" if p.compute_dtype != "bf16" and c.precision == "bf16"
                 else c.precision)
        world = p.world_size
        log(f"fp8lab: {self.model_name} ({count_parameters(p.model_config).total / 1e6:.1f}M params) | {shown}{layers}"
            f" | {world} x {info.gpu_name} | {c.parallel if world > 1 else 'single process'} | "
            f"{p.total_steps} steps x {p.tokens_per_step} tokens")
        log(f"fp8lab: {fdata.describe(data_dir)}")
        if info.peak:
            log(f"fp8lab: MFU = model FLOPs / dense BF16 peak of {info.gpu_name} ({info.peak / 1e12:.0f} TFLOP/s), "
                "for BF16 and FP8 runs alike")
        else:
            log(f"fp8lab: MFU not computed on {info.gpu_name} (no dense BF16 peak known): null in metrics.jsonl, 0 in "
                "log lines")
        if resumed_from is not None:
            log(f"fp8lab: resumed from checkpoint at step {resumed_from} ({self.paths.checkpoint_dir.name}/)")
        if c.inject_nan_at_steps:
            log(f"fp8lab: TEST HOOK: NaN loss injected at steps {list(c.inject_nan_at_steps)}")


def adamw_impl(opt) -> str:
    """Which AdamW kernels run: 'fused', 'foreach' or 'for-loop' (config.json's ``built``)."""
    d = getattr(opt, "defaults", {})
    if type(opt).__module__.startswith("transformer_engine"):
        return "te-fused-adam"
    return "fused" if d.get("fused") else "foreach" if d.get("foreach") else "for-loop"
