"""BF16 model parameters with FP32 master weights inside the optimizer (one process and DDP).

Why: a model kept in fp32 under ``torch.autocast`` re-casts every weight to bf16 (or FP8 in TE) on
every forward, and gets its gradients back as fp32. Keeping the parameters in bf16 removes those
casts; the optimizer keeps an fp32 copy of each parameter (the *master*) and fp32 AdamW states, so
small updates are not lost to bf16 rounding. One optimizer step here is:

1. move the bf16 gradients into fp32 master gradients, one parameter at a time (each bf16
   gradient is freed once copied);
2. clip on the fp32 gradients (the returned norm is the fp32 global norm that the trainer logs);
3. ``torch.optim.AdamW`` steps the fp32 masters (fused / foreach kernels as configured);
4. copy the masters back into the bf16 parameters (``torch._foreach_copy_``).

A step the trainer skips (non-finite loss or gradient) calls 1-2 only: masters, AdamW states and
parameters stay as they were. Memory per parameter during forward/backward: bf16 parameter and
gradient (2 + 2 bytes), fp32 master and two AdamW moments (3 x 4 bytes): 16 bytes, as an fp32 model
with AdamW; the fp32 master gradients (4 more bytes) exist only from step 1 to ``zero_grad``, when
the activations are gone. Gradient accumulation over micro-batches sums in bf16 (the parameters'
dtype), which an fp32 model under autocast does in fp32.

Streamed step (``streamed=True``, what the trainer uses under CUDA graphs): the gradients stay where
backward wrote them, and the fused-accumulation buffers (``main_grad``) are zeroed in place instead of
freed, so they keep the addresses a captured graph writes to. Clipping takes the fp32 norm chunk by
chunk, and the step then converts, clips and steps about ``STREAM_CHUNK_BYTES`` of fp32 gradients at a
time. The step then holds the bf16 gradients plus one chunk (at 7B 13.6 GiB) instead of a full fp32
copy (25 GiB), which leaves room for the activations the graphs keep resident. The arithmetic is the same as
the plain step's: the same fp32 upcasts, per-tensor norms and clip factor, and AdamW is elementwise.

Offloaded step (``offload=<the GPU>``, ``--memory offload``): the masters and AdamW moments live in pinned host
memory, and the GPU keeps only the bf16 parameters and gradients. The step is the streamed one, a chunk of about
``OFFLOAD_CHUNK_BYTES`` of fp32 gradients at a time, with the chunk's masters and moments copied to the GPU first
(the next chunk's copy runs on a side stream while this one steps), the same AdamW kernel run there, the bf16
parameters rounded from the stepped masters, and masters and moments copied back. AdamW is elementwise, so the
arithmetic and its result are the plain step's, bit for bit; the price is 24 bytes per parameter over PCIe per step.

Checkpoints: :meth:`model_state_dict` puts the fp32 masters where a model state dict has its
parameters and :meth:`state_dict` is keyed by parameter name like
``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict``, so a checkpoint has the same
layout and precision as one of an fp32 run. FSDP2 does not use this class: there the sharded
parameters stay fp32 and ``MixedPrecisionPolicy(param_dtype=bf16)`` casts them when gathering.
"""
from __future__ import annotations

import mmap
import weakref
from contextlib import nullcontext
from typing import Any, Callable

import torch
from torch import nn

# read at each construction (tests patch them here)
from fp8lab.plan.layout import OFFLOAD_CHUNK_BYTES, STREAM_CHUNK_BYTES




def trainable_params(module: nn.Module) -> tuple[list[nn.Parameter], list[list[str]]]:
    """``module``'s trainable parameters, each once, and every name of each (tied weights have several)."""
    params: list[nn.Parameter] = []
    names: list[list[str]] = []
    index: dict[int, int] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        if not p.requires_grad:
            continue
        if id(p) not in index:
            index[id(p)] = len(params)
            params.append(p)
            names.append([])
        names[index[id(p)]].append(name)
    return params, names


KINDS = ("", "exp_avg", "exp_avg_sq")  # what the offloaded step keeps in host memory: the masters, AdamW's moments


class HostArena:
    """The offloaded fp32 states in host memory: per kind (:data:`KINDS`) one buffer holding every master's share, in
    parameter order (so a chunk of consecutive masters is one slice of it), page-locked once (cudaHostRegister) where
    ``pin``. Each buffer is an anonymous memory map: page-aligned, with the tensor's storage starting where the map
    does (so ``is_pinned`` sees it). Not torch's pinned allocator: it rounds each allocation up to a power of two,
    which at 7B would ask for up to twice the host memory."""

    def __init__(self, shapes: list[torch.Size], pin: bool):
        self.shapes = shapes
        self.offsets = [0]
        for shape in shapes:
            self.offsets.append(self.offsets[-1] + shape.numel())
        self.pin = pin
        self.buffers: dict[str, torch.Tensor] = {}
        # unlocked when the arena goes, before its buffers are freed (the finalizer holds them until then)
        weakref.finalize(self, _unregister, self.buffers, pin)
        for kind in KINDS:
            self.buffers[kind] = self._allocate()

    def _allocate(self) -> torch.Tensor:
        n = self.offsets[-1]
        region = mmap.mmap(-1, 4 * n)  # zero-filled by the OS
        if hasattr(mmap, "MADV_HUGEPAGE"):
            # huge pages where the kernel allows them: 512 times fewer pages to fault in and lock (setting up a 7B
            # model's 75 GiB took 51 s in small pages, copies included)
            try:
                region.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # transparent huge pages compiled out: small pages work too
                pass
        buf = torch.frombuffer(region, dtype=torch.float32, count=n)
        if self.pin:  # portable: locked for every device and context, as torch's own registration does
            err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), 4 * n, 1)
            if int(err) != 0:
                raise RuntimeError(f"--memory offload: cudaHostRegister of {4 * n / 2**30:.1f} GiB of host memory "
                                   f"failed (CUDA error {int(err)}); another --memory mode avoids it")
        return buf

    def view(self, kind: str, i: int) -> torch.Tensor:
        return self.buffers[kind][self.offsets[i]:self.offsets[i + 1]].view(self.shapes[i])

    def span(self, kind: str, chunk: list[int]) -> torch.Tensor:
        """The flat slice of ``kind`` holding the consecutive masters ``chunk``."""
        return self.buffers[kind][self.offsets[chunk[0]]:self.offsets[chunk[-1] + 1]]


def _unregister(buffers: dict[str, torch.Tensor], pin: bool) -> None:
    if pin:
        for buf in buffers.values():
            torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())


class MasterWeights:
    """Casts ``module``'s parameters to ``dtype`` in place and steps fp32 copies of them.

    Create it before DDP wraps the model (DDP buckets gradients by the parameters' dtype) and
    before the first forward. ``make_optimizer(masters)`` builds the inner optimizer (AdamW with
    the trainer's parameter groups) over the fp32 masters; an LR scheduler attaches to
    ``.optimizer``. Duck-types the parts of ``torch.optim.Optimizer`` the trainer uses.
    ``streamed``: the streamed step of the module docstring (gradient buffers kept in place).
    ``offload``: the device the step runs on, with the masters and AdamW states in host memory between steps (the
    offloaded step of the module docstring; pinned where it is a GPU); implies ``streamed``.
    """

    def __init__(self, module: nn.Module, make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
                 dtype: torch.dtype = torch.bfloat16, streamed: bool = False, offload: torch.device | None = None):
        self.params, self.names = trainable_params(module)  # names: every name of each (tied weights have several)
        if not self.params:
            raise ValueError(f"{type(module).__name__} has no trainable parameters to keep master weights of")
        self.offload = None if offload is None else torch.device(offload)
        self._pin = self.offload is not None and self.offload.type == "cuda"
        self._host = HostArena([p.shape for p in self.params], self._pin) if self.offload is not None else None
        with torch.no_grad():
            self.masters = [nn.Parameter(self._host.view("", i).copy_(p.detach()) if self._host is not None
                                         else p.detach().to(torch.float32, copy=True))
                            for i, p in enumerate(self.params)]
            for p in self.params:  # the same Parameter objects, now bf16: modules and hooks still see them
                p.data = p.data.to(dtype)
        self.dtype = dtype
        self.device = self.offload or self.masters[0].device  # where the step computes
        self.optimizer = make_optimizer(self.masters)
        self._main_grad: set[int] = set()  # parameters whose gradient arrives in p.main_grad (fused accumulation)
        self._quantized: set[int] = set()  # indices of parameters kept in FP8 (replace_param)
        self.streamed = streamed or self.offload is not None
        chunk = OFFLOAD_CHUNK_BYTES if self.offload is not None else STREAM_CHUNK_BYTES
        self._chunks = self._chunk_indices(chunk) if self.streamed else []
        self._clip_coef: torch.Tensor | None = None  # the streamed step's clip factor, set by clip_grad_norm_
        # the next chunk's host-to-GPU copies overlap this chunk's step
        self._copy_stream = torch.cuda.Stream(self.offload) if self._pin else None

    def _chunk_indices(self, limit: int) -> list[list[int]]:
        """Parameter indices in order, grouped so each group's fp32 gradients take about ``limit`` bytes."""
        chunks: list[list[int]] = [[]]
        size = 0
        for i, p in enumerate(self.params):
            if chunks[-1] and size + 4 * p.numel() > limit:
                chunks.append([])
                size = 0
            chunks[-1].append(i)
            size += 4 * p.numel()
        return chunks

    def use_main_grad(self, params: list[nn.Parameter]) -> None:
        """These parameters' gradients are accumulated by their layers into ``p.main_grad`` (bf16).

        Gives each a zeroed ``main_grad``; after every optimizer step (``zero_grad``) it is zeroed
        again. Layers that honour the contract (TE with ``fuse_wgrad_accumulation``) add each
        micro-batch's weight gradient into it inside the GEMM and leave ``p.grad`` empty."""
        mine = {id(p) for p in self.params}
        strangers = [p for p in params if id(p) not in mine]
        if strangers:
            raise ValueError(f"use_main_grad: {len(strangers)} parameter(s) are not among this optimizer's parameters")
        self._main_grad = {id(p) for p in params}
        self._fresh_main_grads()

    def _fresh_main_grads(self) -> None:
        with torch.no_grad():
            for p in self.params:
                if id(p) in self._main_grad and getattr(p, "main_grad", None) is None:
                    # (not zeros_like: an FP8 parameter's gradient is a plain tensor of the parameters' dtype)
                    p.main_grad = torch.zeros(p.shape, dtype=self.dtype, device=p.device)

    # -- what the trainer calls ---------------------------------------------------------------
    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def _fp32_grad(self, p: nn.Parameter) -> torch.Tensor | None:
        """``p``'s gradient (autograd's ``.grad`` plus its fused ``main_grad``) as a new fp32 tensor, or None."""
        g = None if p.grad is None else p.grad.to(torch.float32)
        if id(p) in self._main_grad and getattr(p, "main_grad", None) is not None:
            g = p.main_grad.to(torch.float32) if g is None else g.add_(p.main_grad)
        return g

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Move the bf16 gradients into fp32 master gradients, clip those; return the fp32 norm.

        One parameter at a time: each bf16 gradient is released as soon as its fp32 copy exists,
        so the step never holds both full sets (at 7B that is 13.5 GB less at the memory peak).
        After this call the parameters have no ``.grad``; the masters have theirs until ``zero_grad``.
        A parameter the forward did not use (no gradient) is not stepped, as in torch.
        Streamed: only the norm and the clip factor; the gradients stay in place for :meth:`step`."""
        if self.streamed:
            return self._streamed_norm(max_norm)
        with torch.no_grad():
            for m, p in zip(self.masters, self.params):
                m.grad = self._fp32_grad(p)
                p.grad = None
                if id(p) in self._main_grad:
                    p.main_grad = None  # freed now; a zeroed one is made after the step
        grads = [m for m in self.masters if m.grad is not None]
        if not grads:
            return torch.zeros((), device=self.masters[0].device)
        return torch.nn.utils.clip_grad_norm_(grads, max_norm)

    @torch.no_grad()
    def _streamed_norm(self, max_norm: float) -> torch.Tensor:
        """The fp32 global norm as ``clip_grad_norm_`` computes it (per-tensor norms, then their norm),
        from one chunk of fp32 upcasts at a time; keeps the clip factor for the streamed step."""
        norms: list[torch.Tensor] = []
        for chunk in self._chunks:
            grads = [g for g in (self._fp32_grad(self.params[i]) for i in chunk) if g is not None]
            if grads:
                norms += torch._foreach_norm(grads, 2.0)
            del grads
        if not norms:  # no gradient at all: the step then changes nothing, as the plain step
            self._clip_coef = torch.ones((), device=self.device)
            return torch.zeros((), device=self.device)
        total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
        self._clip_coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        return total

    @torch.no_grad()
    def _streamed_step(self) -> None:
        """Convert, clip and step one chunk of fp32 master gradients at a time (then free them)."""
        if self._clip_coef is None:
            raise RuntimeError("MasterWeights(streamed=True).step() needs clip_grad_norm_() first (it sets the clip "
                               "factor)")
        for chunk in self._chunks:
            self._step_chunk(chunk, None)
        self._clip_coef = None

    def _step_chunk(self, chunk: list[int], zero: set[int] | None) -> None:
        """AdamW on the masters of ``chunk`` that have a gradient (their fp32 gradients made here, clipped, then
        freed); their bf16 parameters become the rounded masters. ``zero``: as in :meth:`_offloaded_step`."""
        stepped = []
        for i in chunk:
            m = self.masters[i]
            if zero is not None:
                m.grad = torch.zeros_like(m.data) if id(m) in zero else None
            else:
                m.grad = self._fp32_grad(self.params[i])
                self.params[i].grad = None
            if m.grad is not None:
                stepped.append(i)
        if stepped:
            torch._foreach_mul_([self.masters[i].grad for i in stepped], self._clip_coef)
            self.optimizer.step()  # masters without a gradient (the other chunks) are not stepped
            self._write_params(stepped)
        for i in chunk:
            self.masters[i].grad = None

    @torch.no_grad()
    def _offloaded_step(self, zero: set[int] | None = None) -> None:
        """The streamed step with each chunk's masters and moments brought from host memory into one of two staging
        slots on the step's device and taken back: chunk k+1 arrives (on the side stream) while chunk k steps, and
        a slot is refilled only after its last chunk has gone back (events, so the host never waits).
        ``zero``: the ids of masters to step with zero gradients, the others not at all (:meth:`_ensure_state`)."""
        if self._clip_coef is None:
            raise RuntimeError("MasterWeights(offload=...).step() needs clip_grad_norm_() first (it sets the clip "
                               "factor)")
        chunks = self._chunks if zero is None else [
            c for c in self._chunks if any(id(self.masters[i]) in zero for i in c)]
        side = self._copy_stream
        size = max(self._host.offsets[c[-1] + 1] - self._host.offsets[c[0]] for c in chunks) if chunks else 0
        slots = [{k: torch.empty(size, dtype=torch.float32, device=self.device) for k in KINDS} for _ in range(2)]
        freed: list[Any] = [None, None]
        main = torch.cuda.current_stream(self.device) if side is not None else None
        if side is not None:
            side.wait_stream(main)  # the gradients; the slots were made on main

        def bring(k: int):
            slot = slots[k % 2]
            with torch.cuda.stream(side) if side is not None else nullcontext():
                if freed[k % 2] is not None:
                    side.wait_event(freed[k % 2])
                n = self._host.offsets[chunks[k][-1] + 1] - self._host.offsets[chunks[k][0]]
                for kind in KINDS:
                    slot[kind][:n].copy_(self._host.span(kind, chunks[k]), non_blocking=self._pin)
                if side is None:
                    return None
                loaded = torch.cuda.Event()
                loaded.record(side)
                return loaded

        loaded = bring(0) if chunks else None
        for k, chunk in enumerate(chunks):
            if loaded is not None:
                main.wait_event(loaded)
            loaded = bring(k + 1) if k + 1 < len(chunks) else None  # overlaps this chunk's step
            placed = self._step_here(chunk, slots[k % 2], zero)
            self._take_back(chunk, slots[k % 2], placed)
            if main is not None:
                freed[k % 2] = torch.cuda.Event()
                freed[k % 2].record(main)
        if main is not None:
            main.synchronize()  # the host copies are complete before anything reads them (a checkpoint, the next step)
        self._clip_coef = None

    def _placed(self, chunk: list[int], slot: dict[str, torch.Tensor], i: int, kind: str) -> torch.Tensor:
        """Master ``i``'s share of ``kind`` in ``slot``, which holds ``chunk``."""
        start = self._host.offsets[chunk[0]]
        return slot[kind][self._host.offsets[i] - start:self._host.offsets[i + 1] - start].view(self._host.shapes[i])

    def _step_here(self, chunk: list[int], slot: dict[str, torch.Tensor], zero: set[int] | None) -> dict:
        """AdamW on one chunk, its masters and moments in ``slot``; the bf16 parameters follow. Returns the moment
        tensors placed in the optimizer's state, by (master, kind)."""
        placed = {}
        for i in chunk:
            m = self.masters[i]
            m.data = self._placed(chunk, slot, i, "")
            state = self.optimizer.state.get(m)
            for kind in KINDS[1:]:
                if state and kind in state:
                    state[kind] = placed[i, kind] = self._placed(chunk, slot, i, kind)
        self._step_chunk(chunk, zero)
        return placed

    def _take_back(self, chunk: list[int], slot: dict[str, torch.Tensor], placed: dict) -> None:
        """The chunk's masters and moments back into host memory, one copy per kind (asynchronously where pinned); the
        optimizer's state and the masters point there again."""
        for i in chunk:
            m = self.masters[i]
            state = self.optimizer.state.get(m, {})  # (not [m]: a defaultdict would note an empty state)
            for kind in KINDS[1:]:
                v = state.get(kind)
                if v is None:
                    continue
                if v is not placed.get((i, kind)):  # made by this step (the first): into the slot, to go back with it
                    self._placed(chunk, slot, i, kind).copy_(v)
                state[kind] = self._host.view(kind, i)
            m.data = self._host.view("", i)
        n = self._host.offsets[chunk[-1] + 1] - self._host.offsets[chunk[0]]
        for kind in KINDS:
            self._host.span(kind, chunk).copy_(slot[kind][:n], non_blocking=self._pin)

    def _write_params(self, indices: list[int]) -> None:
        """Parameters ``indices`` become their masters rounded to bf16; an FP8 parameter (fp8lab.train.fp8_weights)
        is quantized from that bf16 rounding, the value a bf16 weight cast to FP8 would have."""
        plain = [i for i in indices if i not in self._quantized]
        if plain:
            torch._foreach_copy_([self.params[i] for i in plain], [self.masters[i].data for i in plain])
        for i in indices:
            if i in self._quantized:
                self.params[i].quantize_(self.masters[i].data.to(device=self.params[i].device, dtype=self.dtype))

    def replace_param(self, old: nn.Parameter, new: nn.Parameter) -> None:
        """``new`` (an FP8 tensor with ``quantize_``, of ``old``'s shape) stands for ``old`` from now on: its
        gradient steps ``old``'s master, and each step writes the master into it."""
        i = next((k for k, p in enumerate(self.params) if p is old), None)
        if i is None:
            raise ValueError("replace_param: the parameter is not among this optimizer's parameters")
        if new.shape != old.shape or not hasattr(new, "quantize_"):
            raise ValueError(f"replace_param: a {tuple(old.shape)} parameter needs a quantized tensor of that shape "
                             f"(got {type(new).__name__} {tuple(new.shape)})")
        if id(old) in self._main_grad:  # TE adds the weight gradients into the new parameter's buffer instead
            self._main_grad = (self._main_grad - {id(old)}) | {id(new)}
            new.main_grad = old.main_grad
        self.params[i] = new
        self._quantized.add(i)

    @torch.no_grad()
    def step(self) -> None:
        """AdamW on the fp32 masters, then the bf16 parameters become their rounded copies."""
        if self.offload is not None:
            self._offloaded_step()  # rounds each chunk's parameters as it goes
            return
        if self.streamed:
            self._streamed_step()  # rounds each chunk's parameters as it goes
            return
        self.optimizer.step()
        self._write_params(list(range(len(self.params))))

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the bf16 gradients (if any are left) and the fp32 master gradients (their memory is freed).
        The fused ``main_grad`` buffers are freed and made afresh, or (streamed) zeroed in place."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()
        for m in self.masters:
            m.grad = None
        self._clip_coef = None
        # a main_grad not consumed by clip_grad_norm_ must not leak into the next step
        mains = [p for p in self.params if id(p) in self._main_grad and getattr(p, "main_grad", None) is not None]
        if self.streamed:  # in place: a captured graph writes to these addresses
            if mains:
                torch._foreach_zero_([p.main_grad for p in mains])
        else:
            for p in mains:
                p.main_grad = None
            self._fresh_main_grads()

    # -- checkpoints and export ---------------------------------------------------------------
    def model_state_dict(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``state_dict`` (the model's, e.g. from get_model_state_dict) with the fp32 masters for the parameters.

        On the masters' device the values are the masters themselves (a checkpoint load writes into
        them in place); elsewhere (``cpu_offload``) copies on that device. Offloaded masters: the host masters
        themselves, which a checkpoint reads and writes in place (a copy on the GPU would not fit), views of one
        buffer (fp8lab.train.export copies them before a writer would take them for tied weights)."""
        out = dict(state_dict)
        for names, m in zip(self.names, self.masters):
            present = [n for n in names if n in out]
            if not present:
                raise KeyError(f"parameter {names[0]!r} is not in the model state dict (keys like "
                               f"{next(iter(out), None)!r})")
            for n in present:
                out[n] = m.detach() if self.offload is not None else m.detach().to(out[n].device)
        return out

    def _ensure_state(self) -> None:
        """Create the AdamW states (zero moments, step 0) of the masters that have none, so a checkpoint load has
        tensors to fill.

        As torch.distributed.checkpoint does for a fresh optimizer: a step with lr 0 and zero gradients of those
        masters alone (the others are not stepped, so their states stay as they are), which leaves them unchanged;
        their step counters are then reset to 0, so their next real step is exactly a first step."""
        missing = [m for m in self.masters if not self.optimizer.state.get(m)]
        if not missing:
            return
        ids = {id(m) for m in missing}
        saved = [m.grad for m in self.masters]
        lrs = [g["lr"] for g in self.optimizer.param_groups]
        with torch.no_grad():
            for g in self.optimizer.param_groups:
                g["lr"] = torch.tensor(0.0) if isinstance(g["lr"], torch.Tensor) else 0.0
            coef, self._clip_coef = self._clip_coef, torch.ones((), device=self.device)
            if self.offload is not None:  # through the step's device: the states are made there, kept on the host
                self._offloaded_step(zero=ids)
            else:
                self._step_chunk(list(range(len(self.masters))), ids)
            self._clip_coef = coef
            for g, lr in zip(self.optimizer.param_groups, lrs):
                g["lr"] = lr
            for m in missing:
                st = self.optimizer.state[m]
                if isinstance(st.get("step"), torch.Tensor):
                    st["step"].zero_()
                elif "step" in st:
                    st["step"] = 0
        for m, g in zip(self.masters, saved):
            m.grad = g

    def state_dict(self) -> dict[str, Any]:
        """AdamW state keyed by parameter name (the layout of get_optimizer_state_dict); tensors are the live ones."""
        self._ensure_state()
        first = {id(m): names[0] for m, names in zip(self.masters, self.names)}
        state = {first[id(m)]: self.optimizer.state[m] for m in self.masters}
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [first[id(m)] for m in g["params"]]}
                  for g in self.optimizer.param_groups]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take AdamW states and hyperparameters from ``state_dict`` (masters already restored), then
        copy the masters into the bf16 parameters."""
        own = self.state_dict()
        for name, st in state_dict["state"].items():
            if name not in own["state"]:
                raise KeyError(f"optimizer state for unknown parameter {name!r}")
            for k, v in st.items():
                live = own["state"][name][k]
                if isinstance(live, torch.Tensor):
                    if live is not v:
                        live.copy_(v)
                else:
                    own["state"][name][k] = v
        if len(state_dict["param_groups"]) != len(self.optimizer.param_groups):
            raise ValueError("optimizer state has a different number of parameter groups")
        for g, saved in zip(self.optimizer.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})
        self.sync_params()

    @torch.no_grad()
    def sync_params(self) -> None:
        """The bf16 parameters from the masters (after a load)."""
        if self.offload is not None:
            for i, (p, m) in enumerate(zip(self.params, self.masters)):  # from host memory, one at a time
                if i in self._quantized:
                    self._write_params([i])
                else:
                    p.copy_(m)
        else:
            self._write_params(list(range(len(self.params))))

    def master_for(self, name: str) -> torch.Tensor:
        """The fp32 master of the parameter called ``name`` (tests, inspection)."""
        for names, m in zip(self.names, self.masters):
            if name in names:
                return m
        raise KeyError(name)

