"""LoRA's options, rule and memory (fp8lab.plan.lora) and its mechanism on a converted model (fp8lab.train.lora):
bad values refused naming the option and what is allowed, before anything is built; a frozen base counted as its
weights only; peft's adapters on the emulator's FP8 layers, the only parameters with gradients."""
from __future__ import annotations

import re

import pytest
import torch

from fp8lab.core.hardware import Machine
from fp8lab.model.models import count_parameters, get_config
from fp8lab.plan import lora as lora_plan
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.layout import estimate_memory
from fp8lab.plan.runplan import plan_run

H100 = Machine("cuda", "NVIDIA H100 80GB HBM3", 79.2, te_usable=True, fp8=True)
CPU = Machine("cpu", "cpu", 24.0)
LORA = dict(lora_rank=8, fuse=False)


@pytest.mark.parametrize("kw, flag, allowed", [
    ({"lora_rank": -1}, "--lora-rank", lora_plan.RANK_ALLOWED),
    ({"lora_rank": 2.5}, "--lora-rank", lora_plan.RANK_ALLOWED),
    ({**LORA, "lora_alpha": 0}, "--lora-alpha", lora_plan.ALPHA_ALLOWED),
    ({**LORA, "lora_dropout": 1.0}, "--lora-dropout", lora_plan.DROPOUT_ALLOWED),
    ({**LORA, "lora_targets": "q_proj,qkv"}, "--lora-targets", "all (every one) or comma-separated names of "
                                                                "q_proj, k_proj, v_proj, o_proj, gate_proj"),
    ({**LORA, "lora_targets": "q_proj,q_proj"}, "--lora-targets", "comma-separated names"),
    ({**LORA, "model": "gptneo-tiny", "lora_targets": "o_proj"}, "--lora-targets", "out_proj, c_fc, c_proj"),
    ({"export_merged": True}, "--export-merged", "False without --lora-rank"),
])
def test_bad_lora_options_are_refused_naming_the_option_and_what_is_allowed(kw, flag, allowed):
    with pytest.raises(ValueError, match=re.escape(flag) + r"=.* is invalid; allowed: .*" + re.escape(allowed)):
        TrainConfig(**kw)


def test_lora_options_from_the_command_line_and_a_job():
    from fp8lab import launch as L
    from fp8lab.launch.spec import hyperparameters
    from fp8lab.train import entry

    c = entry.parse_args(["--lora-rank", "16", "--lora-alpha", "32", "--lora-dropout", "0.05", "--lora-targets",
                          "q_proj,v_proj", "--fuse", "False", "--export-merged", "True"])
    assert (c.lora_rank, c.lora_alpha, c.lora_dropout, c.lora_targets, c.export_merged) == \
        (16, 32.0, 0.05, "q_proj,v_proj", True)
    assert lora_plan.parse_targets(c.lora_targets, "llama") == ("q_proj", "v_proj")
    with pytest.raises(ValueError, match="--lora-rank"):
        entry.parse_args(["--lora-rank", "-2"])
    base = dict(model="llama-1b", precision="fp8", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, steps=10)
    spec = L.JobSpec(**base, fuse=False, options={"lora_rank": 16, "export_merged": True})  # (fuse: a field)
    hp = hyperparameters(spec)
    assert hp["lora-rank"] == 16 and hp["export-merged"] is True and hp["fuse"] is False
    assert entry.parse_args([w for k, v in hp.items() for w in (f"--{k}", str(v))]).lora_rank == 16  # as the job reads
    with pytest.raises(ValueError, match=r"lora.rank=-1 is invalid; allowed: an integer >= 0"):
        L.JobSpec(**base, fuse=False, options={"lora_rank": -1})
    assert hyperparameters(L.JobSpec(**base, fuse=True, options={"lora_rank": 16}))["fuse"] is True  # fused LoRA


def test_fuse_auto_fuses_the_blocks_under_lora_too_and_false_keeps_peft_layers():
    """The plain command ``--lora-rank N`` builds the fused blocks with fp8lab's adapters on their GEMMs (measured
    faster than peft's on the unfused layers); ``--fuse False`` the unfused layers peft adapts."""
    assert TrainConfig().fuse == "auto" and lora_plan.fuses(TrainConfig()) is True
    assert lora_plan.fuses(TrainConfig(lora_rank=8)) is True
    assert lora_plan.fuses(TrainConfig(lora_rank=8, fuse=False)) is False and lora_plan.fuses(TrainConfig(fuse=False)) is False
    plan = plan_run(TrainConfig(model="llama-1b", precision="fp8", lora_rank=16, task="sft"), H100)
    assert plan.options()["fuse"] is True
    assert plan_run(TrainConfig(model="llama-1b", precision="fp8", lora_rank=16, task="sft", fuse=False),
                    H100).options()["fuse"] is False
    assert plan_run(TrainConfig(model="llama-1b", precision="fp8"), H100).options()["fuse"] is True


def test_adapter_count_is_rank_times_in_plus_out_per_projection():
    m = get_config("llama-1b")
    q, kv = m.num_heads * m.head_dim, m.kv_heads * m.head_dim
    h, f = m.hidden_size, m.intermediate_size
    per_block = 8 * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + f) + (f + h))
    assert lora_plan.adapter_params(m, 8, lora_plan.PROJECTIONS["llama"]) == m.num_layers * per_block
    assert lora_plan.adapter_params(m, 8, ("q_proj", "v_proj")) == m.num_layers * 8 * ((h + q) + (h + kv))
    assert lora_plan.trainable_params(TrainConfig(), m) is None  # full fine-tune: everything trains


def test_the_memory_estimate_counts_a_frozen_base_as_its_weights_only():
    m = get_config("llama-7b")
    n = count_parameters(m).total
    t = lora_plan.adapter_params(m, 16, lora_plan.PROJECTIONS["llama"])
    kw = dict(precision="fp8", micro_batch_size=1, seq_len=2048, param_dtype="bf16", backend="te", fuse=False)
    full, lora = estimate_memory(m, **kw), estimate_memory(m, **kw, trainable=t)
    gib = 2**30
    assert full.states == pytest.approx(16 * n / gib)
    assert lora.states == pytest.approx((2 * n + 16 * t) / gib)  # bf16 base; adapters: weight, grad, master, AdamW
    assert lora.step == pytest.approx(lora.states + 2 * t / gib)  # master gradients of the adapters only
    assert lora.activations == full.activations
    sharded = estimate_memory(m, **kw, trainable=t, world_size=8, parallel="fsdp")  # FSDP2 keeps fp32 shards
    assert sharded.states == pytest.approx((4 * n + 16 * t) / 8 / gib)
    # the plan: a 7B model does not fit one H100 with full AdamW states, but does with LoRA
    with pytest.raises(ValueError, match="does not fit"):
        plan_run(TrainConfig(model="llama-7b", precision="fp8", fuse=False), H100)
    p = plan_run(TrainConfig(model="llama-7b", precision="fp8", **{**LORA, "lora_rank": 16}), H100)
    assert p.layout.memory.states == pytest.approx(lora.states) and p.layout.memory.peak < 79.2


def _lora_model(param_dtype: str, **kw):
    from fp8lab.fp8.convert import convert_model
    from fp8lab.model.models import build_model
    from fp8lab.train import lora as flora

    plan = plan_run(TrainConfig(model="llama-tiny", precision="fp8", backend="emulated", param_dtype=param_dtype,
                                **LORA, **kw), CPU)
    model = convert_model(build_model("llama-tiny", seed=0), backend="emulated", fuse=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    return model, flora.apply(model, plan), plan, before


def test_peft_wraps_the_emulated_fp8_layers_and_only_the_adapters_get_gradients():
    from peft.tuners.lora import LoraLayer

    from fp8lab.fp8.backends.emulated import EmuLinear
    from fp8lab.fp8.convert import autocast

    model, adapters, plan, before = _lora_model("fp32", lora_targets="q_proj,v_proj,down_proj")
    wrapped = {n.rsplit(".", 1)[1] for n, m in model.named_modules() if isinstance(m, LoraLayer)}
    assert wrapped == {"q_proj", "v_proj", "down_proj"}
    assert all(isinstance(m.get_base_layer(), EmuLinear) for m in model.modules() if isinstance(m, LoraLayer))
    assert adapters.params == lora_plan.adapter_params(plan.model_config, 8, ("q_proj", "v_proj", "down_proj"))
    assert adapters.params + adapters.frozen == sum(p.numel() for p in model.parameters())
    assert "8 adapter parameters" not in adapters.describe() and f"{adapters.params:,}" in adapters.describe()
    x = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    with autocast("emulated", plan.recipe):  # the base GEMMs in emulated FP8
        model(x, labels=x).loss.backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad and all(".lora_" in n for n in with_grad)
    assert {n for n, p in model.named_parameters() if p.requires_grad} == with_grad
    # peft starts B at zero: the model is unchanged until the adapters train
    after = {k.replace(".base_layer.", "."): v for k, v in model.state_dict().items() if ".lora_" not in k}
    assert set(after) == set(before)
    assert all(torch.equal(after[k], before[k]) for k in before if not k.endswith("_extra_state"))  # (FP8 scales move)


def test_bf16_parameters_keep_a_bf16_frozen_base_and_fp32_adapters():
    model, adapters, _, _ = _lora_model("bf16")
    dtypes = {(".lora_" in n, p.dtype) for n, p in model.named_parameters()}
    assert dtypes == {(True, torch.float32), (False, torch.bfloat16)}
    assert adapters.built()["lora_targets"] == list(lora_plan.PROJECTIONS["llama"])


def _fused_lora(name: str, targets: str):
    from fp8lab.fp8.convert import convert_model
    from fp8lab.model.models import build_model
    from fp8lab.train import lora as flora

    plan = plan_run(TrainConfig(model=name, precision="bf16", backend="emulated", compute_dtype="fp32", lora_rank=4,
                                lora_targets=targets), CPU)
    model = convert_model(build_model(name, seed=0), backend="emulated", fuse=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    adapters = flora.apply(model, plan)
    return model, adapters, plan, before


@pytest.mark.parametrize("name, targets", [("llama-tiny", "all"), ("llama-tiny", "q_proj,v_proj,down_proj"),
                                           ("gptneo-tiny", "all"), ("gptneo-tiny", "k_proj,out_proj")])
def test_adapters_on_the_fused_blocks_give_pefts_lora_on_the_transformers_model(name, targets):
    """fp8lab's adapters on the fused blocks compute what peft's LoRA computes on the plain transformers model holding
    the same weights and adapters (the export's mapping), and only they get gradients."""
    from peft import get_peft_model

    from fp8lab.fp8.fused import SplitMLP
    from fp8lab.model.models import build_model
    from fp8lab.train import lora as flora

    model, adapters, plan, before = _fused_lora(name, targets)
    names = lora_plan.parse_targets(targets, plan.model_config.family)
    assert adapters.adapted == len(names) * plan.model_config.num_layers
    assert adapters.params == lora_plan.adapter_params(plan.model_config, 4, names)
    assert adapters.params + adapters.frozen == sum(p.numel() for p in model.parameters())
    mlp_targets = {"gate_proj", "up_proj", "down_proj", "c_fc", "c_proj"} & set(names)
    assert all(isinstance(b.mlp, SplitMLP) == bool(mlp_targets) for b in model.blocks)
    x = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        untouched = model(x).logits  # B starts at zero: the base model's logits
        for n, p in model.named_parameters():
            if ".lora_B" in n:
                p.normal_(0, 0.05)
        got = model(x).logits
    base, trained = flora.split_state_dict(model.state_dict(), model)
    # the base under HF names is the model as built, bit for bit (the MLP split moves no weight)
    hf = build_model(name, seed=1)
    hf.load_state_dict(base, strict=True)
    ref = get_peft_model(hf, adapters.config, adapter_name=flora.ADAPTER)
    result = ref.base_model.model.load_state_dict(trained, strict=False)
    assert not result.unexpected_keys and not [k for k in result.missing_keys if ".lora_" in k]
    with torch.no_grad():
        want = ref.eval()(x).logits
        with ref.disable_adapter():
            plain = ref(x).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(untouched, plain, rtol=1e-4, atol=1e-4)
    assert (got - plain).abs().max() > 1e-2  # the adapters changed the output
    # under bf16 autocast a GEMM's adapters join in one product (BlockAdapters.onto): peft's logits to bf16 precision
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fast, slow = model(x).logits.float(), ref(x).logits.float()
    torch.testing.assert_close(fast, slow, rtol=3e-2, atol=3e-2)
    model.train()
    model(x, labels=x).loss.backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    assert with_grad == {n for n, p in model.named_parameters() if p.requires_grad}
    assert with_grad and all(".lora_" in n for n in with_grad)


def test_the_split_mlp_keeps_the_weights_and_the_weight_map_follows():
    """Splitting the MLP for adapters moves no weight: the fused model maps to the same transformers state dict."""
    from fp8lab.fp8.fused import SPLIT_MLP_NAMES
    from fp8lab.model.models import build_model
    from fp8lab.train import lora as flora

    model, _, _, before = _fused_lora("llama-tiny", "up_proj")
    assert model.spec.split_mlp and all(b.spec.split_mlp for b in model.blocks)
    after = model.state_dict()
    for k, v in before.items():
        head, sep, name = k.partition(".mlp.")
        key = f"{head}.mlp.{SPLIT_MLP_NAMES[name]}" if sep and not name.endswith("_extra_state") else k
        if not k.endswith("_extra_state"):
            assert torch.equal(after[key], v), key
    base, adapters = flora.split_state_dict(after, model)
    want = build_model("llama-tiny", seed=0).state_dict()
    assert set(base) == set(want) and all(torch.equal(base[k], want[k]) for k in want)
    assert set(adapters) == {f"model.layers.{i}.mlp.up_proj.lora_{ab}.default.weight" for i in range(2) for ab in "AB"}


def test_fused_lora_memory_follows_the_targets_and_dropout_and_graphs_wgrad_stay_off():
    """On TE's fused blocks the adapters' kept inputs grow with the GEMMs adapted and with dropout (its own copy
    per adapter); CUDA graphs and the in-place weight-gradient GEMMs are off under LoRA, each with its reason."""
    m = get_config("llama-1b")
    t = lora_plan.adapter_params(m, 16, lora_plan.PROJECTIONS["llama"])
    kw = dict(precision="fp8", micro_batch_size=4, seq_len=2048, param_dtype="bf16", backend="te", fuse=True,
              trainable=t)
    plain = estimate_memory(m, **kw)
    qv = estimate_memory(m, **kw, lora=(("q_proj", "v_proj"), False))
    every = estimate_memory(m, **kw, lora=(lora_plan.PROJECTIONS["llama"], False))
    dropped = estimate_memory(m, **kw, lora=(lora_plan.PROJECTIONS["llama"], True))
    assert plain.activations < qv.activations < every.activations < dropped.activations
    tokens, gib = 4 * 2048, 2**30
    h = m.hidden_size
    assert qv.activations - plain.activations == pytest.approx(m.num_layers * h * tokens / gib)  # one norm output
    unfused = estimate_memory(m, **{**kw, "fuse": False}, lora=(lora_plan.PROJECTIONS["llama"], True))
    assert unfused.activations == estimate_memory(m, **{**kw, "fuse": False}).activations  # peft's: HF's factor
    plan = plan_run(TrainConfig(model="llama-1b", precision="fp8", lora_rank=16, fuse=True, micro_batch_size=1,
                                cuda_graphs="auto"), H100)
    assert plan.graphs.active is False and "LoRA" in plan.graphs.reason
    assert plan.decisions()["fuse_wgrad_accumulation"] is False
    with pytest.raises(ValueError, match="--cuda-graphs on: CUDA graphs are not tested with LoRA"):
        plan_run(TrainConfig(model="llama-1b", precision="fp8", lora_rank=16, fuse=True, cuda_graphs="on"), H100)


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_an_adapter_under_autocast_gives_the_bits_of_its_input_cast_to_fp32_first(dropout):
    """Under bf16 autocast (the trainer's on a GPU) an adapter without dropout hands its bf16 input straight to its
    GEMM, which casts to bf16 anyway: the output is bit for bit that of the input cast to fp32 first (as peft does),
    and the tensor kept for the backward is the input itself, not a copy per adapter. With dropout it casts first."""
    from fp8lab.train.lora import Adapter

    torch.manual_seed(0)
    adapter = Adapter(64, 96, 8, 16.0, dropout)
    torch.nn.init.normal_(adapter.lora_B.weight)  # (B starts at zero: give the output something to compare)
    x = torch.randn(4, 10, 64).to(torch.bfloat16).requires_grad_()
    kept = []

    def pack(t):
        kept.append(t)
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch.manual_seed(1)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = adapter(x)
        torch.manual_seed(1)  # the same dropout mask for the reference: the input cast to fp32 before its GEMM
        x_ref = x.detach().clone().requires_grad_()
        ref = adapter.lora_B(adapter.lora_A(adapter.dropout(x_ref.float())) * adapter.scaling).to(x.dtype)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)
    grads = torch.autograd.grad(ref.float().sum(), [x_ref, adapter.lora_A.weight, adapter.lora_B.weight])
    if not dropout:
        inputs = [t for t in kept if t.numel() == x.numel()]  # what lora_A keeps of its input (a 2-D view)
        assert inputs and all(t.data_ptr() == x.data_ptr() and t.dtype == torch.bfloat16 for t in inputs)
    out.float().sum().backward()
    assert adapter.lora_A.weight.grad.dtype == torch.float32
    for got, want in zip((x.grad, adapter.lora_A.weight.grad, adapter.lora_B.weight.grad), grads):
        assert torch.equal(got, want)  # the backward's bits too
    outside = Adapter(64, 96, 8, 16.0, 0.0)(x.detach())  # without autocast: in the adapters' fp32, returned in x's dtype
    assert outside.dtype == torch.bfloat16


@pytest.mark.parametrize("autocast,dropout", [(True, 0.0), (True, 0.1), (False, 0.0)])
@pytest.mark.parametrize("names", [("q_proj", "k_proj", "v_proj"), ("q_proj", "v_proj")])
def test_a_gemms_adapters_add_onto_its_whole_output_in_one_product_under_autocast(autocast, dropout, names):
    """``BlockAdapters.onto`` adds each adapter's product onto its row block of a fused GEMM's output (here q, k and v
    of one GEMM, or q and v alone): under bf16 autocast without dropout one GEMM of the A's and one addmm of the B's
    (equal to bf16 precision, gradients included); with dropout or without autocast the same bits as each adapter's
    own sum on its block."""
    from fp8lab.train.lora import Adapter, BlockAdapters

    torch.manual_seed(0)
    sizes, order = [64, 16, 16], ("q_proj", "k_proj", "v_proj")
    block = BlockAdapters({n: Adapter(48, w, 8, 16.0, dropout) for n, w in zip(order, sizes) if n in names}, "llama")
    for adapter in block.values():
        torch.nn.init.normal_(adapter.lora_B.weight, std=0.05)
    out = torch.randn(4, 10, sum(sizes)).to(torch.bfloat16)
    x = torch.randn(4, 10, 48).to(torch.bfloat16)
    results = []
    for fused in (True, False):
        out_in, x_in = out.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
        block.zero_grad()
        torch.manual_seed(1)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if fused:
                got = block.onto("qkv", out_in, x_in, sizes)
            else:
                pieces = list(out_in.split(sizes, -1))
                for i, name in enumerate(order):
                    if name in block:
                        pieces[i] = pieces[i] + block[name](x_in)
                got = torch.cat(pieces, -1)
        (got.float() * torch.linspace(-1, 1, got.numel()).view(got.shape)).sum().backward()
        results.append((got, out_in.grad, x_in.grad, *(p.grad.clone() for p in block.parameters())))
    (one_gemm, *grads), (summed, *want) = results
    assert one_gemm.shape == summed.shape == out.shape and one_gemm.dtype == summed.dtype == torch.bfloat16
    assert len(grads) == 2 + 2 * len(names)
    if autocast and not dropout:
        assert not torch.equal(one_gemm, summed)  # one rounding, not two: the joined path did run
        torch.testing.assert_close(one_gemm.float(), summed.float(), rtol=1.6e-2, atol=1e-2)
        for g, w in zip(grads, want):
            torch.testing.assert_close(g.float(), w.float(), rtol=2e-2, atol=2e-2)
    else:
        assert torch.equal(one_gemm, summed) and all(torch.equal(g, w) for g, w in zip(grads, want))
    assert block.onto("fc1", out, x, None) is out  # a GEMM none of them adapts: its output as it is


def test_the_split_mlps_swiglu_gives_autograds_values_and_gradients_bit_for_bit():
    """fc1's output [gate, up] -> silu(gate) * up through fp8lab.fp8.fused.SwiGLU, whose backward writes the gradient
    as one tensor: the same bits as autograd's formula, forward and backward, in bf16 and fp32."""
    from swiglu_check import assert_swiglu_is_autograds

    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        assert_swiglu_is_autograds(torch.randn(3, 7, 2 * 40).to(dtype))


@pytest.mark.parametrize("alpha", [1.0, 2.0])
def test_the_low_rank_sum_is_written_into_the_gemms_output_with_addmms_bits_and_gradients(alpha):
    """``AddLowRank`` (BlockAdapters' last product): out-of-place addmm's values and gradients bit for bit under bf16
    autocast, written into the GEMM output's own memory (no copy of the whole output first)."""
    from fp8lab.train.lora import AddLowRank

    torch.manual_seed(0)
    out, z, b = torch.randn(4, 10, 96).bfloat16(), torch.randn(4, 10, 24).bfloat16(), torch.randn(96, 24) * 0.05
    results = []
    for mine in (True, False):
        o, zz, bb = (t.clone().requires_grad_() for t in (out, z, b))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fresh = o * 1  # a GEMM's output: not a leaf, nothing saves it
            if mine:
                y = AddLowRank.apply(fresh, zz, bb, alpha)
                assert y.data_ptr() == fresh.data_ptr()
            else:
                y = torch.addmm(fresh.reshape(-1, 96), zz.reshape(-1, 24), bb.t(), alpha=alpha).view(fresh.shape)
        (y.float() * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        results.append((y.detach(), o.grad, zz.grad, bb.grad))
    assert [t.dtype for t in results[0]] == [torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.float32]
    assert all(torch.equal(m, w) for m, w in zip(*results))


def test_the_low_rank_sum_goes_into_a_custom_functions_view_output_with_its_gradients():
    """TE's modules return their outputs as views made inside an autograd Function, which autograd forbids modifying
    in place; ``AddLowRank`` still writes into that memory and every gradient (through the Function's own backward
    included) equals an out-of-place addmm's."""
    from fp8lab.train.lora import AddLowRank

    class GemmReturningViews(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return (x.reshape(-1, x.shape[-1]) @ w.t()).view(*x.shape[:-1], w.shape[0])

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            g2 = g.reshape(-1, g.shape[-1])
            return (g2 @ w).view(x.shape), g2.t() @ x.reshape(-1, x.shape[-1])

    torch.manual_seed(0)
    inputs = torch.randn(2, 5, 8), torch.randn(12, 8), torch.randn(2, 5, 4), torch.randn(12, 4)
    results = []
    for mine in (True, False):
        x, w, z, b = (t.clone().requires_grad_() for t in inputs)
        out = GemmReturningViews.apply(x, w)
        assert out._is_view()
        if mine:
            with pytest.raises(RuntimeError, match="view"):
                out.add_(1.0)  # what autograd forbids
            y = AddLowRank.apply(out, z, b, 2.0)
            assert y.data_ptr() == out.data_ptr()
        else:
            y = torch.addmm(out.reshape(-1, 12), z.reshape(-1, 4), b.t(), alpha=2.0).view(out.shape)
        (y * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
        results.append((y.detach(), x.grad, w.grad, z.grad, b.grad))
    assert all(torch.allclose(m, r) for m, r in zip(*results))
