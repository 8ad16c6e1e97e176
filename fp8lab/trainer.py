"""The training run as a ``Trainer``: ``setup``, then ``fit`` (the loop over ``train_step``), then ``finish``.

    trainer = Trainer(config, env, argv)
    with trainer.setup_errors():   # a ValueError here is an OptionError; new folders are removed
        trainer.setup()            # checks, layout, data, model, optimizer, resume, config.json
    status, message = trainer.fit()
    summary = trainer.finish(status, message)

Set-up order (as torchtitan): build the HF model, convert it for FP8, activation checkpointing,
compile each block, fp32 master weights (``--param-dtype bf16``), shard (FSDP2) or wrap (DDP), the
optimizer, resume, and last the CUDA graphs of the blocks (``--cuda-graphs``, fp8lab.graphs), which
read the resumed weights and FP8 scaling state in place.
The loop only calls components (fp8lab.components): the step metrics, the profiler, the
non-finite guard and the checkpointer. FP8 is the backend's autocast region around
:meth:`Trainer._forward` (the one place the model is called) plus the backend's optional
``after_optimizer_step``, called after every optimizer step the guard lets through.
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import time
from contextlib import contextmanager, nullcontext
from typing import Any, Iterator

from fp8lab import data as fdata
from fp8lab import distributed as fdist
from fp8lab import metrics as fmetrics
from fp8lab import paths as fpaths
from fp8lab import resume as fresume
from fp8lab import train as ftrain
from fp8lab import validate as fvalidate
from fp8lab.components import (Checkpointer, NonFiniteGuard, RunInfo, StepMetrics, StepProfiler, StepResult, StopFlag,
                               TrainState)


class Trainer:
    """One training run of ``TrainConfig`` ``c`` on the process group ``env`` (see the module doc)."""

    def __init__(self, c, env, argv: list[str] | None = None):
        self.c, self.env, self.argv = c, env, argv
        self.paths = ftrain.resolve_paths(c)
        self.log = print if env.is_main else (lambda *a, **k: None)
        self.wall0 = time.perf_counter()
        self.resumed_from: int | None = None
        self.last_val: float | None = None
        self.stop = StopFlag()  # SIGTERM seen; fit() installs and uninstalls its handler

    # ------------------------------------------------------------------------------------ set-up

    @contextmanager
    def setup_errors(self) -> Iterator[None]:
        """Inside: a ValueError means the run cannot start as configured. It becomes an OptionError,
        and the folders this run would have created are removed (a refused run leaves nothing)."""
        p = self.paths
        new = [d for d in (p.output_dir, p.checkpoint_dir, p.model_dir, p.data_cache) if not d.exists()]
        try:
            yield
        except ValueError as exc:
            if self.env.local_rank == 0:
                for d in new:
                    shutil.rmtree(d, ignore_errors=True)
            if isinstance(exc, ftrain.OptionError):
                raise
            raise ftrain.OptionError(str(exc)) from exc

    def setup(self) -> dict[str, Any] | None:
        """Everything before the first step; returns the dry-run summary under ``--dry-run``, else None."""
        self._plan()
        if self.c.dry_run:
            return self._dry_run_summary()
        self._cap_gpu_memory()
        self._prepare_data()
        self._build_model()
        self._build_optimizer()
        self._build_components()
        self._resume()
        self._capture_graphs()
        if self.env.is_main:
            self._write_config()
        return None

    def _plan(self) -> None:
        """Checks that need no data or model, the backend and the layout for this machine."""
        from fp8lab import layout as flayout
        from fp8lab.hardware import Machine
        from fp8lab.models import get_config

        c, env = self.c, self.env
        fvalidate.check_run(c, self.paths, ftrain.data_source(c))  # folders writable, data readable: before any compute
        self.mcfg = get_config(c.model, **c.model_overrides)
        self.machine = Machine.detect(env.device, env.world_size, c.gpu_memory_gib)
        self.backend, self.recipe = ftrain.resolve_fp8(c, te_usable=self.machine.te_usable)  # errors before any compute
        if c.backend == "auto":  # an explicit backend was checked with the options (TrainConfig)
            ftrain.fused_check(c, self.backend)
        self.requested = {k: getattr(c, k) for k in flayout.AUTO_FIELDS}
        self.c, self.layout, self.total_steps, self.warmup = ftrain.preflight(c, self.machine, self.backend, self.mcfg)
        c = self.c
        self.log(f"fp8lab: {self.layout.header()}")
        self.graphs = ftrain.graphs_decision(c, self.machine, self.backend, self.layout, self.mcfg)
        if self.machine.gpu or c.cuda_graphs != "auto":  # on a CPU auto is always off: nothing to say
            self.log(f"fp8lab: {self.graphs.describe()}")
        self.graphs_captured = None
        self.world = env.world_size
        self.tokens_per_step = c.tokens_per_micro_batch * c.grad_accum * self.world
        self.fp8_on = c.precision == "fp8"
        self.compute_dtype = c.compute_dtype if c.compute_dtype != "auto" else ("bf16" if env.device.type == "cuda" else "fp32")
        self.sharded = env.distributed and c.parallel == "fsdp"  # FSDP2 really shards (torchrun, several ranks)

    @property
    def model_name(self) -> str:
        """--model as step records, logs and summaries show it: never an absolute machine path (fp8lab.paths)."""
        return fpaths.shareable_path(self.c.model, self.paths.output_dir)

    def _dry_run_summary(self) -> dict[str, Any]:
        c, lay = self.c, self.layout
        return {"status": "dry_run", "model": self.model_name, "precision": c.precision, "backend": self.backend or "none",
                "world_size": self.env.world_size, "gpu_name": self.machine.name, **lay.options(),
                "cuda_graphs": self.graphs.active, "memory_estimate_gib": round(lay.memory.peak, 1), "memory_gib": round(self.machine.memory_gib, 1),
                "reasons": lay.reasons}

    def _cap_gpu_memory(self) -> None:
        import torch

        if self.c.gpu_memory_gib and self.env.device.type == "cuda":  # emulate a smaller GPU (e.g. P5's H100 80 GB on an H200)
            total = torch.cuda.get_device_properties(self.env.device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, self.c.gpu_memory_gib * 2**30 / total), self.env.device)

    def _prepare_data(self) -> None:
        """Tokenized once per node (deterministic, so every node gets the same shards), then checked."""
        from fp8lab.models import MODEL_CONFIGS

        c, env, mcfg = self.c, self.env, self.mcfg
        source = ftrain.data_source(c)
        if env.local_rank == 0:
            self.paths.output_dir.mkdir(parents=True, exist_ok=True)
            self.data_dir = fdata.ensure_prepared(source, self.paths.data_cache, mcfg.vocab_size)
        fdist.barrier(env)
        if env.local_rank != 0:
            self.data_dir = fdata.ensure_prepared(source, self.paths.data_cache, mcfg.vocab_size)
        self.manifest = m = fdata.read_manifest(self.data_dir)
        fvalidate.check_prepared_size(m, c.seq_len)
        if m["vocab_size"] > mcfg.vocab_size:
            fix = (f"use --model-override vocab_size={m['vocab_size']}" if c.model in MODEL_CONFIGS else
                   f"use a model whose config.json has vocab_size >= {m['vocab_size']}")
            raise ValueError(
                f"--data: its tokenizer has {m['vocab_size']} tokens but {c.model} has vocab_size "
                f"{mcfg.vocab_size}; {fix} or data prepared with a smaller tokenizer")

    def _build_model(self) -> None:
        """build -> convert -> activation checkpointing -> compile -> master weights -> wrap."""
        import torch

        from fp8lab.convert import convert_model, edge_blocks_filter
        from fp8lab.models import build_model

        c, env = self.c, self.env
        torch.manual_seed(c.seed)
        model = build_model(c.model, device=env.device, seed=c.seed, **c.model_overrides)
        self.conversion = None
        if self.backend is not None:
            flt = edge_blocks_filter(model, c.bf16_edge_blocks) if c.bf16_edge_blocks else None
            model = convert_model(model, backend=self.backend, recipe=self.recipe, fuse=c.fuse, module_filter=flt)
            self.conversion = model.fp8lab_conversion
        if c.activation_checkpointing:
            ftrain.apply_activation_checkpointing(model, self.backend, self._fp8_context)
        if c.compile:
            _compile_blocks(model)
        self.inner = model
        self.master, self.fused_wgrad = None, []
        if c.param_dtype == "bf16" and not self.sharded:
            self._make_master_weights(model)
        self.model = fdist.wrap(model, env, c.parallel, param_dtype=c.param_dtype)
        self.keep_weights = bool(self.sharded and c.fsdp_keep_weights and c.grad_accum > 1
                                 and fdist.keep_gathered_weights(self.model))
        # TE's FP8 weight cache: the first micro-batch of a step quantises the weights, the others reuse
        # them (they cannot change before optimizer.step()). Under FSDP2 only with the weights kept
        # gathered for the whole step (the layout tested on two GPUs), not with per-micro-batch gathers
        self.weight_cache = bool(c.fp8_weight_cache and self.fp8_on and c.grad_accum > 1
                                 and getattr(model, "supports_weight_cache", False)
                                 and (self.keep_weights or not self.sharded))

    def _make_master_weights(self, model) -> None:
        """bf16 parameters, fp32 masters in the optimizer; before DDP, which buckets gradients by dtype."""
        from fp8lab.master_weights import MasterWeights

        c, env = self.c, self.env
        # Under CUDA graphs the streamed step: main_grad buffers zeroed in place (a graph writes to fixed
        # addresses), and no full fp32 gradient copy at the step, which the graphs' resident activations need
        self.master = MasterWeights(model, lambda params: ftrain.make_optimizer(params, c, env.device),
                                    streamed=self.graphs.active)
        # DDP all-reduces .grad through hooks that main_grad would bypass: one process only
        if (c.fuse_wgrad_accumulation and not env.distributed
                and hasattr(model, "wgrad_into_main_grad")):
            self.fused_wgrad = model.wgrad_into_main_grad()
            if self.fused_wgrad:
                self.master.use_main_grad(self.fused_wgrad)

    def _capture_graphs(self) -> None:
        """Capture the decoder blocks as CUDA graphs where ``--cuda-graphs`` resolved to on (fp8lab.graphs)."""
        if not self.graphs.active:
            return
        from fp8lab import graphs

        c = self.c
        self.graphs_captured = graphs.capture(self.inner, micro_batch_size=c.micro_batch_size, seq_len=c.seq_len,
                                              fp8=self.fp8_on, recipe=self.recipe, weight_cache=self.weight_cache)
        self.optimizer.zero_grad(set_to_none=True)  # the capture's warm-up backward wrote into the gradient buffers
        self.log(f"fp8lab: {self.graphs_captured.describe()}")

    def _build_optimizer(self) -> None:
        """AdamW (or the master weights' AdamW) and the LR schedule."""
        import torch

        c = self.c
        self.optimizer = self.master if self.master is not None else ftrain.make_optimizer(
            self.model, c, self.env.device, sharded=self.sharded)
        self.adamw = self.master.optimizer if self.master is not None else self.optimizer
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.adamw, ftrain.lr_lambda(c, self.total_steps, self.warmup))

    def _build_components(self) -> None:
        from fp8lab.models import model_flops_per_token

        c, env = self.c, self.env
        self.loader = fdata.TokenLoader(self.data_dir, "train", c.seq_len, c.micro_batch_size, seed=c.seed,
                                        rank=env.rank, world_size=self.world)
        self.state = TrainState(tokens_per_step=self.tokens_per_step, device=env.device)
        self.guard = NonFiniteGuard(c.max_bad_steps, self.state)
        self.gpu_name = self.machine.name
        peak = c.peak_tflops * 1e12 if c.peak_tflops else fmetrics.peak_bf16_flops(self.gpu_name)
        self.info = RunInfo(c.precision, self.backend or "none", self.recipe.kind if (self.recipe and self.fp8_on) else None,
                            self.model_name, self.world, self.gpu_name, peak, model_flops_per_token(self.mcfg, c.seq_len),
                            self.tokens_per_step)
        self.metrics = StepMetrics(c, env, self.paths.output_dir, self.info)
        self.fingerprint = fresume.fingerprint(c, self.world, self.total_steps, self.warmup)
        self.checkpointer = Checkpointer(c, env, self.paths, self.model, self.optimizer,
                                         {"train_state": self.state, "scheduler": self.scheduler, "loader": self.loader},
                                         self.fingerprint, self.log)

    def _resume(self) -> None:
        """From the newest complete checkpoint, following new settings where allowed (fp8lab.resume)."""
        resumed = self.checkpointer.resume()
        if resumed is None:
            return
        self.resumed_from, new_settings = resumed
        if new_settings:
            c = self.c
            fresume.apply_new_settings(self.scheduler, c, ftrain.lr_lambda(c, self.total_steps, self.warmup), self.resumed_from)
            self.log(f"fp8lab: resuming step {self.resumed_from} with new settings ("
                     + ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in new_settings.items()) + "): the new schedule from here on")

    def _write_config(self) -> None:
        """config.json (options, what they resolved to, provenance) and the run's opening log lines."""
        from fp8lab.models import count_parameters

        c, i, lay = self.c, self.info, self.layout
        cfg_record = {**c.as_dict(), **self._resolved(), "flops_per_token": i.flops_per_token,
                      "params": count_parameters(self.mcfg).total, **self._sources(),
                      "resumed_from_step": self.resumed_from, "requested_layout": self.requested,
                      "layout": {"reasons": lay.reasons, "memory_estimate_gib": dataclasses.asdict(lay.memory),
                                 "memory_estimate_peak_gib": lay.memory.peak, "memory_gib": self.machine.memory_gib},
                      **fmetrics.provenance(i.gpu_name, self.world, self.argv)}
        cfg_record.update(fpaths.shareable_run_record(c.as_dict(), ftrain.TrainConfig().as_dict(), self.argv,
                                                      self.paths.output_dir,
                                                      ("model", "data", "output_dir", "checkpoint_dir", "model_dir")))
        (self.paths.output_dir / "config.json").write_text(json.dumps(cfg_record, indent=2, default=str) + "\n")
        self._log_start()

    def _resolved(self) -> dict[str, Any]:
        return {"backend_resolved": self.info.backend, "recipe_resolved": self.recipe.describe() if self.recipe else None,
                "total_steps": self.total_steps, "warmup_steps_resolved": self.warmup,
                "compute_dtype_resolved": self.compute_dtype, "tokens_per_step": self.tokens_per_step,
                "fp8_weight_cache_active": self.weight_cache, "fuse_wgrad_accumulation_active": bool(self.fused_wgrad),
                "fsdp_keep_weights_active": self.keep_weights, "adamw_impl": _adamw_impl(self.adamw),
                "cuda_graphs_active": self.graphs.active, "cuda_graphs_reason": self.graphs.reason,
                "cuda_graphs_captured": dataclasses.asdict(self.graphs_captured) if self.graphs_captured else None}

    def _sources(self) -> dict[str, Any]:
        from fp8lab import user_model

        m = self.manifest
        return {"model_source": {**user_model.describe(self.c.model), "params_built": sum(p.numel() for p in self.inner.parameters())},
                "conversion": dataclasses.asdict(self.conversion) if self.conversion is not None else None,
                "data_manifest": {k: m[k] for k in ("source", "vocab_size", "tokenizer_sha256")}}

    def _log_start(self) -> None:
        from fp8lab.models import count_parameters

        c, i, log = self.c, self.info, self.log
        layers = (f" via {i.backend} ({self.recipe.describe()})" if self.fp8_on and self.backend
                  else (f" on {i.backend} layers, FP8 off" if self.backend else ""))
        log(f"fp8lab: {self.model_name} ({count_parameters(self.mcfg).total / 1e6:.1f}M params) | {c.precision}{layers}"
            f" | {self.world} x {i.gpu_name} | {c.parallel if self.world > 1 else 'single process'} | "
            f"{self.total_steps} steps x {self.tokens_per_step} tokens")
        log(f"fp8lab: {fdata.describe(self.data_dir)}")
        if i.peak:
            log(f"fp8lab: MFU = model FLOPs / dense BF16 peak of {i.gpu_name} ({i.peak / 1e12:.0f} TFLOP/s), for BF16 and FP8 runs alike")
        else:
            log(f"fp8lab: MFU not computed on {i.gpu_name} (no dense BF16 peak known): null in metrics.jsonl, 0 in log lines")
        if self.resumed_from is not None:
            log(f"fp8lab: resumed from checkpoint at step {self.resumed_from} ({self.paths.checkpoint_dir.name}/)")
        if c.inject_nan_at_steps:
            log(f"fp8lab: TEST HOOK: NaN loss injected at steps {list(c.inject_nan_at_steps)}")

    # ------------------------------------------------------------------------------------ one step

    def _fp8_context(self):
        from fp8lab.convert import autocast as fp8_autocast

        return fp8_autocast(self.backend, self.recipe, enabled=self.fp8_on) if self.backend else nullcontext()

    def _forward(self, x, is_first_microbatch: bool | None = None):
        """The model's forward (logits), in the compute dtype's autocast and the backend's FP8 region:
        the one place the model is called (training and validation)."""
        import torch

        amp = torch.autocast(self.env.device.type, dtype=torch.bfloat16, enabled=self.compute_dtype == "bf16")
        with amp, self._fp8_context():
            kw = {} if is_first_microbatch is None else {"is_first_microbatch": is_first_microbatch}
            return self.model(x, **kw).logits

    @staticmethod
    def _loss(logits, y):
        import torch.nn.functional as F

        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))

    def _forward_backward(self, x, y, micro: int, step: int):
        """Loss of one micro-batch, its gradient accumulated; TE's weight cache filled on the first."""
        loss = self._loss(self._forward(x, micro == 0 if self.weight_cache else None), y)
        if step in self.c.inject_nan_at_steps and self.env.is_main and micro == 0:
            loss = loss * float("nan")  # test hook: what an FP8 overflow does to a step
        (loss / self.c.grad_accum).backward()
        return loss

    def train_step(self, step: int) -> StepResult:
        """Forward/backward over the micro-batches, clip, and the update unless the guard skips it."""
        import torch

        from fp8lab.convert import after_optimizer_step

        c, env = self.c, self.env
        lr = self.optimizer.param_groups[0]["lr"]
        loss_sum = torch.zeros((), device=env.device, dtype=torch.float32)
        for micro in range(c.grad_accum):
            x, y = (t.to(env.device, non_blocking=True) for t in self.loader.next_batch())
            with fdist.gradient_sync(self.model, micro == c.grad_accum - 1, self.keep_weights):
                loss_sum += self._forward_backward(x, y, micro, step).detach()
        if self.weight_cache:
            self.inner.release_weight_cache()
        grad_norm = self._clip()
        # one all-reduce: mean loss over ranks, and whether any rank got SIGTERM
        packed = torch.stack([loss_sum / c.grad_accum, torch.tensor(float(self.stop.set), device=env.device)])
        fdist.all_reduce_sum(packed, env)
        result = StepResult(loss=float(packed[0]) / self.world, grad_norm=float(grad_norm), lr=lr, skipped=False,
                            stop=bool(packed[1] > 0))
        result.skipped = self.guard.skip(result.loss, result.grad_norm)
        if not result.skipped:  # the FP8 overflow guard drops the update and keeps the weights
            self.optimizer.step()
            if self.backend:  # e.g. FP8 scales of the new weights (a backend's optional hook)
                after_optimizer_step(self.inner)
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return result

    def _clip(self):
        import torch

        max_norm = self.c.grad_clip if self.c.grad_clip > 0 else float("inf")
        if self.master is not None:  # fp32 copies of the bf16 gradients, clipped; the norm is theirs
            grad_norm = self.master.clip_grad_norm_(max_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm

    def evaluate(self) -> float:
        """Mean validation loss over ``--val-batches`` global batches: the same windows at any layout."""
        import torch

        c, env = self.c, self.env
        vl = fdata.TokenLoader(self.data_dir, "val", c.seq_len, c.micro_batch_size, seed=0, rank=env.rank,
                               world_size=self.world, shuffle=False)
        self.model.eval()
        total = torch.zeros((), device=env.device, dtype=torch.float64)
        with torch.no_grad():
            for _ in range(c.val_batches * c.grad_accum):
                x, y = (t.to(env.device) for t in vl.next_batch())
                total += self._loss(self._forward(x), y).double()
        self.model.train()
        if self.keep_weights:  # the eval forwards left the weights gathered: shard them before a checkpoint or the next step
            fdist.reshard(self.model)
        fdist.all_reduce_sum(total, env)
        return float(total) / (c.val_batches * c.grad_accum * self.world)

    # ------------------------------------------------------------------------------------ the loop

    def fit(self) -> tuple[str, str | None]:
        """Train to the last step, or until SIGTERM, the non-finite guard or a failed checkpoint stops
        the run; (status, message). metrics.jsonl is complete whatever stops it."""
        c, env, state = self.c, self.env, self.state
        first = state.step + 1
        self.stop.install()
        self.metrics.open(self.total_steps, first, self.resumed_from)
        profiler = StepProfiler(c.profile_steps, self.total_steps, first, env.device, self.paths.output_dir,
                                env.is_main, self.metrics.emit)
        status, message = "completed", None
        self.model.train()
        try:
            for step in range(first, self.total_steps + 1):
                profiler.start(step)
                self.metrics.start()
                r = self.train_step(step)
                dt = self.metrics.stop()
                state.advance()
                profiled = profiler.done(step, dt)
                last = step == self.total_steps
                val = None
                if (c.val_every and step % c.val_every == 0) or (last and not r.skipped):
                    val = self.last_val = self.evaluate()
                self.metrics.record(state, r, dt, profiled=profiled, val_loss=val,
                                    skip_line=self.guard.skip_line(step) if r.skipped else None)
                if self.guard.stop:
                    status, message = "stopped_nonfinite", self.guard.stop_message(step)
                    break
                failed = self.checkpointer.maybe_save(step, last=last, stopping=r.stop, healthy=self.guard.healthy)
                if r.stop:
                    status = "interrupted"
                    message = f"fp8lab: SIGTERM received: checkpoint written at step {step}; exiting (a restart resumes here)"
                if failed:
                    status, message = "checkpoint_failed", self.checkpointer.failure_message(step, failed)
                if r.stop or failed:
                    break
        finally:
            profiler.close()
            self.metrics.close()
            self.stop.uninstall()
        return status, message

    # ------------------------------------------------------------------------------------ the end

    def finish(self, status: str, message: str | None) -> dict[str, Any]:
        """Export the model (a completed run), write summary.json and loss.png, print the stop message."""
        import sys

        c, env = self.c, self.env
        if status == "completed" and c.save_model:
            ftrain.save_hf_model(self.model, self.inner, self.conversion, c, self.paths.model_dir, self.data_dir, env,
                                 master=self.master)
        summary = self.metrics.summary(self.paths, status, message, self.state, self.total_steps, self.last_val,
                                       self.resumed_from, time.perf_counter() - self.wall0)
        if env.is_main:
            self.metrics.write_summary(summary, plot=c.plot)
            if message:
                print(message, file=sys.stderr if status != "interrupted" else sys.stdout, flush=True)
        fdist.barrier(env)  # leave together: a rank tearing down its process group while rank 0 still writes can abort gloo
        return summary


def run(c, env, argv: list[str] | None = None) -> dict[str, Any]:
    """Set up (a ValueError there is an OptionError: the run cannot start as configured), then train."""
    trainer = Trainer(c, env, argv)
    with trainer.setup_errors():
        dry = trainer.setup()
    if dry is not None:
        return dry
    status, message = trainer.fit()
    return trainer.finish(status, message)


def _compile_blocks(model) -> None:
    """torch.compile each decoder block, each its own frame (torchao's Float8Linear and TE guard on the
    module): without head-room dynamo stops compiling after 8 blocks and runs the rest eagerly."""
    import torch._dynamo

    blocks = fdist.block_list(model)
    limit = max(getattr(torch._dynamo.config, "recompile_limit", 8), 2 * len(blocks) + 8)
    torch._dynamo.config.recompile_limit = limit
    torch._dynamo.config.accumulated_recompile_limit = max(
        getattr(torch._dynamo.config, "accumulated_recompile_limit", 256), 4 * limit)
    for block in blocks:
        block.compile()


def _adamw_impl(opt) -> str:
    """Which AdamW kernels run: 'fused', 'foreach' or 'for-loop' (recorded in config.json)."""
    d = getattr(opt, "defaults", {})
    return "fused" if d.get("fused") else "foreach" if d.get("foreach") else "for-loop"
