"""``--param-dtype bf16``: bf16 parameters with fp32 master weights (one process, kill -9 resume, DDP),
FSDP2 with a bf16 MixedPrecisionPolicy against one process, emulated FP8, the overflow guard, bad values."""
from __future__ import annotations

import json
import signal

import pytest
import torch
from test_train_processes import _start_and_wait, common, records, run, torchrun, trainer  # noqa: F401

from fp8lab.train import entry as ftrain
from fp8lab.train.master_weights import MasterWeights
from fp8lab.model.models import build_model
from fp8lab.train.optim import make_optimizer
from fp8lab.train.entry import TrainConfig, main, train

TINY = dict(model="llama-tiny", seq_len=32, micro_batch_size=2, plot=False, progress="off", print_metrics=False)


def test_bf16_params_track_fp32_params_and_export_the_fp32_masters(prepared, tmp_path):
    """20 steps, both under bf16 autocast: the fp32-parameter run feeds its GEMMs the bf16 rounding of
    the very weights the bf16 run holds (masters stepped identically), so the runs differ only where
    else bf16 rounding falls (embedding and norm outputs, bf16 gradients before the fp32 copy): each
    ~2^-9 relative. Measured: loss <= 8e-4 relative over 20 steps; the bound is 3e-3, still far below
    the ~0.75 the loss falls by. Gradient norms of this tiny model spike at lr 3e-3 and those spikes
    are chaotic (one run's step 18 was 4x the other's), so only the first 3 steps' norms, before the
    runs have drifted, are compared (measured <= 1e-4, bound 1e-3; with transformers 5.24 the drift starts at
    step 4: 1.2e-3 there, 6e-3 at step 5)."""
    base = dict(**TINY, compute_dtype="bf16", steps=20, lr=3e-3, warmup_steps=2, data=str(prepared), checkpoint_every=-1)
    a, b = tmp_path / "fp32", tmp_path / "bf16"
    train(TrainConfig(**base, output_dir=str(a)))
    s = train(TrainConfig(**base, param_dtype="bf16", output_dir=str(b)))
    ra, rb = records(a), records(b)
    assert s["status"] == "completed" and [r["step"] for r in rb] == list(range(1, 21))
    assert rb[-1]["loss"] < rb[0]["loss"] - 0.5
    for x, y in zip(ra, rb):
        assert y["loss"] == pytest.approx(x["loss"], rel=3e-3)
    for x, y in zip(ra[:3], rb[:3]):
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-3)
    assert all(0 < r["grad_norm"] < 100 for r in rb)  # logged every step, finite
    assert json.loads((b / "config.json").read_text())["param_dtype"] == "bf16"
    # the HF export holds the fp32 masters, not bf16 parameters upcast: most values are not bf16-representable
    from safetensors.torch import load_file

    w = load_file(b / "model" / "model.safetensors")
    assert len(w) == 21 and all(t.dtype == torch.float32 for t in w.values())
    q = w["model.layers.0.self_attn.q_proj.weight"]
    assert (q.to(torch.bfloat16).float() != q).float().mean() > 0.9


def _tiny_with_masters(lr=1e-2, offload=None):
    model = build_model("llama-tiny", seed=0)
    fp32 = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = TrainConfig(lr=lr, weight_decay=0.1)
    mw = MasterWeights(model, lambda ps: make_optimizer(ps, cfg, torch.device("cpu")), offload=offload)
    return model, fp32, mw


def _backward(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 512, (2, 16), generator=g)
    model(x, labels=x).loss.backward()


def test_masters_are_fp32_params_bf16_and_a_step_copies_back():
    model, fp32, mw = _tiny_with_masters()
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    for n, p in model.named_parameters():
        m = mw.master_for(n)
        assert m.dtype == torch.float32 and torch.equal(m, fp32[n])  # the masters are the fp32 init, not bf16 upcast
        assert torch.equal(p.float(), fp32[n].to(torch.bfloat16).float())
    _backward(model)
    assert all(p.grad.dtype == torch.bfloat16 for p in model.parameters())
    expected = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad.float()) for p in model.parameters()]))
    bf16_grads = [p.grad.clone() for p in mw.params]
    assert all(m.grad is None for m in mw.masters)  # no fp32 gradient memory during forward/backward
    norm = mw.clip_grad_norm_(1e9)
    assert norm.dtype == torch.float32 and torch.allclose(norm, expected, rtol=1e-6)
    assert all(torch.equal(m.grad, g.float()) for m, g in zip(mw.masters, bf16_grads))  # exact upcasts
    assert all(p.grad is None for p in mw.params)  # each bf16 gradient freed once copied
    mw.step()
    mw.zero_grad()
    assert all(m.grad is None for m in mw.masters)
    moved = 0
    for n, p in model.named_parameters():
        m = mw.master_for(n)
        assert torch.equal(p, m.to(torch.bfloat16)) and p.grad is None
        moved += int(not torch.equal(m, fp32[n]))
    assert moved == len(fp32)
    st = mw.state_dict()
    assert set(st["state"]) == set(fp32) and st["param_groups"][0]["params"][0] in fp32
    assert all(v["exp_avg"].dtype == torch.float32 and float(v["step"]) == 1 for v in st["state"].values())


def test_a_non_finite_step_leaves_masters_states_and_params_untouched():
    model, _, mw = _tiny_with_masters()
    _backward(model, seed=1)
    mw.clip_grad_norm_(1.0)
    mw.step()
    mw.zero_grad()
    snap = lambda: ([m.detach().clone() for m in mw.masters], [p.detach().clone() for p in model.parameters()],  # noqa: E731
                    {k: {kk: vv.clone() for kk, vv in v.items()} for k, v in mw.state_dict()["state"].items()})
    before = snap()
    _backward(model, seed=2)
    next(model.parameters()).grad[0, 0] = float("nan")  # what an FP8 overflow leaves in a gradient
    norm = mw.clip_grad_norm_(1.0)
    assert not torch.isfinite(norm)
    mw.zero_grad()  # the trainer skips step() and drops the gradients
    after = snap()
    assert all(torch.equal(x, y) for x, y in zip(before[0], after[0]))
    assert all(torch.equal(x, y) for x, y in zip(before[1], after[1]))
    assert before[2].keys() == after[2].keys()
    assert all(torch.equal(before[2][k][kk], after[2][k][kk]) for k in before[2] for kk in before[2][k])


def test_trainer_skips_a_nan_step_under_bf16_params(prepared, tmp_path):
    out = tmp_path / "nan"
    s = train(TrainConfig(**TINY, param_dtype="bf16", steps=5, inject_nan_at_steps=(3,), data=str(prepared),
                          output_dir=str(out), save_model=False, checkpoint_every=-1))
    recs = records(out)
    assert s["status"] == "completed" and s["nonfinite_steps"] == 1
    assert recs[2]["skipped"] is True and recs[2]["loss"] is None
    assert all(r["loss"] is not None and r["grad_norm"] is not None for i, r in enumerate(recs) if i != 2)


def test_kill_9_then_restart_continues_bit_identically_with_bf16_params(prepared, tmp_path):
    """The checkpoint holds the fp32 masters and fp32 AdamW states: a restart resumes exactly."""
    args = lambda out: common(prepared, out, 60, "--checkpoint-every", "4", "--param-dtype", "bf16")  # noqa: E731
    ref = tmp_path / "ref"
    run(trainer(args(ref)))
    out = tmp_path / "killed"
    proc = _start_and_wait(trainer(args(out)), out, min_steps=10)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close(), proc.stderr.close()
    at_kill = len(records(out))
    assert proc.returncode == -signal.SIGKILL and at_kill < 60
    restarted = run(trainer(args(out)))
    resumed = int(restarted.stdout.split("resumed from checkpoint at step ")[1].split()[0])
    assert 4 <= resumed <= at_kill and resumed % 4 == 0
    recs = records(out)
    assert [r["step"] for r in recs] == list(range(1, 61))
    assert [r["loss"] for r in recs] == [r["loss"] for r in records(ref)]
    assert [r["grad_norm"] for r in recs] == [r["grad_norm"] for r in records(ref)]


def test_ddp_and_fsdp2_with_bf16_params_match_one_process_bf16(prepared, tmp_path):
    """Global batch 4: one process x 4 (bf16 params + fp32 masters) against 2 DDP ranks x 2 (bf16 params,
    bf16 gradient all-reduce, fp32 masters) and 2 FSDP2 ranks x 1 x 2 accumulation (fp32 shards, bf16
    gathers, fp32 reduce-scatter). All run the GEMMs on the same bf16 weights; they differ by how the
    batch is split (bf16 gradients summed in another order). Measured: loss <= 3e-5, grad norm
    <= 5.5e-4 relative; bounds 2e-4 and 2e-3. One process then resumes the FSDP2 checkpoint (the same
    fp32 layout) and continues like the 7-step run."""
    one_cfg = dict(model="llama-tiny", seq_len=32, compute_dtype="fp32", micro_batch_size=4, lr=1e-3, min_lr=1e-3,
                   warmup_steps=0, data=str(prepared), progress="off", plot=False, print_metrics=False,
                   save_model=False, param_dtype="bf16")
    one, ddp, fsdp = tmp_path / "one", tmp_path / "ddp", tmp_path / "fsdp"
    train(TrainConfig(**one_cfg, steps=7, output_dir=str(one)))
    flags = ["--lr", "0.001", "--min-lr", "0.001", "--warmup-steps", "0", "--param-dtype", "bf16", "--save-model", "True"]
    run(torchrun(common(prepared, ddp, 5, *flags, "--micro-batch-size", "2", "--checkpoint-every", "-1")))
    run(torchrun(common(prepared, fsdp, 5, *flags, "--micro-batch-size", "1", "--grad-accum", "2", "--parallel", "fsdp",
                        "--checkpoint-every", "5")))
    ref = records(one)
    from safetensors.torch import load_file

    for out in (ddp, fsdp):
        recs = records(out)
        assert [r["step"] for r in recs] == [1, 2, 3, 4, 5] and all(r["world_size"] == 2 for r in recs)
        for a, b in zip(ref[:5], recs):
            assert b["loss"] == pytest.approx(a["loss"], rel=2e-4)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=2e-3)
        w = load_file(out / "model" / "model.safetensors")  # DDP: the masters; FSDP2: its fp32 shards, gathered
        assert len(w) == 21 and all(t.dtype == torch.float32 for t in w.values())
    s = train(TrainConfig(**one_cfg, steps=7, output_dir=str(fsdp), resume_with_new_settings=True))  # 5 -> 7 steps, asked for
    assert s["resumed_from_step"] == 5
    for a, b in zip(ref[5:], records(fsdp)[5:]):
        assert b["loss"] == pytest.approx(a["loss"], rel=2e-4)


def test_bad_param_dtype_is_rejected_with_one_clear_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["--param-dtype", "fp16", "--progress", "off"]) == ftrain.EXIT_BAD_OPTIONS
    err = capsys.readouterr().err.strip()
    assert err == "fp8lab train: error: --param-dtype='fp16' is invalid; allowed: auto | fp32 | bf16"
    assert not (tmp_path / "runs").exists()
    from fp8lab.train import distributed as fdist

    env = fdist.DistEnv(0, 0, 1, torch.device("cpu"), False)
    with pytest.raises(ValueError, match=r"--param-dtype='half' is invalid; allowed: fp32 \| bf16"):
        fdist.wrap(torch.nn.Linear(2, 2), env, "ddp", param_dtype="half")


def test_emulated_fp8_with_bf16_params_resumes_exactly_and_exports(prepared, tmp_path):
    """The FP8 path with bf16 parameters: fused emulated layers, delayed scaling state and masters in the checkpoint."""
    import shutil

    base = dict(**TINY, precision="fp8", backend="emulated", recipe="delayed", param_dtype="bf16", steps=6,
                checkpoint_every=3, data=str(prepared))
    a, b = tmp_path / "a", tmp_path / "b"
    train(TrainConfig(**base, output_dir=str(a)))
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step_00000006")
    s = train(TrainConfig(**base, output_dir=str(b)))
    assert s["resumed_from_step"] == 3 and [r["loss"] for r in records(b)] == [r["loss"] for r in records(a)]
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(b / "model")  # fused QKV / gate-up split back, fp32 masters
    assert hf.model.layers[0].self_attn.k_proj.weight.dtype == torch.float32


@pytest.mark.parametrize("offload", [None, torch.device("cpu")], ids=["plain", "offload"])
def test_a_parameter_without_gradient_is_not_stepped(offload):
    model, fp32, mw = _tiny_with_masters(offload=offload)
    _backward(model)
    head = dict(model.named_parameters())["lm_head.weight"]
    head.grad = None  # as if the forward had not used it
    mw.clip_grad_norm_(1.0)
    mw.step()
    mw.zero_grad()
    assert torch.equal(mw.master_for("lm_head.weight"), fp32["lm_head.weight"])
    assert not mw.optimizer.state.get(mw.master_for("lm_head.weight"))  # no AdamW state made for it either
    assert not torch.equal(mw.master_for("model.norm.weight"), fp32["model.norm.weight"])
    assert all(m.grad is None for m in mw.masters)  # fp32 gradients freed until the next step's copy
    _backward(model, seed=3)
    mw.clip_grad_norm_(1.0)
    mw.step()
    assert not torch.equal(mw.master_for("lm_head.weight"), fp32["lm_head.weight"])


class _MainGradMatmul(torch.autograd.Function):
    """y = x @ w.T whose weight gradient is added into w.main_grad (TE's fuse_wgrad_accumulation contract)."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        w.main_grad.add_((gy.t() @ x).to(w.main_grad.dtype))
        return gy @ w, None  # no .grad for w: it went into main_grad


def test_main_grad_accumulation_gives_the_same_step_as_autograd():
    """Two micro-batches: gradients added by the layer into p.main_grad reach the fp32 masters as
    autograd's .grad does (same clipping norm, same updated weights), and main_grad is zeroed after."""
    torch.manual_seed(0)
    w0 = torch.randn(8, 16)
    xs = [torch.randn(4, 16) for _ in range(2)]
    mods = []
    for fused in (False, True):
        m = torch.nn.Linear(16, 8, bias=False)
        with torch.no_grad():
            m.weight.copy_(w0)
        mw = MasterWeights(m, lambda ps: torch.optim.AdamW(ps, lr=1e-2))
        if fused:
            mw.use_main_grad([m.weight])
            assert m.weight.main_grad.dtype == torch.bfloat16 and not m.weight.main_grad.any()
        for x in xs:
            y = _MainGradMatmul.apply(x.bfloat16(), m.weight) if fused else x.bfloat16() @ m.weight.t()
            y.float().pow(2).sum().backward()
        assert (m.weight.grad is None) == fused
        norm = mw.clip_grad_norm_(1e9)
        assert fused is False or m.weight.main_grad is None  # freed once copied to fp32
        mw.step()
        mw.zero_grad()
        mods.append((m, mw, norm))
    (a, ma, na), (b, mb, nb) = mods
    assert float(nb) == pytest.approx(float(na), rel=1e-2)  # bf16 sums of two micro-batches, rounded differently
    assert torch.allclose(mb.masters[0], ma.masters[0], atol=1e-4) and not torch.equal(mb.masters[0], torch.as_tensor(w0))
    assert b.weight.main_grad is not None and not b.weight.main_grad.any()  # zeroed for the next step
    with pytest.raises(ValueError, match="not among this optimizer's parameters"):
        mb.use_main_grad([torch.nn.Parameter(torch.zeros(2))])


def test_zero_grad_drops_an_unconsumed_main_grad():
    m = torch.nn.Linear(4, 2, bias=False)
    mw = MasterWeights(m, lambda ps: torch.optim.AdamW(ps, lr=1e-2))
    mw.use_main_grad([m.weight])
    m.weight.main_grad.add_(1.0)  # a layer wrote into it, but no step consumed it
    mw.zero_grad()
    assert m.weight.main_grad is not None and not m.weight.main_grad.any()


def _tiny_pair_plain_and_streamed(monkeypatch, chunk_bytes):
    """Two identical tiny models with master weights: the plain step, and the streamed step in chunks of ``chunk_bytes``."""
    from fp8lab.train import master_weights

    monkeypatch.setattr(master_weights, "STREAM_CHUNK_BYTES", chunk_bytes)
    cfg = TrainConfig(lr=1e-2, weight_decay=0.1)
    pair = []
    for streamed in (False, True):
        model = build_model("llama-tiny", seed=0)
        pair.append((model, MasterWeights(model, lambda ps: make_optimizer(ps, cfg, torch.device("cpu")), streamed=streamed)))
    return pair


def _assert_same_step(ma, a, mb, b) -> None:
    """Models ``ma``, ``mb`` stepped by master weights ``a``, ``b``: the same masters, parameters and AdamW states, bit
    for bit, and no gradient left in ``b``."""
    assert all(torch.equal(x, y) for x, y in zip(a.masters, b.masters))
    assert all(torch.equal(x, y) for x, y in zip(ma.parameters(), mb.parameters()))
    sa, sb = a.state_dict()["state"], b.state_dict()["state"]
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k][s], sb[k][s]) for k in sa for s in ("exp_avg", "exp_avg_sq", "step"))
    assert all(m.grad is None for m in b.masters) and all(p.grad is None for p in b.params)


def test_streamed_step_equals_the_plain_step_exactly(monkeypatch):
    """What the trainer uses under CUDA graphs: chunks of ~64 KiB of fp32 gradients (several chunks
    even for the tiny model), clipping active (norm above max_norm): the same norms, masters,
    parameters and AdamW states as the plain step, bit for bit, over three steps."""
    (ma, a), (mb, b) = _tiny_pair_plain_and_streamed(monkeypatch, 1 << 16)
    assert len(b._chunks) > 3 and sorted(i for c in b._chunks for i in c) == list(range(len(b.params)))
    for seed in range(3):
        norms = []
        for model, mw in ((ma, a), (mb, b)):
            _backward(model, seed=seed)
            norms.append(mw.clip_grad_norm_(0.05))
            if mw.streamed:  # nothing converted yet: the bf16 gradients are where backward left them
                assert all(m.grad is None for m in mw.masters) and all(p.grad is not None for p in mw.params)
            mw.step()
            mw.zero_grad()
        assert float(norms[0]) > 0.05 and torch.equal(norms[0], norms[1])
    _assert_same_step(ma, a, mb, b)


def test_streamed_step_keeps_main_grad_buffers_in_place(monkeypatch):
    """Under CUDA graphs the backward writes into main_grad at fixed addresses: the streamed step reads
    them, zeroes them in place after the step (same storage), and its update equals the plain step's."""
    from fp8lab.train import master_weights

    monkeypatch.setattr(master_weights, "STREAM_CHUNK_BYTES", 1 << 8)
    torch.manual_seed(0)
    w0 = torch.randn(8, 16)
    results = []
    for streamed in (False, True):
        m = torch.nn.Linear(16, 8, bias=False)
        with torch.no_grad():
            m.weight.copy_(w0)
        mw = MasterWeights(m, lambda ps: torch.optim.AdamW(ps, lr=1e-2), streamed=streamed)
        mw.use_main_grad([m.weight])
        buffer = m.weight.main_grad
        for step in range(2):
            for x in (torch.randn(4, 16, generator=torch.Generator().manual_seed(10 * step + k)) for k in range(2)):
                _MainGradMatmul.apply(x.bfloat16(), m.weight).float().pow(2).sum().backward()
            assert m.weight.grad is None and m.weight.main_grad.any()
            norm = mw.clip_grad_norm_(1.0)
            mw.step()
            mw.zero_grad()
            if streamed:
                assert m.weight.main_grad is buffer and not buffer.any()  # zeroed in place, never re-allocated
        results.append((norm, mw.masters[0].detach().clone()))
    (na, wa), (nb, wb) = results
    assert torch.equal(na, nb) and torch.equal(wa, wb) and not torch.equal(wb, w0)


def test_streamed_step_without_a_norm_first_is_an_error():
    model = build_model("llama-tiny", seed=0)
    mw = MasterWeights(model, lambda ps: torch.optim.AdamW(ps, lr=1e-2), streamed=True)
    _backward(model)
    with pytest.raises(RuntimeError, match="needs clip_grad_norm_"):
        mw.step()


def test_the_offloaded_step_equals_the_plain_step_exactly_and_resumes_from_a_checkpoint(monkeypatch, tmp_path):
    """--memory offload: masters and AdamW states between steps in host memory, each chunk copied to the step's device
    and back (here a CPU, so the copies are real but the devices one). Clipping active, several chunks: the same
    norms, masters, parameters and AdamW states as the plain step, bit for bit; a checkpoint restores them and the
    next step."""
    from fp8lab.train import checkpoint as fckpt, master_weights
    from fp8lab.train.distributed import DistEnv

    monkeypatch.setattr(master_weights, "OFFLOAD_CHUNK_BYTES", 1 << 16)
    cfg = TrainConfig(lr=1e-2, weight_decay=0.1)

    def pair(offload):
        model = build_model("llama-tiny", seed=0)
        return model, MasterWeights(model, lambda ps: make_optimizer(ps, cfg, torch.device("cpu")), offload=offload)

    (ma, a), (mb, b) = pair(None), pair(torch.device("cpu"))
    assert b.streamed and len(b._chunks) > 3 and sorted(i for c in b._chunks for i in c) == list(range(len(b.params)))

    def step(model, mw, seed):
        _backward(model, seed=seed)
        norm = mw.clip_grad_norm_(0.05)
        mw.step()
        mw.zero_grad()
        return norm

    for seed in range(3):
        na, nb = step(ma, a, seed), step(mb, b, seed)
        assert float(na) > 0.05 and torch.equal(na, nb)
    _assert_same_step(ma, a, mb, b)

    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), initialized_here=False)
    path = fckpt.save(tmp_path, 3, mb, b, {"step": 3}, env, keep=1)
    mc = build_model("llama-tiny", seed=1)
    c = MasterWeights(mc, lambda ps: make_optimizer(ps, cfg, torch.device("cpu")), offload=torch.device("cpu"))
    fckpt.load(path, mc, c, env)
    _assert_same_step(mb, b, mc, c)
    assert torch.equal(step(ma, a, 7), step(mc, c, 7))
    assert all(torch.equal(x, y) for x, y in zip(ma.parameters(), mc.parameters()))


def test_a_fresh_offloaded_optimizer_has_zero_states_for_a_checkpoint_to_fill():
    model = build_model("llama-tiny", seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    mw = MasterWeights(model, lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True), offload=torch.device("cpu"))
    state = mw.state_dict()["state"]
    assert len(state) == len(mw.masters)
    assert all(not st["exp_avg"].any() and not st["exp_avg_sq"].any() and float(st["step"]) == 0
               for st in state.values())
    assert all(torch.equal(p, q.to(p.dtype)) for p, q in zip(model.parameters(), before))
    assert all(m.device.type == "cpu" and m.grad is None for m in mw.masters)


def test_offloaded_masters_are_views_of_one_host_buffer_and_an_export_gets_copies():
    """A checkpoint reads and writes the host masters in place; an export (safetensors) would take views of one
    buffer for tied weights, so it gets a copy of each."""
    from fp8lab.train.export import _export_hf_state_dict

    model = build_model("llama-tiny", seed=0)
    mw = MasterWeights(model, lambda ps: torch.optim.AdamW(ps, lr=1e-2), offload=torch.device("cpu"))
    ptrs = {m.untyped_storage().data_ptr() for m in mw.masters}
    assert len(ptrs) == 1 and sum(m.numel() for m in mw.masters) == mw._host.offsets[-1]
    assert all(b.data_ptr() % 4096 == 0 and b.untyped_storage().data_ptr() == b.data_ptr()
               for b in mw._host.buffers.values())  # cudaHostRegister locks whole pages; is_pinned reads the storage
    sd = {n: p.detach() for n, p in model.named_parameters()}
    live = mw.model_state_dict(sd)
    first = {names[0]: m for names, m in zip(mw.names, mw.masters)}
    assert all(live[n].data_ptr() == first[n].data_ptr() for n in first)
    exported = _export_hf_state_dict(model, model, None, mw)
    assert len({v.untyped_storage().data_ptr() for v in exported.values()}) == len(exported)
    assert all(torch.equal(exported[n], first[n]) for n in first)


@pytest.mark.parametrize("offload", [None, torch.device("cpu")], ids=["plain", "offload"])
def test_a_checkpoint_of_a_run_with_an_unstepped_parameter_leaves_the_others_states_alone(offload):
    """state_dict() (what a checkpoint save calls) makes the missing states with an lr-0 step of zero gradients: of the
    masters without a state alone. Stepping every master there would multiply each moment by its beta and reset every
    step count."""
    model, _, mw = _tiny_with_masters(offload=offload)
    _backward(model)
    dict(model.named_parameters())["lm_head.weight"].grad = None  # as if the forward had not used it
    mw.clip_grad_norm_(1.0)
    mw.step()
    mw.zero_grad()
    head = mw.master_for("lm_head.weight")
    before = {id(m): {k: v.clone() for k, v in mw.optimizer.state[m].items()} for m in mw.masters if m is not head}
    state = mw.state_dict()["state"]
    assert float(state["lm_head.weight"]["step"]) == 0 and not state["lm_head.weight"]["exp_avg"].any()
    after = {id(m): mw.optimizer.state[m] for m in mw.masters if m is not head}
    assert all(torch.equal(before[k][s], after[k][s]) for k in before for s in ("step", "exp_avg", "exp_avg_sq"))
    assert all(float(after[k]["step"]) == 1 for k in after)
