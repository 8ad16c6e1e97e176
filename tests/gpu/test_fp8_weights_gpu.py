"""``--fp8-weights primary`` on CUDA with Transformer Engine (skipped without a GPU): the decoder blocks' weights kept
only in FP8 under ``--memory offload`` train as the cast weights do, hold a byte per weight, keep no transposes
between backwards, resume from a checkpoint and export the masters (fp8lab.plan.fp8_weights,
fp8lab.train.fp8_weights)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from gpu_skips import te_or_skip

from fp8lab.records import metrics as fmetrics
from fp8lab.train.entry import TrainConfig, train

pytestmark = pytest.mark.gpu
TINY = dict(model="llama-tiny", seq_len=128, micro_batch_size=8, lr=2e-3, progress="off", print_metrics=False,
            plot=False, device="cuda", precision="fp8", backend="te", memory="offload", cuda_graphs="off",
            grad_accum=2)


def _losses(run) -> list[float]:
    return [r["loss"] for r in fmetrics.read_metrics(run / "metrics.jsonl")]


def test_primary_fp8_weights_train_as_the_cast_weights_under_current_scaling(prepared, tmp_path, capture_trained,
                                                                          gpu_record):
    """Current scaling quantizes a weight from its own amax either way, and the FP8 weights are written from the
    masters' bf16 rounding: the same losses as the cast weights, bit for bit, and the same exported masters. The run
    says why, records the choice, and its blocks hold only FP8 weights."""
    te_or_skip()
    from safetensors.torch import load_file
    from transformer_engine.pytorch.tensor import Float8Tensor

    from fp8lab.fp8.fused import decoder_layers
    from fp8lab.train.fp8_weights import block_weights

    base = dict(**TINY, recipe="current", steps=8, data=str(prepared), save_model=True)
    runs = {w: tmp_path / w for w in ("cast", "primary")}
    models = {}
    for weights, out in runs.items():
        s = train(TrainConfig(**base, fp8_weights=weights, output_dir=str(out)))
        assert s["status"] == "completed" and s["nonfinite_steps"] == 0
        models[weights] = capture_trained["inner"]
    cfg = json.loads((runs["primary"] / "config.json").read_text())
    assert cfg["plan"]["fp8_weights"] == "primary" and cfg["built"]["fp8_weight_cache"] is False
    assert "--fp8-weights primary" in cfg["plan"]["reasons"]["fp8_weights"]
    losses = {w: _losses(out) for w, out in runs.items()}
    assert losses["primary"] == losses["cast"] and losses["primary"][-1] < losses["primary"][0]
    blocks = [b for _, b in decoder_layers(models["primary"])]
    weights = [getattr(m, n) for m, n in block_weights(blocks)]
    assert weights and all(isinstance(w, Float8Tensor) for w in weights)
    assert all(w._transpose is None or w._transpose_invalid for w in weights)  # dropped after the last backward
    assert not any(isinstance(getattr(m, n), Float8Tensor) for m, n in
                   block_weights([b for _, b in decoder_layers(models["cast"])]))
    exported = {w: load_file(str(next((out / "model").glob("*.safetensors")))) for w, out in runs.items()}
    assert exported["primary"].keys() == exported["cast"].keys()
    assert all(torch.equal(exported["primary"][k], exported["cast"][k]) for k in exported["cast"])
    gpu_record(test="primary-vs-cast", losses=losses)


def test_primary_fp8_weights_hold_one_byte_per_block_weight_and_no_transposes_between_backwards():
    """Made from a converted TE model's masters: each block weight's storage is one byte per element (the bf16 copy
    is freed), the backward's transposes are gone after drop_transposes, and a step writes the masters' new values."""
    te_or_skip()
    from fp8lab.fp8.backends import detect_machine
    from fp8lab.fp8.convert import autocast, convert_model
    from fp8lab.fp8.fused import decoder_layers
    from fp8lab.model.models import build_model
    from fp8lab.plan.config import TrainConfig as Config
    from fp8lab.plan.runplan import plan_run
    from fp8lab.train import fp8_weights as fp8w, optim as foptim

    c = Config(model="llama-tiny", precision="fp8", backend="te", memory="offload", fp8_weights="primary",
               recipe="current", device="cuda", seq_len=128, micro_batch_size=4, grad_accum=2, cuda_graphs="off")
    plan = plan_run(c, detect_machine("cuda"))
    assert plan.fp8_primary_weights and not plan.weight_cache
    model = convert_model(build_model("llama-tiny", device="cuda", dtype=torch.bfloat16), backend="te",
                          recipe="current", fuse=True)
    n = sum(getattr(m, k).numel() for m, k in fp8w.block_weights([b for _, b in decoder_layers(model)]))
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    master, _, made = foptim.master_weights(model, plan, c, torch.device("cuda"))
    torch.cuda.synchronize()
    assert sum(p.numel() for p in made) == n
    assert all(p._data.element_size() == 1 and (p._transpose is None or p._transpose_invalid) for p in made)
    # the masters went to host memory and each bf16 block weight (2 bytes) was freed for its FP8 one (1 byte); what
    # grew is the fused accumulation's bf16 gradient buffers (made here) and each FP8 weight's scale (one allocation)
    mains = sum(2 * p.main_grad.numel() for p in made if getattr(p, "main_grad", None) is not None)
    grown = torch.cuda.memory_allocated() - before
    assert grown <= mains - n + 4096 * len(made), (grown, mains, n)
    x = torch.randint(0, model.config.vocab_size, (4, 128), device="cuda")
    with autocast("te", recipe="current"):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    assert any(p._transpose is not None and not p._transpose_invalid for p in made)  # made by the backward
    fp8w.drop_transposes(made)
    assert all(p._transpose is None or p._transpose_invalid for p in made)
    old = [p.dequantize().clone() for p in made]
    master.clip_grad_norm_(1.0)
    master.step()
    master.zero_grad()
    assert all(not torch.equal(p.dequantize(), o) for p, o in zip(made, old))
    i = next(k for k, p in enumerate(master.params) if p is made[0])
    want = master.masters[i].detach().to("cuda", torch.bfloat16)
    assert torch.allclose(made[0].dequantize().float(), want.float(), rtol=0.07, atol=1e-3)  # E4M3: 3 mantissa bits


def test_a_primary_fp8_run_with_delayed_scaling_trains_and_resumes_exactly(prepared, tmp_path):
    """Delayed scaling for activations and gradients beside the weights' own scales: it trains, and a resume from its
    step-5 checkpoint repeats steps 6-10."""
    te_or_skip()
    base = dict(**TINY, recipe="delayed", steps=10, checkpoint_every=5, data=str(prepared), save_model=False,
                fp8_weights="primary")
    a = tmp_path / "a"
    s = train(TrainConfig(**base, output_dir=str(a)))
    assert s["status"] == "completed" and s["nonfinite_steps"] == 0
    la = _losses(a)
    assert la[-1] < la[0]
    b = tmp_path / "b"
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step_00000010")
    train(TrainConfig(**base, output_dir=str(b)))
    lb = _losses(b)
    assert lb[:5] == la[:5] and lb[5:] == pytest.approx(la[5:], rel=1e-3)
