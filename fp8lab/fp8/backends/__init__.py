"""FP8 backends behind one small interface, found by name.

A backend is a module in this package that defines ``BACKEND``, an object following
:class:`Backend`. Adding one means adding one file: the registry is discovered, and nothing heavy
(TE, torchao) is imported until that backend is asked for.

    te        NVIDIA Transformer Engine (Hopper/Ada/Blackwell GPUs): module swap or fused blocks
    torchao   torchao.float8 training: nn.Linear -> Float8Linear (dynamic per-tensor scaling)
    emulated  fp8lab's pure-PyTorch fake-quantisation (any device): for teaching and CPU tests,
              never for speed claims
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import pkgutil
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

from fp8lab.core.hardware import FP8_CAPABILITY_TEXT, Machine, has_fp8
from fp8lab.fp8.recipe import Recipe
from fp8lab.core.pins import install_hint, installed_te
from fp8lab.fp8 import te_debug

if TYPE_CHECKING:  # torch loads with a backend, not with the registry (fp8lab.plan.options reads the names)
    from torch import nn

ModuleFilter = Callable[["nn.Module", str], bool]

# what recipe=None (--recipe auto) means per backend, readable without importing a backend (fp8lab.plan.runplan)
DEFAULT_RECIPES: dict[str, Recipe] = {
    "te": Recipe(),  # TE's own default: DelayedScaling, HYBRID
    "torchao": Recipe(kind="current"),  # torchao's tensorwise dynamic scaling, E5M2 gradients
    "emulated": Recipe(),
}


@runtime_checkable
class Backend(Protocol):
    """What every backend provides (``fp8_linear(linear)``, an nn.Linear as the backend's FP8 layer holding the same
    parameters, is optional)."""

    name: str
    default_recipe: Recipe  # what recipe=None means for this backend

    def available(self) -> str | None:
        """None when usable on this machine, else the reason (and how to fix it). Never raises."""

    def convert(self, model: nn.Module, recipe: Recipe, *, fuse: bool, module_filter: ModuleFilter | None) -> nn.Module:
        """Return the converted model (raises ValueError before any compute on bad input)."""

    def autocast(self, recipe: Recipe, enabled: bool = True) -> AbstractContextManager:
        """Context in which converted modules compute in FP8 (``enabled=False``: high precision)."""


@functools.cache  # the package's files do not change while it runs: discovered once
def _discovered() -> tuple[str, ...]:
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))


def backend_names() -> list[str]:
    """Names of the backend modules in this package (files not starting with '_')."""
    return list(_discovered())


def get_backend(name: str) -> Backend:
    """The backend called ``name`` (ValueError listing the valid names otherwise)."""
    names = backend_names()
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"backend must be one of {', '.join(names)}; got {name!r}")
    return importlib.import_module(f"{__name__}.{name}").BACKEND


def available_backends() -> dict[str, str | None]:
    """Backend name -> None if usable here, else the reason it is not."""
    return {n: get_backend(n).available() for n in backend_names()}


FP8_LM_HEAD_BACKENDS = ("te", "emulated")  # those with fp8_linear: --fp8-lm-head (fp8lab.fp8.convert.fp8_lm_head)
FP8_ALL_GATHER_BACKENDS = ("torchao",)  # torchao's Float8LinearConfig(enable_fsdp_float8_all_gather=True)


def detect_machine(device, world_size: int = 1, memory_gib: float = 0.0) -> Machine:
    """This process's machine (``Machine.detect``) with the backends that cannot run on it, as this registry finds
    them."""
    unusable = tuple((n, why) for n, why in available_backends().items() if why is not None)
    return Machine.detect(device, world_size, memory_gib, unusable=unusable, te_release=installed_te(),
                          te_debug_problem=te_debug.unavailable())


def auto_fp8_backend(machine: Machine) -> tuple[str, str]:
    """(the backend ``--backend auto`` runs FP8 on, why) on ``machine`` (the plan's ``select_backend`` and
    ``fp8lab.fp8.convert.pick_backend``)."""
    if machine.te_usable:
        return "te", "auto: Transformer Engine (usable here)"
    if not machine.gpu:
        return "emulated", "auto: the FP8 emulator (no CUDA GPU here)"
    no_fp8 = None if machine.fp8 else (f"GPU {machine.name} has no FP8 tensor cores (compute capability below "
                                       f"{FP8_CAPABILITY_TEXT}; FP8 needs Ada L4/L40, Hopper H100/H200 or Blackwell)")
    raise ValueError(auto_refusal(dict(machine.unusable), no_fp8))


def auto_refusal(unusable: dict[str, str | None], no_fp8: str | None) -> str:
    """Why backend 'auto' picks nothing on this GPU machine, and the choices that remain: never a silent
    pure-PyTorch FP8 on a GPU. ``unusable``: backend -> why it cannot run (None: it can); ``no_fp8``: why
    the GPU has no FP8 tensor cores, or None."""
    if no_fp8 is not None:  # below compute capability 8.9 (fp8lab.core.hardware.has_fp8): no hardware FP8 at all
        return (f"backend 'auto': {no_fp8}, so only emulated FP8 runs here: pass backend 'emulated' "
                f"(--backend emulated; pure PyTorch, for learning the numerics, slower than bf16), or use "
                f"an FP8 GPU")
    alt = "'torchao' (usable here) or 'emulated'" if unusable.get("torchao") is None else "'emulated'"
    return (f"backend 'auto': this machine has an FP8 GPU but Transformer Engine is not usable "
            f"({unusable.get('te')}); {install_hint()}; or choose backend {alt} explicitly "
            f"(emulated is pure PyTorch: slower than bf16, never for speed)")


class BackendUnavailableError(RuntimeError):
    """The backend cannot run on this machine; the message says why and what works instead."""


def require(name: str) -> Backend:
    """The backend, or BackendUnavailableError naming the reason and the usable alternatives."""
    be = get_backend(name)
    reason = be.available()
    if reason is not None:
        usable = [n for n, r in available_backends().items() if r is None]
        raise BackendUnavailableError(
            f"backend {name!r} is not usable here: {reason}. Usable on this machine: {', '.join(usable) or 'none'}"
        )
    return be


def install_or_gpu_problem(package: str, label: str, install: str) -> str | None:
    """Why a hardware FP8 backend cannot run here: its package is missing, or there is no FP8 GPU."""
    if importlib.util.find_spec(package) is None:
        return f"{label} is not installed ({install})"
    return fp8_gpu_problem()


def fp8_gpu_problem() -> str | None:
    """None if a CUDA GPU with FP8 tensor cores (fp8lab.core.hardware.has_fp8: compute capability >= 8.9) is
    present, else why not."""
    import torch  # torch loads with a backend's check, not with the registry

    if not torch.cuda.is_available():
        return ("no CUDA GPU on this machine (FP8 GEMMs need an NVIDIA GPU with compute capability >= "
                f"{FP8_CAPABILITY_TEXT})")
    major, minor = torch.cuda.get_device_capability()
    if not has_fp8((major, minor)):
        return (f"GPU {torch.cuda.get_device_name()} has compute capability {major}.{minor}; FP8 needs >= "
                f"{FP8_CAPABILITY_TEXT} (Ada L4/L40, Hopper H100/H200, Blackwell)")
    return None


def fused_problem(hf_config) -> str | None:
    """Why the fused conversion cannot represent this transformers config exactly, or None
    (``fp8lab.fp8.fused`` has the rules)."""
    from fp8lab.fp8.fused import fused_problem as problem  # torch: the registry is read by planning

    return problem(hf_config)


def check_gemm_shapes(shapes: list[tuple[str, int, int]]) -> None:
    """FP8 GEMMs need in and out features divisible by 16: name the first layer that is not."""
    for fqn, fan_in, fan_out in shapes:
        if fan_in % 16 or fan_out % 16:
            raise ValueError(
                f"layer {fqn} has shape (out={fan_out}, in={fan_in}); FP8 GEMMs need both divisible by 16. "
                f"Exclude it with module_filter or change the model's dimensions"
            )


def default_filter(module: nn.Module, fqn: str) -> bool:
    """Default: every nn.Linear except the LM head (kept in high precision, as the embeddings)."""
    return fqn != "lm_head" and not fqn.endswith(".lm_head")


def linear_targets(model: nn.Module, module_filter: ModuleFilter | None) -> list[tuple[str, nn.Linear]]:
    """(fqn, module) of the nn.Linear layers the filter selects, shapes checked."""
    from torch import nn

    flt = module_filter or default_filter
    chosen = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and flt(m, n)]
    check_gemm_shapes([(n, m.in_features, m.out_features) for n, m in chosen])
    return chosen


def fused_targets(model: nn.Module, module_filter: ModuleFilter | None) -> None:
    """Check the GEMM shapes of the fused blocks of an HF model before building anything."""
    from fp8lab.fp8.fused import decoder_layers, spec_from_hf  # torch: the registry is read by planning

    s = spec_from_hf(model)
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    fc1 = 2 * s.ffn if s.activation == "swiglu" else s.ffn
    shapes = []
    for i, (fqn, layer) in enumerate(decoder_layers(model)):
        if module_filter is None or module_filter(layer, fqn):
            shapes += [(f"blocks.{i}.qkv", s.hidden, q + 2 * kv), (f"blocks.{i}.proj", q, s.hidden),
                       (f"blocks.{i}.mlp.fc1", s.hidden, fc1), (f"blocks.{i}.mlp.fc2", s.ffn, s.hidden)]
    check_gemm_shapes(shapes)


def swap_modules(model: nn.Module, make: Callable[[str, nn.Module], nn.Module | None]) -> list[str]:
    """Replace, in place, each submodule for which ``make(fqn, module)`` returns a new module."""
    swapped = []
    for fqn, mod in list(model.named_modules()):
        if not fqn:
            continue
        new = make(fqn, mod)
        if new is not None:
            parent_name, _, child = fqn.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, new)
            swapped.append(fqn)
    return swapped


def is_rmsnorm(module: nn.Module) -> bool:
    """HF RMSNorm modules (LlamaRMSNorm etc.), recognised without importing HF internals."""
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")


__all__ = [
    "Backend", "BackendUnavailableError", "DEFAULT_RECIPES", "ModuleFilter", "available_backends", "backend_names",
    "get_backend", "require", "fused_problem", "fp8_gpu_problem", "install_or_gpu_problem", "check_gemm_shapes",
    "default_filter",
]
