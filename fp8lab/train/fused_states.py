"""The memory modes' optimizer: Transformer Engine's ``FusedAdam`` keeping fewer bytes per parameter (GPU only).

``--memory bf16-moments`` and ``fp8-exp-avg`` (fp8lab.plan.memory_modes) train bf16 parameters whose fp32 master is
the bf16 weight plus 16 low bits kept by the optimizer (``store_param_remainders``: the master is exact, in 2 bytes
instead of 4), with AdamW's moments in bf16, or the first one in FP8. The step is TE's fused multi-tensor kernel, in
place: no fp32 gradient copy. This class gives the trainer, the checkpoint and the export the same interface as
fp8lab.train.master_weights.MasterWeights (the ``plain`` mode), so they do not ask which mode runs.

Gradients stay bf16 (as in ``plain`` before its fp32 copy); the global norm is taken in fp32 and the clip is applied
to the bf16 gradients in place. With TE's fused weight-gradient accumulation the gradient lives in ``main_grad``,
zeroed in place after each step (a captured CUDA graph writes to the same addresses), and handed to FusedAdam as
``.grad``.

Checkpoints hold the optimizer's own tensors (bf16 or FP8 moments, their scales, the int16 remainders), keyed by
parameter name; the model part holds the bf16 weights as fp32 values, so a checkpoint reads like any other and a
resume restores the exact masters (weights plus remainders). The first step starts the masters from the bf16
weights: the fp32 initialisation's low bits are not kept (``plain`` keeps them).
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from fp8lab.plan.layout import STREAM_CHUNK_BYTES
from fp8lab.plan.memory_modes import Mode
from fp8lab.train.master_weights import trainable_params

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8": torch.uint8}  # FusedAdam spells FP8 as uint8


def _param_groups(params: list[nn.Parameter], names: list[list[str]], c) -> list[dict[str, Any]]:
    """AdamW's groups (weight decay on matrices only), each at most ``STREAM_CHUNK_BYTES / 8`` parameters: with an FP8
    moment FusedAdam reads both of a group's moments as fp32 copies, so a group bounds that memory (the layout counts
    one)."""
    limit = STREAM_CHUNK_BYTES // 8
    groups: list[dict[str, Any]] = []
    for decay in (True, False):
        chosen = [p for p in params if (p.ndim >= 2) == decay]
        size, current = 0, []
        for p in chosen:
            if current and size + p.numel() > limit:
                groups.append({"params": current, "weight_decay": c.weight_decay if decay else 0.0})
                size, current = 0, []
            current.append(p)
            size += p.numel()
        if current:
            groups.append({"params": current, "weight_decay": c.weight_decay if decay else 0.0})
    return groups


class FusedStates:
    """bf16 parameters stepped by TE's FusedAdam with the states of memory mode ``mode``; the interface of
    fp8lab.train.master_weights.MasterWeights. ``c``: the run's TrainConfig (lr, betas, weight decay)."""

    streamed = False

    def __init__(self, module: nn.Module, mode: Mode, c):
        import transformer_engine.pytorch as te

        self.params, self.names = trainable_params(module)
        if not self.params:
            raise ValueError(f"{type(module).__name__} has no trainable parameters")
        with torch.no_grad():
            for p in self.params:
                p.data = p.data.to(torch.bfloat16)
        self.mode = mode
        self.optimizer = te.optimizers.FusedAdam(
            _param_groups(self.params, self.names, c), lr=c.lr, betas=(c.beta1, c.beta2), weight_decay=c.weight_decay,
            adam_w_mode=True, master_weights=True, master_weight_dtype=torch.float32, store_param_remainders=True,
            exp_avg_dtype=DTYPES[mode.exp_avg], exp_avg_sq_dtype=DTYPES[mode.exp_avg_sq])
        # FusedAdam adds a group's step count at its first step; a checkpoint load fills only the keys a fresh
        # optimizer already has, so without it a resumed run would restart the bias correction at step 1
        for g in self.optimizer.param_groups:
            g.setdefault("step", 0)
        self._main_grad: set[int] = set()

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    def use_main_grad(self, params: list[nn.Parameter]) -> None:
        """These parameters' weight gradients are added into ``p.main_grad`` (bf16) by their TE layers."""
        mine = {id(p) for p in self.params}
        if any(id(p) not in mine for p in params):
            raise ValueError("use_main_grad: a parameter is not among this optimizer's parameters")
        self._main_grad = {id(p) for p in params}
        with torch.no_grad():
            for p in params:
                if getattr(p, "main_grad", None) is None:
                    p.main_grad = torch.zeros_like(p)

    def _grads(self) -> list[torch.Tensor]:
        """Each parameter's whole gradient, put where FusedAdam reads it (``.grad``); a parameter the forward did not
        use has none and is not stepped."""
        out = []
        for p in self.params:
            if id(p) in self._main_grad:
                if p.grad is not None and p.grad is not p.main_grad:  # autograd's, beside the fused one (once)
                    p.main_grad.add_(p.grad)
                p.grad = p.main_grad
            if p.grad is not None:
                out.append(p.grad)
        return out

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """The fp32 global norm of the bf16 gradients (per-tensor fp32 norms, then theirs); clipped in place."""
        grads = self._grads()
        if not grads:
            return torch.zeros((), device=self.params[0].device)
        norms = [torch.linalg.vector_norm(g, 2.0, dtype=torch.float32) for g in grads]
        total = torch.linalg.vector_norm(torch.stack(norms), 2.0)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        torch._foreach_mul_(grads, coef.to(grads[0].dtype))
        return total

    @torch.no_grad()
    def step(self) -> None:
        self._grads()
        self.optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if id(p) in self._main_grad:
                p.grad = None  # an alias of main_grad, zeroed below in place
                p.main_grad.zero_()
            elif set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    # -- checkpoints and export ---------------------------------------------------------------
    def model_state_dict(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """``state_dict`` with each parameter as fp32 values of its bf16 weight (the remainders are the optimizer's)."""
        out = dict(state_dict)
        for names, p in zip(self.names, self.params):
            for n in names:
                if n in out:
                    out[n] = p.detach().to(device=out[n].device, dtype=torch.float32)
        return out

    def _ensure_state(self) -> None:
        """FusedAdam's states for every parameter (zero moments and remainders), so a checkpoint load has tensors."""
        for p in self.params:
            if not self.optimizer.state[p]:
                self.optimizer.initialize_state(p, store_param_remainders=True)

    def state_dict(self) -> dict[str, Any]:
        """The live state tensors and their FP8 scales, keyed by parameter name; the groups' hyperparameters and step
        count (FusedAdam counts steps per group)."""
        self._ensure_state()
        first = {id(p): names[0] for p, names in zip(self.params, self.names)}
        scales = getattr(self.optimizer, "_scales", {})  # FusedAdam's per-tensor scales of its FP8/fp16 states
        state = {}
        for p in self.params:
            st = {}
            for k, v in self.optimizer.state[p].items():
                if hasattr(v, "_data") and hasattr(v, "_scale_inv"):  # an FP8 moment (TE's Float8Tensor): its bytes
                    st[f"{k}_fp8"], st[f"{k}_scale_inv"] = v._data, v._scale_inv
                else:
                    st[k] = v
            for k, v in (scales.get(p) or {}).items():
                st[f"{k}_scale"] = v
            state[first[id(p)]] = st
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [first[id(p)] for p in g["params"]]}
                  for g in self.optimizer.param_groups]
        return {"state": state, "param_groups": groups}

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        own = self.state_dict()
        for name, st in state_dict["state"].items():
            if name not in own["state"]:
                raise KeyError(f"optimizer state for unknown parameter {name!r}")
            for k, v in st.items():
                live = own["state"][name].get(k)
                if not isinstance(live, torch.Tensor):
                    raise KeyError(f"optimizer state {k!r} of {name!r} is not one --memory {self.mode.name} keeps")
                if live is not v:
                    live.copy_(v)
        if len(state_dict["param_groups"]) != len(self.optimizer.param_groups):
            raise ValueError("optimizer state has a different number of parameter groups")
        for g, saved in zip(self.optimizer.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved.items() if k != "params"})

    def sync_params(self) -> None:
        """Nothing to copy: the parameters are the masters' high halves."""
