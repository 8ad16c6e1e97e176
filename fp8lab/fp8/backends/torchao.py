"""torchao float8 training: ``nn.Linear`` -> ``Float8Linear`` via ``convert_to_float8_training``.

torchao scales dynamically (per tensor, from the tensor's own amax: ``Recipe(kind="current")``, its
default here) and has no fused decoder: ``fuse`` is accepted and has no effect (the conversion
info records ``fused=False``). Its speed comes with ``torch.compile``; in eager mode it is usually
slower than bf16. There is no runtime FP8 switch in torchao, so ``autocast(enabled=False)`` routes
the converted layers through a plain ``F.linear`` on the same weights for as long as it is active.
"""
from __future__ import annotations

import warnings
import weakref
from contextlib import contextmanager
from functools import partial
from typing import Iterator

from torch import nn

from fp8lab.fp8.backends import DEFAULT_RECIPES, install_or_gpu_problem, linear_targets
from fp8lab.core.pins import install_hint
from fp8lab.fp8.recipe import Recipe


# A known-harmless warning of torchao's import, silenced by its message and the files that raise it:
# Python 3.12 compiles torchao 0.18's quantization/quant_api.py (a regex in a plain string) with
# "SyntaxWarning: invalid escape sequence '\.'", once, when no bytecode is cached yet. Compile-time
# warnings carry the file's path as their module, hence the path pattern.
warnings.filterwarnings("ignore", message=r"invalid escape sequence", category=SyntaxWarning,
                        module=r".*[/\\]torchao[/\\]")


class TorchaoBackend:
    name = "torchao"
    default_recipe = DEFAULT_RECIPES["torchao"]

    def __init__(self) -> None:
        self._converted: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # for autocast(enabled=False)

    def available(self) -> str | None:
        problem = install_or_gpu_problem("torchao", "torchao", install_hint())
        if problem is not None:
            return problem
        try:
            import torchao.float8  # noqa: F401
        except Exception as exc:
            return f"torchao.float8 does not import: {type(exc).__name__}: {exc}"
        return None

    def convert(self, model, recipe, *, fuse, module_filter, fp8_all_gather: bool = False):
        recipe.to_torchao()  # a recipe torchao does not implement is refused first (ValueError)
        p = next(model.parameters())
        if p.device.type != "cuda":
            raise ValueError("torchao float8 runs on the GPU: move the model first (model.to('cuda')); it is on "
                             f"{p.device}")
        targets = to_float8_training(model, recipe, module_filter, fp8_all_gather)
        self._converted.update(model.get_submodule(n) for n in targets)
        model.__dict__["_fp8lab_swapped"] = tuple(sorted(targets))
        return model

    def autocast(self, recipe: Recipe, enabled: bool = True):
        return _nothing() if enabled else _plain_linears(list(self._converted))


def to_float8_training(model: nn.Module, recipe: Recipe, module_filter, fp8_all_gather: bool = False) -> set[str]:
    """Swap ``model``'s target linears for torchao's Float8Linear in place; returns their names. With
    ``fp8_all_gather`` FSDP2 all-gathers those weights in float8 (torchao's ``fsdp_pre_all_gather``).

    The conversion itself, with no device check: :meth:`TorchaoBackend.convert` refuses a model off the GPU (FP8
    GEMMs are for speed), while the CPU test of the FSDP2 all-gather wiring (two gloo ranks,
    ``benchmarks/fp8_all_gather_check.py --device cpu``) calls this directly: torch's CPU ``_scaled_mm`` runs it."""
    import dataclasses

    from torchao.float8 import convert_to_float8_training

    config = recipe.to_torchao()  # ValueError for recipes torchao does not implement
    if fp8_all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    targets = {n for n, _ in linear_targets(model, module_filter)}
    convert_to_float8_training(model, module_filter_fn=lambda m, fqn: fqn in targets, config=config)
    return targets


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def _plain_linears(mods: list[nn.Module]) -> Iterator[None]:
    """Run the given Float8Linear layers as high-precision nn.Linear while active (then restore)."""
    for m in mods:
        m.__dict__["forward"] = partial(nn.Linear.forward, m)  # instance attribute shadows the class method
    try:
        yield
    finally:
        for m in mods:
            m.__dict__.pop("forward", None)


BACKEND = TorchaoBackend()
