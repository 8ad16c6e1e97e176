"""LoRA on Transformer Engine (skipped without an FP8 GPU): peft's TE layer wraps the swapped ``te.Linear``
projections, forward and backward run under TE's FP8 autocast with gradients on the adapters only, a few steps
lower the loss; and a trainer run with ``--lora-rank`` on TE exports an adapter folder and a merged model that
give the trained model's logits to BF16 noise."""
from __future__ import annotations

import pytest
import torch

from fp8lab.data import tokens as fdata
from fp8lab.fp8.backends import available_backends, detect_machine
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.runplan import plan_run

pytestmark = pytest.mark.gpu


def _need_te() -> None:
    reason = available_backends()["te"]
    if reason is not None:
        pytest.skip(f"te: {reason}")


def test_peft_lora_on_te_linear_trains_the_adapters_under_fp8_autocast():
    _need_te()
    import transformer_engine.pytorch as te
    from peft.tuners.lora import LoraLayer
    from peft.tuners.lora.te import TeLinear

    from fp8lab.fp8.convert import autocast, convert_model
    from fp8lab.model.models import build_model
    from fp8lab.train import lora as flora

    c = TrainConfig(model="llama-tiny", precision="fp8", backend="te", fuse=False, lora_rank=8)
    plan = plan_run(c, detect_machine(torch.device("cuda"), 1, 0))
    model = convert_model(build_model("llama-tiny", device="cuda", seed=0), backend="te", fuse=False)
    adapters = flora.apply(model, plan)
    wrapped = [m for m in model.modules() if isinstance(m, LoraLayer)]
    assert len(wrapped) == 7 * plan.model_config.num_layers
    assert all(isinstance(m, TeLinear) and isinstance(m.get_base_layer(), te.Linear) for m in wrapped)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    x = torch.randint(0, 512, (4, 128), device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    losses = []
    for _ in range(8):
        with torch.autocast("cuda", dtype=torch.bfloat16), autocast("te", plan.recipe):
            loss = model(x, labels=x).loss
        loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        assert grads and all(".lora_" in n for n in grads) and all(torch.isfinite(g).all() for g in grads.values())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert adapters.params == sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens")
    fdata.prepare_data(None, out, None, vocab_size=512)
    return out


def test_a_lora_run_on_te_exports_adapters_and_merged_model_with_the_trained_logits(prepared, tmp_path,
                                                                                     capture_trained):
    _need_te()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, LlamaConfig

    from fp8lab.train.entry import train

    cfg = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    src = tmp_path / "mine"
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(src))
    out = tmp_path / "run"
    s = train(TrainConfig(model=str(src), precision="fp8", backend="te", fuse=False, lora_rank=8, export_merged=True,
                          seq_len=128, micro_batch_size=4, grad_accum=2, steps=10, lr=1e-2, warmup_steps=1,
                          val_every=0, plot=False, progress="off", print_metrics=False, data=str(prepared),
                          output_dir=str(out)))
    assert s["status"] == "completed"
    trained = capture_trained["inner"].eval()
    x = torch.randint(0, 512, (2, 64), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        want = trained(x).logits.float()

    def rel(m) -> float:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            got = m.to("cuda").eval()(x).logits.float()
        return float((got - want).norm() / want.norm())

    base = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    adapted = PeftModel.from_pretrained(base, str(out / "model"))
    merged = AutoModelForCausalLM.from_pretrained(str(out / "model" / "merged"), dtype=torch.float32)
    # bf16 noise: the trained model ran a bf16 base and bf16 adapter copies, the exports fp32 masters
    assert rel(adapted) < 2e-2 and rel(merged) < 2e-2
    untrained = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    assert rel(untrained) > rel(merged)  # the adapters trained: the exports are nearer the trained model


def test_lora_on_te_fused_blocks_matches_peft_and_trains_the_adapters_under_fp8():
    """fp8lab's adapters on the fused TE blocks (LayerNormLinear returning its norm's output, the MLP split in two)
    give the logits of peft's LoRA on the plain transformers model holding the same weights (BF16, no FP8), and under
    FP8 autocast only the adapters get gradients and a few steps lower the loss."""
    _need_te()
    import transformer_engine.pytorch as te
    from peft import get_peft_model

    from fp8lab.fp8.convert import autocast, convert_model
    from fp8lab.fp8.fused import SplitMLP
    from fp8lab.model.models import build_model
    from fp8lab.train import lora as flora

    c = TrainConfig(model="llama-tiny", precision="fp8", backend="te", lora_rank=8, fuse=True)
    plan = plan_run(c, detect_machine(torch.device("cuda"), 1, 0))
    assert plan.options()["fuse"] is True
    model = convert_model(build_model("llama-tiny", device="cuda", seed=0), backend="te", fuse=True)
    adapters = flora.apply(model, plan)
    assert adapters.adapted == 7 * plan.model_config.num_layers
    assert all(isinstance(b.mlp, SplitMLP) and isinstance(b.mlp.fc1, te.LayerNormLinear) for b in model.blocks)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if ".lora_B" in n:
                p.normal_(0, 0.05)  # (B starts at zero: a nonzero one makes the comparison see the adapters)
    x = torch.randint(0, 512, (2, 64), device="cuda", generator=torch.Generator(device="cuda").manual_seed(0))
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        got = model(x).logits.float()
    base, trained = flora.split_state_dict(model.state_dict(), model)
    hf = build_model("llama-tiny", device="cuda", seed=1)
    hf.load_state_dict(base, strict=True)
    ref = get_peft_model(hf, adapters.config, adapter_name=flora.ADAPTER)
    result = ref.base_model.model.load_state_dict(trained, strict=False)
    assert not result.unexpected_keys and not [k for k in result.missing_keys if ".lora_" in k]
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        want = ref.eval()(x).logits.float()
        with ref.disable_adapter():
            without = ref(x).logits.float()
    rel = float((got - want).norm() / want.norm())
    assert rel < 2e-2 and rel < 0.2 * float((without - want).norm() / want.norm())  # the adapters count, as peft's
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(8):
        with torch.autocast("cuda", dtype=torch.bfloat16), autocast("te", plan.recipe):
            loss = model(x, labels=x).loss
        loss.backward()
        grads = {n for n, p in model.named_parameters() if p.grad is not None}
        assert grads and all(".lora_" in n for n in grads)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


def test_the_split_mlps_swiglu_gives_autograds_bits_on_cuda():
    """fp8lab.fp8.fused.SwiGLU on the GPU, bf16 at a block's width: autograd's values and gradients bit for bit (its
    backward writes both halves of the gradient into one tensor through strided outputs)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from swiglu_check import assert_swiglu_is_autograds

    torch.manual_seed(0)
    assert_swiglu_is_autograds(torch.randn(2, 256, 2 * 1024, device="cuda").bfloat16())


def test_te_swiglu_of_a_split_mlp_is_layernormmlps_and_fp32s_to_bf16_rounding():
    """A split MLP on TE runs TE's SwiGLU kernels (fp8lab.fp8.backends.te.TESwiGLU): in BF16 the split MLP gives
    LayerNormMLP's output from the same weights, and its values and gradient are fp32's to bf16 rounding, as
    autograd's bf16 ``silu(gate) * up`` are (norm-wise: the largest error may be either's)."""
    _need_te()
    from fp8lab.fp8.backends.te import TESwiGLU
    from fp8lab.fp8.convert import convert_model
    from fp8lab.fp8.fused import SplitMLP
    from fp8lab.model.models import build_model

    torch.manual_seed(0)
    y = torch.randn(2, 256, 2 * 1024, device="cuda").bfloat16().float()  # bf16 values: the reference sees no rounding
    ref = y.clone().requires_grad_()
    gate, up = ref.chunk(2, -1)
    h_ref = torch.nn.functional.silu(gate) * up
    dh = torch.randn_like(h_ref).bfloat16().float()
    h_ref.backward(dh)
    errors = {}
    for name, fn in (("te", TESwiGLU.apply), ("autograd", lambda t: torch.nn.functional.silu(t.chunk(2, -1)[0])
                                                                     * t.chunk(2, -1)[1])):
        mine = y.bfloat16().requires_grad_()
        h = fn(mine)
        h.backward(dh.bfloat16())
        assert h.dtype == mine.grad.dtype == torch.bfloat16
        errors[name] = (float((h.float() - h_ref).norm() / h_ref.norm()),
                        float((mine.grad.float() - ref.grad).norm() / ref.grad.norm()))
    assert all(e < 2 ** -8 for pair in errors.values() for e in pair), errors  # bf16 keeps 8 significant bits

    model = convert_model(build_model("llama-tiny", device="cuda", seed=0), backend="te", fuse=True)
    blk = model.blocks[0]
    fused = blk.mlp
    model.split_mlps()
    assert isinstance(blk.mlp, SplitMLP) and blk.mlp._swiglu == TESwiGLU.apply
    x = torch.randn(2, 64, model.spec.hidden, device="cuda", dtype=next(fused.parameters()).dtype)
    with torch.no_grad():
        want, got = fused(x).float(), blk.mlp(x).float()
    assert float((got - want).norm() / want.norm()) < 1e-3
