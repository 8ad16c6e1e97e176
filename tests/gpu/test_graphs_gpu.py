"""CUDA graphs of the decoder blocks on an FP8 GPU (skipped without one; issue 19).

Graphed and eager runs of the real trainer give the same losses to bf16 noise, BF16 and FP8, with
and without TE's FP8 weight cache under gradient accumulation; FP8 scaling state keeps updating
inside the graphs; a graphed run checkpoints and resumes like an eager one."""
from __future__ import annotations

import json
import shutil

import pytest
from gpu_skips import te_or_skip as _te_or_skip

from fp8lab.records import metrics as fmetrics
from fp8lab.train.entry import TrainConfig, train

pytestmark = pytest.mark.gpu
TINY = dict(model="llama-tiny", seq_len=128, micro_batch_size=4, lr=2e-3, progress="off", print_metrics=False,
            plot=False, device="cuda", backend="te", param_dtype="bf16", save_model=False, checkpoint_every=-1)




def _losses(out):
    return [r["loss"] for r in fmetrics.read_metrics(out / "metrics.jsonl")]


# The H200 gave bit-identical losses graphed and eager in every case (max relative difference 0.0,
# benchmarks/logs/h200_graphs_tests.log); 1e-5 leaves room for another cuBLAS choosing other kernels.
@pytest.mark.parametrize("precision,recipe,grad_accum,rel", [
    ("bf16", "auto", 1, 1e-5), ("fp8", "delayed", 1, 1e-5), ("fp8", "current", 2, 1e-5), ("fp8", "delayed", 2, 1e-5),
    ("gptneo-fp8", "delayed", 2, 1e-5), ("fp8-nocache", "current", 2, 1e-5)],
    ids=["bf16", "fp8-delayed", "fp8-current-accum2-cache", "fp8-delayed-accum2-cache", "gptneo-fp8-accum2",
         "fp8-current-accum2-no-cache"])
def test_graphed_and_eager_runs_train_alike(prepared, tmp_path, precision, recipe, grad_accum, rel, gpu_record):
    _te_or_skip()
    model = "gptneo-tiny" if precision.startswith("gptneo") else "llama-tiny"
    cache = not precision.endswith("nocache")
    precision = "fp8" if "fp8" in precision else "bf16"
    base = dict(TINY, model=model, precision=precision, recipe=recipe, steps=12, grad_accum=grad_accum,
                fp8_weight_cache=cache, data=str(prepared))
    runs = {}
    for mode in ("on", "off"):
        out = tmp_path / mode
        s = train(TrainConfig(**base, cuda_graphs=mode, output_dir=str(out)))
        assert s["status"] == "completed" and s["nonfinite_steps"] == 0
        runs[mode] = (_losses(out), json.loads((out / "config.json").read_text()))
    (lon, con), (loff, coff) = runs["on"], runs["off"]
    assert con["plan"]["cuda_graphs"] is True and coff["plan"]["cuda_graphs"] is False
    # both accumulate weight gradients inside TE's GEMMs: the graphed run into main_grad kept in place
    assert con["built"]["fuse_wgrad_accumulation"] is True and coff["built"]["fuse_wgrad_accumulation"] is True
    cap = con["built"]["cuda_graphs_captured"]
    # allocated after capture minus before: the capture also frees a little (the warm-up's gradients)
    assert cap["blocks"] == 2 and -0.01 < cap["memory_gib"] < 0.1
    assert cap["weight_cache"] is (precision == "fp8" and grad_accum > 1 and cache)
    gpu_record(model=model, precision=precision, recipe=recipe, grad_accum=grad_accum,
               max_rel_loss_diff=max(abs(a - b) / abs(b) for a, b in zip(lon, loff)), graphs_memory_gib=cap["memory_gib"])
    assert lon == pytest.approx(loff, rel=rel, abs=0), (lon, loff)
    assert lon[-1] < lon[0] - 0.3


def test_fp8_scaling_state_updates_inside_the_graphs(prepared, tmp_path, capture_trained):
    """Delayed scaling: the amax history and scales of every graphed TE module move during training."""
    _te_or_skip()
    import torch

    s = train(TrainConfig(**{**TINY, "save_model": True}, precision="fp8", recipe="delayed", steps=8, cuda_graphs="on",
                          data=str(prepared), output_dir=str(tmp_path / "run")))
    assert s["status"] == "completed"
    model = capture_trained["inner"]
    assert model.graphed
    metas = [m.fp8_meta["scaling_fwd"] for blk in model.blocks for m in (blk.qkv, blk.proj, blk.mlp)]
    for meta in metas:
        hist = meta.amax_history
        assert torch.isfinite(hist).all() and (hist > 0).any(), "amax history never written inside the graph"
        assert not torch.all(meta.scale == 1.0), "FP8 scales never updated from the amax history"


def test_graphed_run_checkpoints_and_resumes(prepared, tmp_path):
    _te_or_skip()
    base = dict(TINY, precision="fp8", recipe="delayed", steps=10, checkpoint_every=5, cuda_graphs="on",
                data=str(prepared))
    a, b = tmp_path / "a", tmp_path / "b"
    train(TrainConfig(**base, output_dir=str(a)))
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step_00000010")
    s = train(TrainConfig(**base, output_dir=str(b)))
    assert s["resumed_from_step"] == 5 and s["status"] == "completed"
    la, lb = _losses(a), _losses(b)
    assert lb[:5] == la[:5] and lb[5:] == pytest.approx(la[5:], rel=1e-3)


def test_auto_turns_graphs_on_for_a_launch_bound_step(prepared, tmp_path):
    """llama-tiny at 4 x 128 tokens is launch-bound: --cuda-graphs auto (the default) captures its blocks."""
    _te_or_skip()
    out = tmp_path / "auto"
    train(TrainConfig(**TINY, precision="fp8", steps=3, data=str(prepared), output_dir=str(out)))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["plan"]["cuda_graphs"] is True and cfg["plan"]["reasons"]["cuda_graphs"].startswith("auto:")
    assert cfg["built"]["fuse_wgrad_accumulation"] is True  # main_grad buffers kept in place by the streamed step


def test_streamed_master_step_equals_the_plain_step_on_the_gpu(monkeypatch):
    """The step graphed runs use (fp8lab.train.master_weights, streamed): on CUDA, where clipping takes torch's
    foreach norm kernels, chunked norms and updates are bit-identical to the plain step's."""
    import torch

    from fp8lab.train import master_weights
    from fp8lab.model.models import build_model
    from fp8lab.train.optim import make_optimizer

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    monkeypatch.setattr(master_weights, "STREAM_CHUNK_BYTES", 1 << 16)
    dev, cfg = torch.device("cuda"), TrainConfig(lr=1e-2, weight_decay=0.1)
    pair = []
    for streamed in (False, True):
        model = build_model("llama-tiny", seed=0).to(dev)
        mw = master_weights.MasterWeights(model, lambda ps: make_optimizer(ps, cfg, dev), streamed=streamed)
        norms = []
        for seed in range(3):
            x = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(seed)).to(dev)
            model(x, labels=x).loss.backward()
            norms.append(mw.clip_grad_norm_(0.05))
            mw.step()
            mw.zero_grad()
        pair.append((norms, mw))
    (na, a), (nb, b) = pair
    assert len(b._chunks) > 3 and float(na[0]) > 0.05
    assert all(torch.equal(x, y) for x, y in zip(na, nb))
    assert all(torch.equal(x, y) for x, y in zip(a.masters, b.masters))


def test_a_capture_leaves_the_rng_streams_as_they_were():
    """A resumed run captures after restoring its RNG states: the capture's random sample inputs must
    not move them (torch.random.fork_rng around the capture)."""
    _te_or_skip()
    import torch

    from fp8lab.plan import graphs
    from fp8lab.fp8.convert import convert_model
    from fp8lab.model.models import build_model

    model = convert_model(build_model("llama-tiny", device="cuda", seed=0), backend="te", fuse=True)
    model.to(torch.bfloat16).train()
    cpu, gpu = torch.get_rng_state(), torch.cuda.get_rng_state()
    cap = graphs.capture(model, micro_batch_size=2, seq_len=64, fp8=False, recipe=None, weight_cache=False)
    assert cap.blocks == 2 and model.graphed
    assert torch.equal(torch.get_rng_state(), cpu) and torch.equal(torch.cuda.get_rng_state(), gpu)
    x = torch.randint(0, 512, (2, 64), device="cuda")
    model(x).logits.float().sum().backward()  # the graphs replay
    assert all(p.grad is not None or getattr(p, "main_grad", None) is not None
               for p in model.blocks[0].parameters() if p.requires_grad)
