"""The memory modes on CUDA with Transformer Engine's FusedAdam (skipped without a GPU): the step against fp8lab's
plain master weights, exact resumes from checkpoints, and the trainer's run record (fp8lab.plan.memory_modes)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from gpu_skips import te_or_skip as _te_or_skip

from fp8lab.plan import memory_modes
from fp8lab.plan.config import TrainConfig as Config
from fp8lab.records import metrics as fmetrics
from fp8lab.train.entry import TrainConfig, train

pytestmark = pytest.mark.gpu
TINY = dict(model="llama-tiny", seq_len=128, micro_batch_size=8, lr=2e-3, progress="off", print_metrics=False,
            plot=False, device="cuda")


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).cuda()


@pytest.mark.parametrize("mode", ["fp32-moments", "bf16-moments", "fp8-exp-avg"])
def test_fused_states_step_follows_the_plain_masters(mode):
    """Five steps from the same bf16 weights: the fused mode moves the weights as the plain fp32-state step does (the
    same direction, the same size within a few percent), not merely by a step's rounding."""
    _te_or_skip()
    from fp8lab.train import optim as foptim
    from fp8lab.train.fused_states import FusedStates
    from fp8lab.train.master_weights import MasterWeights

    c = Config(lr=1e-3, weight_decay=0.1, device="cpu")
    a, b, start = _net(), _net(), _net()
    with torch.no_grad():  # the plain masters start from the bf16 weights too, as FusedAdam's do
        for p in (*a.parameters(), *start.parameters()):
            p.copy_(p.to(torch.bfloat16).float())
    plain = MasterWeights(a, lambda ps: foptim.make_optimizer(ps, c, torch.device("cuda")))
    fused = FusedStates(b, memory_modes.get(mode), c)
    assert all(p.dtype == torch.bfloat16 for p in b.parameters())
    x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        for net, opt in ((a, plain), (b, fused)):
            net(x).float().square().mean().backward()
            assert torch.isfinite(opt.clip_grad_norm_(1.0))
            opt.step()
            opt.zero_grad()
    with torch.no_grad():
        da = torch.cat([(p.float() - p0).flatten() for p, p0 in zip(a.parameters(), start.parameters())])
        db = torch.cat([(p.float() - p0).flatten() for p, p0 in zip(b.parameters(), start.parameters())])
    assert float(da.norm()) > 0.05  # ~5 steps of lr 1e-3 over 33k weights
    assert float(torch.nn.functional.cosine_similarity(da, db, dim=0)) > 0.98
    assert abs(float(db.norm() / da.norm()) - 1) < 0.05


@pytest.mark.parametrize("mode", ["fp32-moments", "bf16-moments", "fp8-exp-avg"])
def test_a_checkpoint_restores_every_fused_state_and_the_next_step(tmp_path, mode):
    """Save after three steps, load into another model and optimizer: every state tensor, every group's step count
    and then the next step's weights are the saved run's, bit for bit."""
    _te_or_skip()
    from fp8lab.train import checkpoint as ckpt
    from fp8lab.train.distributed import DistEnv
    from fp8lab.train.fused_states import FusedStates

    env = DistEnv(rank=0, local_rank=0, world_size=1, device=torch.device("cuda"), initialized_here=False)
    c = Config(lr=1e-3, weight_decay=0.1, device="cpu")
    x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)

    def step(net, opt):
        net(x).float().square().mean().backward()
        opt.clip_grad_norm_(1.0)
        opt.step()
        opt.zero_grad()

    a = _net()
    fa = FusedStates(a, memory_modes.get(mode), c)
    for _ in range(3):
        step(a, fa)
    path = ckpt.save(tmp_path, 3, a, fa, {"step": 3}, env, keep=1)
    b = _net(seed=1)
    fb = FusedStates(b, memory_modes.get(mode), c)
    ckpt.load(path, b, fb, env)
    sa, sb = fa.state_dict(), fb.state_dict()
    assert [g.get("step") for g in sb["param_groups"]] == [g.get("step") for g in sa["param_groups"]]
    assert [{k: v for k, v in g.items() if k != "params"} for g in sb["param_groups"]] == \
        [{k: v for k, v in g.items() if k != "params"} for g in sa["param_groups"]]
    differ = [f"{n}.{k}" for n, st in sa["state"].items() for k, v in st.items()
              if not torch.equal(v, sb["state"][n][k])]
    assert not differ, differ
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    step(a, fa)
    step(b, fb)
    moved = [i for i, (p, q) in enumerate(zip(a.parameters(), b.parameters())) if not torch.equal(p, q)]
    assert not moved, moved


@pytest.mark.parametrize("mode", ["fp32-moments", "bf16-moments", "fp8-exp-avg"])
def test_a_run_in_a_memory_mode_records_it_and_resumes_exactly(prepared, tmp_path, mode):
    _te_or_skip()
    base = dict(**TINY, precision="fp8", backend="te", steps=10, checkpoint_every=5, data=str(prepared),
                save_model=False, memory=mode)
    a, b = tmp_path / "a", tmp_path / "b"
    s = train(TrainConfig(**base, output_dir=str(a)))
    assert s["status"] == "completed" and s["nonfinite_steps"] == 0
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["memory"] == mode and cfg["plan"]["memory"] == mode
    assert cfg["built"]["adamw_impl"] == "te-fused-adam"
    shutil.copytree(a, b)
    shutil.rmtree(b / "checkpoints" / "step_00000010")
    train(TrainConfig(**base, output_dir=str(b)))
    la = [r["loss"] for r in fmetrics.read_metrics(a / "metrics.jsonl")]
    lb = [r["loss"] for r in fmetrics.read_metrics(b / "metrics.jsonl")]
    assert lb[:5] == la[:5] and lb[5:] == pytest.approx(la[5:], rel=1e-3)
    recs = fmetrics.read_metrics(a / "metrics.jsonl")
    assert recs[-1]["loss"] < recs[0]["loss"]


def test_memory_auto_keeps_plain_where_it_fits(prepared, tmp_path):
    _te_or_skip()
    s = train(TrainConfig(**TINY, precision="bf16", backend="te", steps=3, data=str(prepared), save_model=False,
                          output_dir=str(tmp_path / "r")))
    assert s["status"] == "completed"
    cfg = json.loads((tmp_path / "r" / "config.json").read_text())
    assert cfg["memory"] == memory_modes.PLAIN and cfg["built"]["adamw_impl"] == "fused"


def test_the_offloaded_step_on_cuda_equals_the_plain_step_and_keeps_its_states_in_pinned_host_memory(monkeypatch):
    """--memory offload on a GPU: the masters and AdamW states stay in pinned host memory between steps, each chunk is
    copied over (on a side stream for the next chunk) and back, and after five clipped steps the parameters, masters
    and states are the plain step's, bit for bit."""
    from fp8lab.train import master_weights, optim as foptim
    from fp8lab.train.master_weights import MasterWeights

    monkeypatch.setattr(master_weights, "OFFLOAD_CHUNK_BYTES", 1 << 14)  # several chunks even for this net
    c = Config(lr=1e-3, weight_decay=0.1, device="cpu")
    a, b = _net(), _net()
    plain = MasterWeights(a, lambda ps: foptim.make_optimizer(ps, c, torch.device("cuda")))
    off = MasterWeights(b, lambda ps: foptim.make_optimizer(ps, c, torch.device("cuda")), offload=torch.device("cuda"))
    assert len(off._chunks) > 1
    x = torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        norms = []
        for net, opt in ((a, plain), (b, off)):
            net(x).float().square().mean().backward()
            norms.append(opt.clip_grad_norm_(0.01))
            opt.step()
            opt.zero_grad()
        assert float(norms[0]) > 0.01 and torch.equal(norms[0], norms[1])
    assert all(p.is_cuda and p.dtype == torch.bfloat16 for p in b.parameters())
    assert all(m.device.type == "cpu" and m.is_pinned() for m in off.masters)
    states = off.state_dict()["state"]
    assert all(st[k].device.type == "cpu" and st[k].is_pinned() for st in states.values()
               for k in ("exp_avg", "exp_avg_sq"))
    assert all(st["step"].is_cuda for st in states.values())  # 4 bytes each: left where the fused kernel counts them
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert all(torch.equal(m.cpu(), n) for m, n in zip(plain.masters, off.masters))
    ref = plain.state_dict()["state"]
    assert all(torch.equal(ref[n][k].cpu(), states[n][k].cpu()) for n in ref for k in ("exp_avg", "exp_avg_sq", "step"))


def test_a_run_with_offloaded_states_trains_as_the_plain_run_and_resumes_exactly(prepared, tmp_path, capsys):
    """The trainer with --memory offload: the same losses as --memory plain bit for bit (TE, FP8, the weight cache on
    in both, no CUDA graphs), recorded in its config, and a resume from its checkpoint continues it (as in the modes'
    own test above)."""
    _te_or_skip()
    base = dict(**TINY, precision="fp8", backend="te", steps=10, checkpoint_every=5, data=str(prepared),
                save_model=False, cuda_graphs="off", grad_accum=2)
    runs = {m: tmp_path / m for m in ("plain", "offload")}
    said = {}
    for mode, out in runs.items():
        s = train(TrainConfig(**base, memory=mode, output_dir=str(out)))
        assert s["status"] == "completed" and s["nonfinite_steps"] == 0
        said[mode] = capsys.readouterr().out
    assert "--memory offload: pinning" in said["offload"] and "pinning" not in said["plain"]  # a silent wait at 7B
    cfg = json.loads((runs["offload"] / "config.json").read_text())
    assert cfg["memory"] == "offload" and cfg["plan"]["memory"] == "offload"
    losses = {m: [r["loss"] for r in fmetrics.read_metrics(out / "metrics.jsonl")] for m, out in runs.items()}
    assert losses["offload"] == losses["plain"] and losses["offload"][-1] < losses["offload"][0]
    again = tmp_path / "again"
    shutil.copytree(runs["offload"], again)
    shutil.rmtree(again / "checkpoints" / "step_00000010")
    train(TrainConfig(**base, memory="offload", output_dir=str(again)))
    resumed = [r["loss"] for r in fmetrics.read_metrics(again / "metrics.jsonl")]
    assert resumed[:5] == losses["offload"][:5] and resumed[5:] == pytest.approx(losses["offload"][5:], rel=1e-3)
