"""torchao's rowwise recipes as recipe kinds: planned for --backend torchao, refused up front on TE (which has no
such recipe) and for torchao's FP8 all-gather (tensorwise only); the emulator runs them for CPU study."""
from __future__ import annotations

import pytest
import torch

from fp8lab import autocast, convert_model
from fp8lab.core.hardware import Machine
from fp8lab.fp8 import formats
from fp8lab.fp8.backends.emulated import TensorQuantizers
from fp8lab.fp8.recipe import Recipe
from fp8lab.model.models import build_model
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.runplan import plan_run

H100 = Machine("cuda", "H100 80GB", 79.2, world_size=1, te_usable=True, fp8=True)
H100x8 = Machine("cuda", "H100 80GB", 79.2, world_size=8, te_usable=True, fp8=True)


@pytest.mark.parametrize("kind", ["rowwise", "rowwise_with_gw_hp"])
def test_torchao_plans_the_rowwise_recipes_and_te_refuses_them_before_building(kind):
    plan = plan_run(TrainConfig(model="llama-1b", precision="fp8", backend="torchao", recipe=kind), H100)
    assert plan.recipe == Recipe(kind=kind, format="e4m3")
    with pytest.raises(ValueError, match=rf"--recipe {kind} is a torchao recipe: use --backend torchao, or on TE "
                                         r"--recipe delayed \| current \| block \| mxfp8"):
        plan_run(TrainConfig(model="llama-1b", precision="fp8", backend="te", recipe=kind), H100)


def test_torchao_refuses_what_it_cannot_do_up_front():
    with pytest.raises(ValueError, match=r"--backend torchao runs --recipe current \| rowwise \| rowwise_with_gw_hp"):
        plan_run(TrainConfig(model="llama-1b", precision="fp8", backend="torchao", recipe="block"), H100)
    fsdp = dict(model="llama-1b", precision="fp8", backend="torchao", recipe="rowwise", parallel="fsdp")
    with pytest.raises(ValueError, match="--fp8-all-gather on needs per-tensor scaling"):
        plan_run(TrainConfig(**fsdp, fp8_all_gather="on"), H100x8)
    assert plan_run(TrainConfig(**fsdp), H100x8).fp8_all_gather is False


def test_rowwise_scales_each_row_on_its_own():
    t = torch.randn(8, 64) * torch.logspace(-3, 3, 8)[:, None]  # rows six decades apart
    xq = TensorQuantizers(Recipe.parse("rowwise"), None)("x", t)
    rel = (xq - t).norm(dim=1) / t.norm(dim=1)
    assert rel.max() < 0.07  # every row keeps E4M3's precision
    whole = formats.quantize_current(t, formats.E4M3)  # one scale for the tensor flushes the small rows
    assert ((whole - t).norm(dim=1) / t.norm(dim=1))[0] > 0.5 > rel[0]


@pytest.mark.parametrize("kind", ["rowwise", "rowwise_with_gw_hp"])
def test_the_emulator_trains_the_rowwise_recipes(kind):
    torch.manual_seed(0)
    model = convert_model(build_model("llama-tiny"), backend="emulated", recipe=kind)
    ids = torch.randint(0, model.config.vocab_size, (2, 32))
    with autocast("emulated", kind):
        loss = model(ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_rowwise_with_gw_hp_keeps_the_weight_gradient_unquantized():
    from fp8lab.fp8.backends.emulated import _FP8Linear

    torch.manual_seed(0)
    x, w = torch.randn(6, 32, requires_grad=True), torch.randn(8, 32, requires_grad=True)
    gy = torch.randn(6, 8)
    grads = {}
    for kind in ("rowwise", "rowwise_with_gw_hp"):
        x.grad = w.grad = None
        _FP8Linear.apply(x, w, None, TensorQuantizers(Recipe.parse(kind), None)).backward(gy)
        grads[kind] = (x.grad.clone(), w.grad.clone())
    torch.testing.assert_close(grads["rowwise_with_gw_hp"][1], gy.t() @ x.detach())  # exact: no FP8 in the GEMM
    assert not torch.allclose(grads["rowwise"][1], gy.t() @ x.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(grads["rowwise"][0], grads["rowwise_with_gw_hp"][0])  # the input gradient: same FP8
