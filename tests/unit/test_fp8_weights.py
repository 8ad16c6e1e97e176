"""``--fp8-weights`` (fp8lab.plan.fp8_weights) as the plan and the memory estimate apply it, and the master weights'
part of it on the CPU (fp8lab.train.master_weights.replace_param, fp8lab.train.fp8_weights): a stand-in for TE's
Float8Tensor keeps E4M3 values, as TE's does; the real one is tested on the GPU (tests/gpu/test_fp8_weights_gpu.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from fp8lab.core.hardware import Machine
from fp8lab.model.models import get_config
from fp8lab.plan import layout as fl
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.evidence import Evidence
from fp8lab.plan.runplan import plan_run

H100 = Machine("cuda", "NVIDIA H100 80GB HBM3", 79.2, te_usable=True, fp8=True)


def _plan(model="llama-7b", precision="fp8", **kw):
    return plan_run(TrainConfig(model=model, precision=precision, device="cpu", **kw), H100, Evidence())


def test_primary_keeps_the_layout_drops_the_cache_and_puts_fp8_ten_percent_below_bf16_in_the_estimate():
    """llama-7b under --memory offload on one H100: the same layout as the cast weights (BF16's estimate binds), no
    FP8 cache, and FP8's estimated peak at least 10% below BF16's (the cast weights' is above it)."""
    cast, primary, bf16 = _plan(memory="offload"), _plan(memory="offload", fp8_weights="primary"), \
        _plan(precision="bf16", memory="offload", fp8_weights="primary")
    assert primary.layout.micro_batch_size == cast.layout.micro_batch_size == 4
    assert primary.layout.grad_accum == cast.layout.grad_accum
    assert primary.fp8_primary_weights and not primary.weight_cache and cast.weight_cache
    assert not bf16.fp8_primary_weights  # the other half of a pair keeps bf16 weights
    assert primary.record()["fp8_weights"] == primary.options()["fp8_weights"] == "primary"
    assert cast.record()["fp8_weights"] == "cast" and bf16.record()["fp8_weights"] is None
    assert primary.reasons["fp8_weights"].startswith("--fp8-weights primary")
    assert "FP8 already" in primary.reasons["fp8_weight_cache"]
    kw = dict(precision="fp8", micro_batch_size=4, seq_len=2048, memory_mode="offload")
    cfg = get_config("llama-7b")
    with_cache = fl.estimate_memory(cfg, weight_cache=True, **kw)
    fp8 = fl.estimate_memory(cfg, fp8_primary=True, **kw)
    base = fl.estimate_memory(cfg, **{**kw, "precision": "bf16"})
    assert fp8.fp8_cache == 0 and with_cache.fp8_cache > 12
    # the blocks' weights: a byte each instead of two, and no cache of two more
    assert with_cache.peak - fp8.peak == pytest.approx(3 * fl._block_linear_params(cfg) / 2**30)
    assert fp8.peak <= 0.9 * base.peak < with_cache.peak


def test_auto_keeps_the_cast_weights_until_primarys_loss_check_is_committed():
    p = _plan(memory="offload")
    assert not p.fp8_primary_weights and "loss check" in p.reasons["fp8_weights"]
    assert not _plan("llama-1b").fp8_primary_weights  # and every layout that fits today is unchanged
    assert _plan("llama-1b").weight_cache == _plan("llama-1b", fp8_weights="cast").weight_cache


def test_auto_takes_primary_where_it_runs_once_its_loss_check_holds(tmp_path):
    """The evidence (fp8lab.plan.evidence) reads primary's verdict from its loss.json; with it, auto keeps the 7B's
    FP8 weights only in FP8 under offload, and every run that fits in plain keeps its cast weights."""
    import json

    from fp8lab.plan import evidence as fevidence

    folder = tmp_path / fevidence.FP8_WEIGHTS_STUDY
    folder.mkdir()
    (folder / "loss.json").write_text(json.dumps({"modes": {"primary": {"holds": True, "gap_pct": 0.1}}}))
    checked = Evidence.from_dict(fevidence.from_results(tmp_path))
    assert checked.fp8_weights and not Evidence.from_dict(fevidence.from_results(tmp_path / "none")).fp8_weights

    def plan(model, **kw):
        return plan_run(TrainConfig(model=model, precision="fp8", device="cpu", **kw), H100, checked)

    p = plan("llama-7b", memory="offload")
    assert p.fp8_primary_weights and p.reasons["fp8_weights"].startswith("auto: the blocks' weights only in FP8")
    assert p.layout.memory.peak < _plan(memory="offload").layout.memory.peak  # the estimate counted it
    assert not plan("llama-7b", memory="offload", fp8_weights="cast").fp8_primary_weights
    small = plan("llama-1b")
    assert not small.fp8_primary_weights and small.layout == _plan("llama-1b").layout


@pytest.mark.parametrize("kw,why", [
    (dict(model="llama-1b"), "--memory offload"),
    (dict(memory="offload", backend="emulated"), "Transformer Engine's fused blocks"),
    (dict(memory="offload", lora_rank=8, task="sft"), "LoRA"),
    (dict(model="llama-1b", memory="offload", cuda_graphs="on"), "CUDA graphs"),
    (dict(memory="offload", machine=Machine("cuda", "NVIDIA H100 80GB HBM3", 79.2, te_usable=True, fp8=True,
                                           world_size=2)), "one process"),
])
def test_primary_where_it_cannot_run_is_refused_naming_the_option_why_and_what_can(kw, why):
    kw = {"model": "llama-7b", **kw}
    machine = kw.pop("machine", H100)
    with pytest.raises(ValueError) as e:
        plan_run(TrainConfig(precision="fp8", device="cpu", fp8_weights="primary", **kw), machine, Evidence())
    assert "--fp8-weights primary" in str(e.value) and why in str(e.value) and "auto | cast" in str(e.value)


def test_an_unknown_value_is_refused_with_the_allowed_ones():
    with pytest.raises(ValueError) as e:
        TrainConfig(fp8_weights="fp8")
    assert "fp8_weights" in str(e.value).replace("-", "_") and "primary" in str(e.value)


class _E4M3(torch.Tensor):
    """A stand-in for TE's Float8Tensor: bf16 storage holding only E4M3 values (per-tensor scale), with the two
    methods fp8lab calls (quantize_, update_usage)."""

    @staticmethod
    def of(x: torch.Tensor) -> "_E4M3":
        return torch.Tensor._make_subclass(_E4M3, torch.empty_like(x, dtype=torch.bfloat16)).quantize_(x)

    def quantize_(self, src: torch.Tensor) -> "_E4M3":
        scale = 448.0 / src.detach().abs().max().clamp_min(1e-12)
        with torch.no_grad():
            self.data.copy_(((src.float() * scale).to(torch.float8_e4m3fn).float() / scale).to(torch.bfloat16))
        return self

    def update_usage(self, columnwise_usage=None):
        self.__dict__.setdefault("usages", []).append(columnwise_usage)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))


@pytest.mark.parametrize("streamed", [False, True])
def test_master_weights_write_each_step_into_the_replacing_fp8_weights(streamed):
    """replace_param: the new weight's gradient steps the old one's master, and each step quantizes the master's
    bf16 rounding into it; the other parameters are bf16 copies as before."""
    from fp8lab.train import optim as foptim
    from fp8lab.train.fp8_weights import block_weights, drop_transposes, make_primary
    from fp8lab.train.master_weights import MasterWeights

    c = TrainConfig(lr=1e-2, weight_decay=0.0, device="cpu")
    net = _net()
    mw = MasterWeights(net, lambda ps: foptim.make_optimizer(ps, c, torch.device("cpu")), streamed=streamed)
    weights = block_weights([net], owns=lambda m: isinstance(m, nn.Linear))
    assert [n for _, n in weights] == ["weight", "weight"]  # the 2-d weights, not the biases
    olds = [getattr(m, n) for m, n in weights]
    made = make_primary(weights, mw, _E4M3.of)
    assert all(isinstance(p, _E4M3) and isinstance(p, nn.Parameter) for p in made)
    assert net[0].weight is made[0] and all(not any(p is o for p in mw.params) for o in olds)
    x = torch.randn(8, 16)
    for _ in range(3):
        net(x.to(torch.bfloat16)).float().square().mean().backward()
        drop_transposes(made)
        mw.clip_grad_norm_(1.0)
        mw.step()
        mw.zero_grad()
    assert all(p.usages == [False] * 3 for p in made)
    for k, p in enumerate(mw.params):
        want = mw.masters[k].detach().to(torch.bfloat16)
        if any(p is q for q in made):
            assert torch.equal(p.data, _E4M3.of(want).data)
        else:
            assert torch.equal(p.data, want)
    assert not torch.equal(mw.masters[0].detach(), olds[0].detach().float())  # it trained


def test_replace_param_moves_a_fused_gradient_buffer_and_refuses_a_stranger():
    from fp8lab.train import optim as foptim
    from fp8lab.train.master_weights import MasterWeights

    c = TrainConfig(lr=1e-2, device="cpu")
    net = _net()
    mw = MasterWeights(net, lambda ps: foptim.make_optimizer(ps, c, torch.device("cpu")))
    mw.use_main_grad([net[0].weight])
    buffer = net[0].weight.main_grad
    new = nn.Parameter(_E4M3.of(net[0].weight.detach()))
    mw.replace_param(net[0].weight, new)
    assert new.main_grad is buffer and buffer.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="not among"):
        mw.replace_param(nn.Parameter(torch.zeros(3)), nn.Parameter(_E4M3.of(torch.zeros(3))))
    with pytest.raises(ValueError, match="quantized tensor of that shape"):
        mw.replace_param(net[2].weight, nn.Parameter(torch.zeros(16, 32)))


def test_the_memory_lesson_tells_primary_runs_from_cast_ones():
    """notebook 05's table of the runs measured in a memory mode: an FP8 run's weights, "cast" for records from before
    the option, "-" for BF16 runs; a plain run is not among them."""
    import pandas as pd

    from fp8lab.analysis.memory_lesson import measured_by_mode

    base = dict(model="llama-7b", gpu_name="NVIDIA H100 80GB HBM3", micro_batch_size=4, grad_accum=32,
                tokens_per_sec_per_gpu=1.0, max_mem_gib=50.0)
    summary = pd.DataFrame([
        {**base, "run_id": "a", "variant": "bf16", "precision": "bf16", "memory": "offload"},
        {**base, "run_id": "b", "variant": "fp8-old", "precision": "fp8", "memory": "offload"},
        {**base, "run_id": "c", "variant": "fp8-w", "precision": "fp8", "memory": "offload", "fp8_weights": "primary"},
        {**base, "run_id": "d", "variant": "fp8-plain", "precision": "fp8", "memory": "plain"},
    ])
    table = measured_by_mode(summary)
    assert dict(zip(table["variant"], table["fp8_weights"])) == {"bf16": "-", "fp8-old": "cast", "fp8-w": "primary"}


def test_a_primary_runs_master_weights_replace_every_block_weight_and_free_the_bf16_ones(monkeypatch):
    """fp8lab.train.optim.master_weights on the emulated fused blocks (TE's layout of modules; the stand-in FP8 tensor
    for TE's): every block linear's weight becomes an FP8 parameter, the fused accumulation's list and buffers follow
    the new parameters, no bf16 block weight stays alive, and a step trains through them."""
    import gc
    import types
    import weakref

    from fp8lab.fp8.convert import convert_model
    from fp8lab.fp8.fused import decoder_layers
    from fp8lab.model.models import build_model
    from fp8lab.train import fp8_weights as fp8w, optim as foptim

    monkeypatch.setattr(fp8w, "is_te_module", lambda m: type(m).__module__.endswith(".emulated"))
    monkeypatch.setattr(fp8w, "te_quantizer", lambda recipe: _E4M3.of)
    model = convert_model(build_model("llama-tiny"), backend="emulated", fuse=True).to(torch.bfloat16)
    blocks = [b for _, b in decoder_layers(model)]
    olds = [getattr(m, n) for m, n in fp8w.block_weights(blocks)]
    assert len(olds) == 4 * len(blocks)  # qkv, proj, fc1, fc2
    other = model.lm_head.weight
    handed = [olds[0], other]  # (given up when asked for, as the model keeps no list of its own)
    monkeypatch.setattr(model, "wgrad_into_main_grad", lambda: [handed.pop(0) for _ in range(2)])
    refs = [weakref.ref(w) for w in olds]
    plan = types.SimpleNamespace(memory_mode="offload", streamed_step=False, fused_wgrad=True,
                                 fp8_primary_weights=True, recipe=types.SimpleNamespace(to_te=lambda: None))
    c = TrainConfig(lr=1e-2, device="cpu")
    del olds
    master, fused, made = foptim.master_weights(model, plan, c, torch.device("cpu"))
    gc.collect()
    assert not any(r() is not None for r in refs)  # every bf16 block weight is gone
    assert [getattr(m, n) for m, n in fp8w.block_weights(blocks)] == made
    assert all(isinstance(p, _E4M3) for p in made)
    assert fused[0] is made[0] and fused[1] is other and made[0].main_grad.dtype == torch.bfloat16
    x = torch.randint(0, model.config.vocab_size, (2, 32))
    before = [p.data.clone() for p in made]
    model(input_ids=x, labels=x).loss.backward()
    master.clip_grad_norm_(1.0)
    master.step()
    master.zero_grad()
    assert all(not torch.equal(p.data, b) for p, b in zip(made, before))
