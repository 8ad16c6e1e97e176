"""The training run as a ``Trainer``: ``setup``, then ``fit`` (the loop over ``train_step``), then ``finish``.

    plan = plan_run(config, detect_machine(env.device, env.world_size))  # fp8lab.plan.runplan: every decision
    trainer = Trainer(plan, env, argv)
    with setup_errors(trainer.paths, env):  # a ValueError here is an OptionError; new folders are removed
        trainer.setup()                      # data, model, optimizer, resume, config.json
    status, message = trainer.fit()
    summary = trainer.finish(status, message)

(``run`` does exactly that, after checking the folders and the data.) The trainer decides nothing:
it builds what the plan says and reads every decision from the plan (it keeps no copy of one); what it
refines while building (a weight cache or kept weights the model cannot take) is config.json's ``built``.
The run's record (start lines, ``--dry-run``'s summary, config.json) is fp8lab.train.run_record's component.

Set-up order (as torchtitan): build the HF model, convert it for FP8, activation checkpointing,
compile each block, fp32 master weights (``--param-dtype bf16``), shard (FSDP2) or wrap (DDP), the
optimizer, resume, and last the CUDA graphs of the blocks (``--cuda-graphs``, fp8lab.plan.graphs), which
read the resumed weights and FP8 scaling state in place.
The loop only calls components (fp8lab.train.components): the step metrics, the profiler, the
non-finite guard and the checkpointer. FP8 is the backend's autocast region around
:meth:`Trainer._forward` (the one place the model is called). The helpers
beside it: fp8lab.train.optim (AdamW, the LR schedule), fp8lab.train.export (the HF model at the end),
``fp8lab.train.distributed.apply_activation_checkpointing`` and ``compile_blocks``.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import signal
import sys
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from fp8lab.core import paths as fpaths
from fp8lab.core.errors import OptionError, RefusedOnRankZero
from fp8lab.data import checks as data_checks
from fp8lab.data import run_data
from fp8lab.data import tokens as fdata
from fp8lab.fp8 import stats as fp8stats
from fp8lab.fp8 import te_debug
from fp8lab.fp8.backends import detect_machine, get_backend
from fp8lab.fp8.convert import convert_model, edge_blocks_filter, fp8_lm_head
from fp8lab.fp8.recipe import TABLE as RECIPE_KINDS
from fp8lab.model.models import MODEL_CONFIGS, build_model, model_flops_per_token
from fp8lab.model.user import is_user_model
from fp8lab.model.user import tokenizer_differs as user_tokenizer_differs
from fp8lab.plan import graphs
from fp8lab.plan import lora as lora_plan
from fp8lab.plan.runplan import plan_run
from fp8lab.train import trackers as ftrackers
from fp8lab.records import metrics as fmetrics
from fp8lab.records import ownership, runlock
from fp8lab.train import checkpoint as fckpt
from fp8lab.train import distributed as fdist
from fp8lab.train import export as fexport
from fp8lab.train import fp8_weights as fp8w
from fp8lab.train import fused_loss
from fp8lab.train import lora as flora
from fp8lab.train import optim as foptim
from fp8lab.train import rerun
from fp8lab.train import resume as fresume
from fp8lab.train import run_paths as frun_paths
from fp8lab.train.components import stopping_at_once
from fp8lab.train.components import (Checkpointer, NonFiniteGuard, RunInfo, StepMetrics, StepProfiler, StepResult,
                                     StopFlag, TrainState)
from fp8lab.plan import memory_modes
from fp8lab.train.run_record import RunRecord, adamw_impl


class Trainer:
    """One training run of the plan ``plan`` (fp8lab.plan.runplan.RunPlan) on the process group ``env`` (see the module
    doc).

    ``self.c`` is the request (``plan.config``, "auto" included); what runs is read from the plan."""

    def __init__(self, plan, env, argv: list[str] | None = None, *, replayed_from: str | None = None):
        self.plan, self.env = plan, env  # every decision is read from the plan, never copied
        self.paths = frun_paths.resolve_paths(plan.config)
        self.log = print if env.is_main else (lambda *a, **k: None)
        # start lines, dry-run summary, config.json
        self.record = RunRecord(plan, env, self.paths, argv, self.log, replayed_from)
        self.wall0 = time.perf_counter()
        self.resumed_from: int | None = None
        self.last_val: float | None = None
        self.val_error: str | None = None  # why the last evaluation failed (None: none failed)
        self.stop = StopFlag()  # SIGTERM/SIGINT seen; fit() installs and uninstalls its handler
        self.graphs_captured = None
        # the backend object and its FP8 region, looked up once (not per micro-batch)
        self.fp8_backend = get_backend(plan.backend) if plan.backend else None
        self.finished: dict[str, Any] | None = None  # summary.json of a run already complete (setup)
        self.resumes: tuple | None = None  # (fingerprint, folder, step) of the resumed checkpoint (rerun.py)
        # the output and checkpoint folders' run locks (fp8lab.records.runlock), rank 0, to close()
        self.locks: list = []
        self.te_debug = None  # TE's debug API session (--fp8-stats-source te-debug), from _build_model to close()

    @property
    def c(self):
        """The request (``plan.config``, "auto" included)."""
        return self.plan.config

    # ------------------------------------------------------------------------------------ set-up

    def setup(self) -> dict[str, Any] | None:
        """Everything before the first step; returns the dry-run summary under ``--dry-run``, else None."""
        self.record.plan_lines()
        if self.c.dry_run:
            return self.record.dry_run_summary()
        self._cap_gpu_memory()
        self._prepare_data()
        self._build_model()
        self._build_optimizer()
        self._build_components()
        self._resume()
        # resumed at its last step: a finished run (kept as it is, see finish) or one whose export failed
        self.finished = (fdist.broadcast_object(self._finished_summary(), self.env)
                         if self.resumed_from == self.plan.total_steps else None)
        if self.finished is None:
            self._capture_graphs()
            if self.env.is_main:
                self._write_config()
        return None

    def _cap_gpu_memory(self) -> None:
        # emulate a smaller GPU (e.g. P5's H100 80 GB on an H200)
        if self.c.gpu_memory_gib and self.env.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.env.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.c.gpu_memory_gib * 2**30 / total), self.env.device)

    def _prepare_data(self) -> None:
        """Tokenized once per node (deterministic, so every node gets the same shards), then checked."""
        c, env = self.c, self.env
        source = frun_paths.data_source(c)
        refusal = None
        if env.local_rank == 0:
            try:
                self.paths.output_dir.mkdir(parents=True, exist_ok=True)
                if env.is_main:  # one run per output folder (a second one is refused here, before it writes)
                    self.locks.append(runlock.acquire("--output-dir", self.paths.output_dir))
                    self._lock_checkpoints()
                    rerun.refuse_replacing(c, self.paths)
                    self.resumes = rerun.resumed_checkpoint(c, self.paths, self.plan)
                    if source is not None and fdata.is_prepared(source):  # prepare-data is refused it meanwhile
                        self.locks.append(runlock.acquire_shared("--data", source))
                ownership.claim(self.paths.output_dir, "run")
                self.data_dir = self._ensure_prepared(source)
            except ValueError as exc:
                if not (env.distributed and env.is_main):
                    raise
                refusal = str(exc)  # told to every rank below, which then all end alike (not on a broken barrier)
        fdist.barrier(env)  # every node's tokens are ready before its other ranks read them
        # the checkpoint rank 0 read (rerun.resumed_checkpoint): every rank compares its data with it, refusing alike
        refusal, self.resumes = fdist.broadcast_object((refusal, self.resumes), env)
        if refusal is not None:
            raise (OptionError if env.is_main else RefusedOnRankZero)(refusal)
        if env.local_rank != 0:
            self.data_dir = self._ensure_prepared(source)
        self.manifest = m = fdata.read_manifest(self.data_dir)
        self._check_tokens(self.data_dir, m)
        for line in run_data.notes(self.data_dir, m, self.plan.seq_len, c.model):
            self.log(f"fp8lab: {line}")
        if c.save_model and env.is_main and user_tokenizer_differs(c.model, self.data_dir / m["tokenizer"]):
            self.log(f"fp8lab: note: --model's tokenizer maps tokens to other ids than --data's; the run learns "
                     "--data's ids, so the export ships --data's tokenizer (the folder's would decode its outputs "
                     "wrongly)")

    def _check_tokens(self, folder, m) -> None:
        """The prepared tokens serve this run: its task and sequence length, the model's vocabulary and the data of
        the checkpoint it resumes (``self.resumes``); new tokens are checked before they replace the cache's."""
        c, mcfg = self.c, self.plan.model_config
        run_data.check_prepared(folder, m, self.plan.seq_len, c.task)
        if m["vocab_size"] > mcfg.vocab_size:
            fix = (f"use --model-override vocab_size={m['vocab_size']}" if c.model in MODEL_CONFIGS else
                   f"use a model whose config.json has vocab_size >= {m['vocab_size']}")
            raise ValueError(
                f"--data: its tokenizer has {m['vocab_size']} tokens but {c.model} has vocab_size "
                f"{mcfg.vocab_size}; {fix} or data prepared with a smaller tokenizer")
        if self.resumes is not None:  # the data's identity needs the tokens: compared as soon as they exist
            saved, where, step = self.resumes
            fresume.check(saved, fresume.fingerprint(self.plan, data=fdata.identity(m)), where, step,
                          c.resume_with_new_settings)

    def _ensure_prepared(self, source):
        """The run's prepared folder for its task and model's tokenizer (fp8lab.data.run_data); new tokens are checked
        in a folder beside the cache first, so a refused re-run leaves the run's prepared data as they were."""
        accept = (lambda staged: self._check_tokens(staged, fdata.read_manifest(staged))) if (
            self.env.local_rank == 0) else None  # (the node's other ranks find the tokens it prepared)
        return run_data.ensure_prepared(source, self.paths.data_cache, self.plan.model_config.vocab_size,
                                        model=self.c.model, task=self.c.task, accept=accept)

    def _lock_checkpoints(self) -> None:
        """One run per checkpoint folder too: it rotates and removes what it wrote there, so a second run sharing
        it is refused (rank 0, under the output folder's lock); and a step folder of another tool that this run
        might save over is refused now, not at that save."""
        c, root = self.c, self.paths.checkpoint_dir
        if c.checkpoint_every < 0 and not (c.resume and root.is_dir()):
            return  # it writes no checkpoint and reads none: no folder is made for it
        root.mkdir(parents=True, exist_ok=True)
        self.locks.append(runlock.acquire("--checkpoint-dir", root))
        if c.checkpoint_every >= 0:
            theirs = fckpt.foreign_steps(root, self.plan.total_steps)
            if theirs:
                raise ValueError(f"--checkpoint-dir={str(root)!r} holds {', '.join(theirs[:3])}, not written by "
                                 f"fp8lab, where this run of {self.plan.total_steps} steps may save its own; fp8lab "
                                 "never replaces it; allowed: another --checkpoint-dir, or move that folder away")

    def _build_model(self) -> None:
        """build -> convert -> activation checkpointing -> compile -> master weights -> wrap."""
        c, env, p = self.c, self.env, self.plan
        torch.manual_seed(c.seed)
        model = build_model(c.model, device=env.device, seed=c.seed, config=self._named_shape())
        self.conversion = None
        self._start_te_debug()
        if p.backend is not None:
            flt = edge_blocks_filter(model, c.bf16_edge_blocks) if c.bf16_edge_blocks else None
            model = convert_model(model, backend=p.backend, recipe=p.recipe, fuse=lora_plan.fuses(c), module_filter=flt,
                                  fp8_all_gather=p.fp8_all_gather)
            if p.fp8_lm_head and not p.fused_loss:  # the head over the full logits as the backend's FP8 layer
                model = fp8_lm_head(model)
            self.conversion = model.fp8lab_conversion
        self.lora = flora.apply(model, p) if c.lora_rank else None  # adapters on the converted layers, base frozen
        if self.lora is not None:
            self.log(f"fp8lab: {self.lora.describe()}")
        if p.layout.activation_checkpointing:
            fdist.apply_activation_checkpointing(model, p.backend, self._fp8_context)
        if c.compile:
            fdist.compile_blocks(model)
        if p.fused_loss:  # the LM head computes the loss chunk by chunk (fp8lab.train.fused_loss)
            fused_loss.install(model, self._autocast_dtype(), kernel=p.fused_loss_kernel, fp8=p.fp8_lm_head)
        self.inner = model
        self.master, self.fused_wgrad, self.fp8_params = None, [], []
        if p.master_weights:
            self._make_master_weights(model)
        self.model = fdist.wrap(model, env, c.parallel, param_dtype=p.param_dtype)
        # what the built model can take of the plan's choices (config.json's "built"): kept weights, TE's FP8
        # weight cache (fp8lab.plan.layout.weight_cache: the plan's rule, the memory estimate's too)
        self.keep_weights = bool(p.keep_weights and fdist.keep_gathered_weights(self.model))
        self.weight_cache = bool(p.weight_cache and getattr(model, "supports_weight_cache", False))

    def _named_shape(self):
        """The plan's ModelConfig for build_model: a named shape's; None for a user's folder (built from its own
        files)."""
        return self.plan.model_config if self.c.model in MODEL_CONFIGS else None

    def _start_te_debug(self) -> None:
        """TE's debug API, where the plan chose it to read the FP8 casts: it must be on before the first
        TE module is built, so before the conversion (fp8lab.fp8.te_debug)."""
        p = self.plan
        if p.fp8_stats_every and p.fp8_stats_source == fp8stats.TE_DEBUG and self.env.is_main:
            self.te_debug = te_debug.start(p.fp8_stats_every, p.recipe, self.paths.output_dir / te_debug.LOG_DIR)
            self.log(f"fp8lab: FP8 health statistics: {p.reasons['fp8_stats']}")

    def _make_master_weights(self, model) -> None:
        """bf16 parameters, fp32 masters in the optimizer (fp8lab.train.optim.master_weights); before DDP, which
        buckets gradients by dtype."""
        if memory_modes.get(self.plan.memory_mode).offloaded:  # (pinning it takes a while at 7B)
            self.log(f"fp8lab: --memory offload: pinning {self.plan.layout.memory.host:.1f} GiB of host memory for "
                     "the fp32 master weights and AdamW moments")
        self.master, self.fused_wgrad, self.fp8_params = foptim.master_weights(model, self.plan, self.c,
                                                                               self.env.device)

    def _capture_graphs(self) -> None:
        """Capture the decoder blocks as CUDA graphs where ``--cuda-graphs`` resolved to on (fp8lab.plan.graphs)."""
        p = self.plan
        if not p.graphs.active:
            return
        self.graphs_captured = graphs.capture(self.inner, micro_batch_size=p.micro_batch_size, seq_len=p.seq_len,
                                              fp8=p.fp8, recipe=p.recipe, weight_cache=self.weight_cache)
        self.optimizer.zero_grad(set_to_none=True)  # the capture's warm-up backward wrote into the gradient buffers
        self.log(f"fp8lab: {self.graphs_captured.describe()}")

    def _build_optimizer(self) -> None:
        """AdamW (or the master weights' AdamW) and the LR schedule."""
        c, p = self.c, self.plan
        self.optimizer = self.master if self.master is not None else foptim.make_optimizer(
            self.model, c, self.env.device, sharded=p.sharded)
        self.adamw = self.master.optimizer if self.master is not None else self.optimizer
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.adamw,
                                                           foptim.lr_lambda(c, p.total_steps, p.warmup_steps))

    def _build_components(self) -> None:
        c, env, p = self.c, self.env, self.plan
        self.loader = run_data.loader(self.data_dir, "train", p.seq_len, p.micro_batch_size, seed=c.seed,
                                      rank=env.rank, world_size=p.world_size)
        self.state = TrainState(tokens_per_step=p.tokens_per_step, device=env.device)
        self.guard = NonFiniteGuard(c.max_bad_steps, self.state)
        gpu = p.machine.name
        peak = c.peak_tflops * 1e12 if c.peak_tflops else fmetrics.peak_bf16_flops(gpu)
        flops = model_flops_per_token(p.model_config, p.seq_len, lora_plan.trainable_params(c, p.model_config))
        self.info = RunInfo(c.precision, p.backend_label, p.recipe_kind, self.record.model_name, p.world_size, gpu,
                            peak, flops, p.tokens_per_step)
        self.metrics = StepMetrics(c, env, self.paths.output_dir, self.info)
        self.fingerprint = fresume.fingerprint(p, data=fdata.identity(self.manifest))
        self.checkpointer = Checkpointer(c, env, self.paths, self.model, self.optimizer, {
            "train_state": self.state, "scheduler": self.scheduler, "loader": self.loader}, self.fingerprint, self.log)
        # FP8 health statistics (rank 0 samples its own micro-batch; fp8lab.fp8.stats)
        if self.te_debug is not None:
            self.health = te_debug.attach(self.inner, self.te_debug)
        else:
            self.health = (fp8stats.attach(self.inner, p.backend, p.fp8_stats_every)
                           if p.fp8_stats_every and env.is_main else None)

    def _resume(self) -> None:
        """From the newest complete checkpoint, following new settings where allowed (fp8lab.train.resume)."""
        resumed = self.checkpointer.resume()
        if resumed is None:
            return
        self.resumed_from, new_settings = resumed
        if new_settings:
            c, p = self.c, self.plan
            fresume.apply_new_settings(self.scheduler, c, foptim.lr_lambda(c, p.total_steps, p.warmup_steps),
                                       self.resumed_from)
            self.log(f"fp8lab: resuming step {self.resumed_from} with new settings ("
                     + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in new_settings.items())
                     + "): the new settings from here on")

    def _write_config(self) -> None:
        """config.json and the run's opening lines (the run's record, fp8lab.train.run_record), with what was built."""
        built = {"fp8_weight_cache": self.weight_cache, "fuse_wgrad_accumulation": bool(self.fused_wgrad),
                 "fsdp_keep_weights": self.keep_weights, "adamw_impl": adamw_impl(self.adamw),
                 "cuda_graphs_captured": dataclasses.asdict(self.graphs_captured) if self.graphs_captured else None,
                 **(self.lora.built() if self.lora is not None else {})}
        self.record.write(built=built, sources=self.record.sources(self.manifest, self.inner, self.conversion),
                          resumed_from=self.resumed_from, info=self.info, data_dir=self.data_dir)

    # ------------------------------------------------------------------------------------ one step

    def _fp8_context(self):
        """The backend's FP8 region (FP8 off for BF16 runs on converted layers), from the plan's objects."""
        return self.fp8_backend.autocast(self.plan.recipe, self.plan.fp8) if self.fp8_backend else nullcontext()

    def _autocast_dtype(self):
        """The dtype of the non-FP8 math's autocast (the plan's compute dtype), or None where none runs (fp32)."""
        return torch.bfloat16 if self.plan.compute_dtype == "bf16" else None

    def _forward(self, x, is_first_microbatch: bool | None = None, targets=None):
        """The model's forward (logits; with ``targets`` under ``--fused-loss``, the mean loss), in the compute
        dtype's autocast and the backend's FP8 region: the one place the model is called (training and validation)."""
        dtype = self._autocast_dtype()  # (a disabled autocast keeps bf16 as its dtype, as it always had)
        amp = torch.autocast(self.env.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)
        with amp, self._fp8_context(), fused_loss.targets(self.inner, targets):
            kw = {} if is_first_microbatch is None else {"is_first_microbatch": is_first_microbatch}
            return self.model(x, **kw).logits

    @staticmethod
    def _plain_loss(logits, y):
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))

    def _loss(self, x, y, is_first_microbatch: bool | None = None):
        """Mean loss of one micro-batch: the LM head's chunked loss under ``--fused-loss`` (fp8lab.train.fused_loss:
        the full logits never exist), else the cross-entropy of the model's fp32 logits."""
        if self.plan.fused_loss:
            return self._forward(x, is_first_microbatch, targets=y)
        return self._plain_loss(self._forward(x, is_first_microbatch), y)

    def _forward_backward(self, x, y, micro: int, step: int):
        """Loss of one micro-batch, its gradient accumulated; TE's weight cache filled on the first."""
        loss = self._loss(x, y, micro == 0 if self.weight_cache else None)
        if step in self.c.inject_nan_at_steps and self.env.is_main and micro == 0:
            loss = loss * float("nan")  # test hook: what an FP8 overflow does to a step
        (loss / self.plan.grad_accum).backward()
        fp8w.drop_transposes(self.fp8_params)  # (--fp8-weights primary: the next forward needs only their rows)
        return loss

    def calibrate_fp8(self) -> None:
        """One forward and backward on step 1's first micro-batch, gradients dropped, loader rewound: delayed scaling
        casts with scales from earlier steps' amax, and TE starts a new run's at 1.0, where many gradient elements fall
        below E5M2's smallest value (2^-16). Step 1 then casts with measured scales, as later steps do."""
        kind = self.plan.recipe_kind
        if not (self.c.fp8_calibrate and kind and RECIPE_KINDS[kind].history and self.state.step == 0):
            return  # resumed: the checkpoint's history; current and block scaling keep none
        position = self.loader.state_dict()
        x, y = (t.to(self.env.device, non_blocking=True) for t in self.loader.next_batch())
        with fdist.gradient_sync(self.model, True, self.keep_weights):
            # scaled as a step's micro-batch is: the gradients' amax is what step 1's will be
            (self._loss(x, y, True if self.weight_cache else None) / self.plan.grad_accum).backward()
        fp8w.drop_transposes(self.fp8_params)
        if self.weight_cache:
            self.inner.release_weight_cache()
        self.optimizer.zero_grad(set_to_none=True)
        self.loader.load_state_dict(position)

    def train_step(self, step: int) -> StepResult:
        """Forward/backward over the micro-batches, clip, and the update unless the guard skips it."""
        env, accum = self.env, self.plan.grad_accum
        lr = self.optimizer.param_groups[0]["lr"]
        if self.health is not None:
            self.health.begin(step)
        loss_sum = torch.zeros((), device=env.device, dtype=torch.float32)
        for micro in range(accum):
            x, y = (t.to(env.device, non_blocking=True) for t in self.loader.next_batch())
            with fdist.gradient_sync(self.model, micro == accum - 1, self.keep_weights):
                loss_sum += self._forward_backward(x, y, micro, step).detach()
        if self.weight_cache:
            self.inner.release_weight_cache()
        if self.health is not None:
            self._health_record(step)
        grad_norm = self._clip()
        # one all-reduce: mean loss over ranks, and whether any rank got SIGTERM
        packed = torch.stack([loss_sum / accum, torch.tensor(float(self.stop.set), device=env.device)])
        fdist.all_reduce_sum(packed, env)
        result = StepResult(loss=float(packed[0]) / self.plan.world_size, grad_norm=float(grad_norm), lr=lr,
                            skipped=False, stop=bool(packed[1] > 0))
        result.skipped = self.guard.skip(result.loss, result.grad_norm)
        if not result.skipped:  # the FP8 overflow guard drops the update and keeps the weights
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return result

    def _health_record(self, step: int) -> None:
        """The sampled step's FP8 statistics into metrics.jsonl; its early warnings into the log."""
        rec = self.health.end(step)
        if rec is None:
            return
        self.metrics.write_record(rec)
        for line in rec.get("warnings", []):
            self.metrics.emit(f"fp8lab: {line}")

    def _clip(self):
        max_norm = self.c.grad_clip if self.c.grad_clip > 0 else float("inf")
        if self.master is not None:  # fp32 copies of the bf16 gradients, clipped; the norm is theirs
            grad_norm = self.master.clip_grad_norm_(max_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm

    def _validate(self, step: int) -> float | None:
        """:meth:`evaluate`, or None when it fails (out of memory, a kernel error): a failed evaluation never costs
        the training, so the reason is logged and kept (``val_error``) and the run goes on."""
        why = None
        try:
            return self.evaluate()
        except (RuntimeError, torch.OutOfMemoryError) as exc:  # (OutOfMemoryError is a RuntimeError; named for readers)
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        self.model.train()  # (outside the handler: the failed pass's tensors are freed with the exception)
        if self.env.device.type == "cuda":
            torch.cuda.empty_cache()
        why = fdist.broadcast_object(why, self.env)
        self.val_error = why
        self.metrics.emit(f"fp8lab: the evaluation at step {step} failed ({why}); training goes on, its "
                          f"val_loss is missing")
        return None

    def evaluate(self) -> float:
        """Mean validation loss over ``--val-batches`` global batches: the same windows at any layout."""
        c, env, p = self.c, self.env, self.plan
        vl = run_data.loader(self.data_dir, "val", p.seq_len, p.micro_batch_size, seed=0, rank=env.rank,
                             world_size=p.world_size, shuffle=False)
        self.model.eval()
        total = torch.zeros((), device=env.device, dtype=torch.float64)
        with torch.no_grad():
            for _ in range(c.val_batches * p.grad_accum):
                x, y = (t.to(env.device) for t in vl.next_batch())
                total += self._loss(x, y).double()
        self.model.train()
        # the eval forwards left the weights gathered: shard them before a checkpoint or the next step
        if self.keep_weights:
            fdist.reshard(self.model)
        fdist.all_reduce_sum(total, env)
        return float(total) / (c.val_batches * p.grad_accum * p.world_size)

    # ------------------------------------------------------------------------------------ the loop

    def fit(self) -> tuple[str, str | None]:
        """Train to the last step, or until SIGTERM, the non-finite guard or a failed checkpoint stops
        the run; (status, message). metrics.jsonl is complete whatever stops it."""
        c, env, state, total = self.c, self.env, self.state, self.plan.total_steps
        first = state.step + 1
        self.stop.install()
        self.metrics.open(total, first, self.resumed_from)
        profiler = StepProfiler(c.profile_steps, total, first, env.device, self.paths.output_dir,
                                env.is_main, self.metrics.emit)
        status, message = "completed", None
        self.model.train()
        try:
            self.calibrate_fp8()
            for step in range(first, total + 1):
                profiler.start(step)
                self.metrics.start()
                r = self.train_step(step)
                dt = self.metrics.stop()
                state.advance()
                profiled = profiler.done(step, dt)
                last = step == total
                failed = saved = None
                if last and not self.guard.stop:  # the last step is kept before its evaluation, which may fail
                    failed = self.checkpointer.maybe_save(step, last=True, stopping=r.stop, healthy=self.guard.healthy)
                    saved = True
                val = None
                if not failed and ((c.val_every and step % c.val_every == 0) or (last and not r.skipped)):
                    val = self._validate(step)
                    if last:
                        self.last_val = val
                self.metrics.record(state, r, dt, profiled=profiled, val_loss=val,
                                    skip_line=self.guard.skip_line(step) if r.skipped else None)
                if self.guard.stop:
                    status, message = "stopped_nonfinite", self.guard.stop_message(step)
                    break
                if not saved:
                    failed = self.checkpointer.maybe_save(step, last=last, stopping=r.stop, healthy=self.guard.healthy)
                if failed and self.stop.forced:  # the second Ctrl-C landed in the save (torch wraps it): stop at once
                    raise KeyboardInterrupt
                if r.stop:
                    status = "interrupted"
                    message = (f"fp8lab: {self.stop.name} received: checkpoint written at step {step}; exiting (a "
                               "restart resumes here)" if self.checkpointer.every >= 0 else
                               rerun.unsaved_stop(self.stop.name, step, c, self.paths, self.env.is_main))
                if failed:
                    status, message = "checkpoint_failed", self.checkpointer.failure_message(step, failed)
                if r.stop or failed:
                    break
            if status == "completed" and self.val_error is not None and self.last_val is None:
                status = "eval_failed"
                message = rerun.eval_failed(self.val_error, c, self.checkpointer.every >= 0)
        finally:
            profiler.close()
            self.metrics.close()
            self.stop.uninstall()
        if status == "completed" and state.step and state.nonfinite_steps >= state.step:
            status, message = "stopped_nonfinite", self.guard.nothing_trained_message(state.step)
        return status, message

    # ------------------------------------------------------------------------------------ the end

    def finish(self, status: str, message: str | None) -> dict[str, Any]:
        """Export the model (a completed run), write summary.json and loss.png, print the stop message.

        A run that was already complete (resumed at its last step) keeps its summary.json; an export or
        summary that cannot be written is status ``export_failed``/``summary_failed`` (exit code 4), the
        weights then kept in a checkpoint of the last step."""
        c, env, total = self.c, self.env, self.plan.total_steps
        if self.finished is not None:
            self.log(f"fp8lab: the run in {self.paths.output_dir.name!r} is complete (step {total} of "
                     f"{total}); config.json, summary.json, metrics.jsonl and the model are kept as they are")
            return self.finished
        if status == "completed" and self.resumed_from == total:
            self.last_val = self._validate(total)  # finished before, its export or summary missing: written now
            if self.last_val is None:
                status = "eval_failed"
                message = (f"fp8lab: the final evaluation failed again ({self.val_error}); the model is exported "
                           "without it")
        if status in ("completed", "eval_failed") and c.save_model:
            with stopping_at_once(signal.SIGTERM):  # (fit's handler is gone: a SIGTERM here ends in one line too)
                failed = self._export()
            if failed:
                status, message = "export_failed", failed
        summary = self.metrics.summary(self.paths, status, message, self.state, total, self.last_val,
                                       self.resumed_from, time.perf_counter() - self.wall0)
        summary["val_error"] = self.val_error  # why the (last) evaluation failed; None: every one ran
        if env.is_main:
            done = [s for s, _ in fckpt.complete_checkpoints(self.paths.checkpoint_dir)]
            failed = self.metrics.write_summary(summary, plot=c.plot, checkpoints=done)
            if failed:
                summary.update(status="summary_failed", message=failed)
            if summary["message"]:
                print(summary["message"], file=sys.stderr if status != "interrupted" else sys.stdout, flush=True)
        # leave together: a rank tearing down its process group while rank 0 still writes can abort gloo
        fdist.barrier(env)
        return summary

    def _finished_summary(self) -> dict[str, Any] | None:
        """summary.json of this run when it already completed and exported (rank 0), else None."""
        if not self.env.is_main:
            return None
        try:
            done = json.loads((self.paths.output_dir / "summary.json").read_text())
        except (OSError, ValueError):
            return None
        complete = (isinstance(done, dict) and done.get("status") == "completed"
                    and done.get("steps") == self.plan.total_steps)
        exported = not self.c.save_model or (done.get("model_dir") is not None
                                             and (self.paths.model_dir / flora.exported_file(self.c)).is_file())
        return done if complete and exported else None

    def _export(self) -> str | None:
        """The final HF model; None, or (after a failure, the weights kept in a checkpoint) why it failed."""
        env, step = self.env, self.state.step
        why = None
        try:
            run = ownership.run_id(self.paths.output_dir)
            if self.lora is None:
                fexport.save_hf_model(self.model, self.inner, self.conversion, self.plan, self.paths.model_dir,
                                      self.data_dir, env, master=self.master, run=run)
            else:  # the adapter folder (and, asked, the merged model)
                flora.export(self.lora, self.model, self.inner, self.plan, self.paths.model_dir, self.data_dir, env,
                             master=self.master, run=run)
        except (OSError, ValueError, *fexport.WRITE_ERRORS) as exc:  # e.g. disk full: the staged files are removed
            why = fresume.failure_reason(exc)
        why = fdist.broadcast_object(why, env)
        if why is None:
            return None
        newest = fdist.broadcast_object([s for s, _ in fckpt.complete_checkpoints(self.paths.checkpoint_dir)][:1], env)
        kept_failed = self.checkpointer.save(step) if newest != [step] else None
        shown = lambda p: fpaths.shareable_path(str(p), self.paths.output_dir)  # noqa: E731
        head = f"fp8lab: exporting the model to --model-dir {shown(self.paths.model_dir)!r} failed ({why})"
        if kept_failed:
            return f"{head}; keeping the weights in a checkpoint failed too ({kept_failed}): free space and train again"
        return (f"{head}; the trained weights are kept in checkpoint step_{step:08d} of --checkpoint-dir "
                f"{shown(self.paths.checkpoint_dir)!r}: re-run the same command to export them")

    def close(self) -> None:
        """Release the output folder's lock and TE's debug API session (idempotent)."""
        if self.te_debug is not None:
            self.te_debug.close()
            self.te_debug = None
        while self.locks:
            self.locks.pop().release()


@contextmanager
def setup_errors(paths, env) -> Iterator[None]:
    """Inside: a ValueError means the run cannot start as configured. It becomes an OptionError,
    and the folders this run would have created are removed (a refused run leaves nothing)."""
    new = [d for d in (paths.output_dir, paths.checkpoint_dir, paths.model_dir, paths.data_cache) if not d.exists()]
    try:
        yield
    except ValueError as exc:
        if env.local_rank == 0:
            for d in new:
                shutil.rmtree(d, ignore_errors=True)
        if isinstance(exc, OptionError):
            raise
        raise OptionError(str(exc)) from exc


def plan_here(c, env):
    """The run's plan on this process's machine (fp8lab.plan.runplan.plan_run on the detected device)."""
    return plan_run(c, detect_machine(env.device, env.world_size, c.gpu_memory_gib))


def run(c, env, argv: list[str] | None = None, expected: dict[str, Any] | None = None,
        replayed_from: str | None = None) -> dict[str, Any]:
    """Check the folders and data, plan the run here, set up (a ValueError in any of it is an OptionError:
    the run cannot start as configured), then train. The output folder's lock is released however it ends.

    ``expected``: the decisions of the plan made for this run elsewhere (a SageMaker job's, made at
    launch for the instance it planned); a plan here that differs is refused, naming each decision."""
    paths = frun_paths.resolve_paths(c)
    trainer = None
    try:
        with setup_errors(paths, env):
            source = frun_paths.data_source(c)
            # folders writable, data readable: before any compute
            frun_paths.check_run(c, paths, source, scan_tokens=False)
            ftrackers.check_available(c.tracker)  # --tracker's package importable: before any compute
            scan_data_once(source, env)  # every token id of a prepared --data: read by rank 0, decided for all
            folder = c.model if is_user_model(c.model) and not c.model.startswith("hf:") else None
            # a folder another live run holds: said first (its half-written step folder is no stranger's file)
            for option, where in (("--output-dir", paths.output_dir), ("--checkpoint-dir", paths.checkpoint_dir)):
                runlock.refuse_in_use(option, where)
            # every rank has looked before rank 0 takes the folders' locks (Trainer.setup): a rank slower than rank 0
            # would otherwise find its own run's lock and refuse the folder as another run's
            fdist.barrier(env)
            # no overlaps, nothing of the user's overwritten
            ownership.check_run_folders(c, paths, source, model_folder=folder)
            plan = plan_here(c, env)
            if expected:
                check_same_plan(plan, expected)
            trainer = Trainer(plan, env, argv, replayed_from=replayed_from)
            dry = trainer.setup()
        if dry is not None:
            return dry
        status, message = trainer.fit()
        return trainer.finish(status, message)
    finally:
        if trainer is not None:
            trainer.close()


def scan_data_once(source, env) -> None:
    """The token-id scan of a prepared ``--data`` (fp8lab.data.checks.scan_token_ids: every shard read, about a
    second per GB) on rank 0 only; its outcome is broadcast, so every rank refuses alike or none does."""
    why = None
    if env.is_main:
        try:
            data_checks.scan_token_ids(source)
        except ValueError as exc:
            why = str(exc)
    why = fdist.broadcast_object(why, env)
    if why:
        raise ValueError(why)


def check_same_plan(plan, expected: dict[str, Any]) -> None:
    """Refuse a run whose plan here differs from the one it was launched with (``RunPlan.decisions()``)."""
    diff = plan.differences(expected)
    if diff:
        listed = ", ".join(f"{k}: {a!r} planned, {b!r} here" for k, (a, b) in diff.items())
        raise ValueError(f"this machine plans the run differently from the launch ({listed}); the job runs what "
                         "was planned or nothing: set these options explicitly, or plan for this machine")
