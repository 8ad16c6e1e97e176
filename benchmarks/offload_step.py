"""What one optimizer step of ``--memory offload`` costs on this GPU, against the host link it is bound by.

Builds a model's parameter shapes (bf16 on the GPU, random values and gradients; no forward), wraps them in
``MasterWeights(offload=...)`` as the trainer does, and times the whole step (norm and clip included) after one
untimed step. Beside it: the pinned copy rate host-to-GPU, GPU-to-host and both at once, the floor for the 24 bytes
per parameter (12 each way) the step moves. Prints one JSON line per measurement (and writes them to ``--out``).

    python3 benchmarks/offload_step.py --model llama-7b --out /tmp/offload-step.jsonl
"""
import argparse
import json
import time

import torch
from torch import nn

from fp8lab.model.models import get_config
from fp8lab.plan.memory_modes import get as memory_mode
from fp8lab.train import optim as foptim
from fp8lab.train.master_weights import MasterWeights


def shapes(mcfg) -> list[tuple[int, ...]]:
    """A Llama-style model's parameter shapes, embedding and head untied."""
    h, i, v = mcfg.hidden_size, mcfg.intermediate_size, mcfg.vocab_size
    kv = (mcfg.num_kv_heads or mcfg.num_heads) * (h // mcfg.num_heads)
    block = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i), (h,), (h,)]
    return [(v, h)] + block * mcfg.num_layers + [(h,), (v, h)]


class Bare(nn.Module):
    def __init__(self, dims: list[tuple[int, ...]], device: torch.device):
        super().__init__()
        self.ps = nn.ParameterList(nn.Parameter(torch.randn(d, device=device, dtype=torch.bfloat16) * 0.02)
                                   for d in dims)


def copy_rate(gib: int, device: torch.device) -> dict:
    """GB/s of pinned host-to-GPU, GPU-to-host and both at once (two streams), ``gib`` GiB each way."""
    n = gib * 2**30 // 4
    host_a = torch.empty(n, dtype=torch.float32, pin_memory=True)
    host_b = torch.empty(n, dtype=torch.float32, pin_memory=True)
    dev_a = torch.empty(n, dtype=torch.float32, device=device)
    dev_b = torch.empty(n, dtype=torch.float32, device=device)
    up, down = torch.cuda.Stream(device), torch.cuda.Stream(device)

    def timed(fn) -> float:
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    def h2d():
        with torch.cuda.stream(up):
            dev_a.copy_(host_a, non_blocking=True)

    def d2h():
        with torch.cuda.stream(down):
            host_b.copy_(dev_b, non_blocking=True)

    def both():
        h2d()
        d2h()

    gb = n * 4 / 1e9
    timed(both)  # warm
    return {"h2d_gb_s": gb / timed(h2d), "d2h_gb_s": gb / timed(d2h), "both_gb_s": 2 * gb / timed(both)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-7b")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the harness (no copy rates)")
    a = ap.parse_args()
    device = torch.device(a.device)
    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)
    lines = []

    def emit(rec: dict) -> None:
        rec = {k: round(v, 3) if isinstance(v, float) else v for k, v in rec.items()}
        print(json.dumps(rec), flush=True)
        lines.append(rec)
        if a.out:
            with open(a.out, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in lines)

    emit({"what": "gpu", "name": torch.cuda.get_device_name(device) if cuda else "none", "torch": torch.__version__})
    if cuda:
        emit({"what": "pinned copies, 4 GiB each way", **copy_rate(4, device)})
    mcfg = get_config(a.model)
    model = Bare(shapes(mcfg), device)
    n = sum(p.numel() for p in model.parameters())
    c = argparse.Namespace(lr=1e-4, min_lr=1e-5, beta1=0.9, beta2=0.95, weight_decay=0.1)
    t0 = time.perf_counter()
    mw = MasterWeights(model, lambda ps: foptim.make_optimizer(ps, c, device), offload=device)
    emit({"what": "host arena", "params": n, "host_gib": memory_mode("offload").host_bytes * n / 2**30,
          "build_s": time.perf_counter() - t0, "chunks": len(mw._chunks)})
    for step in range(a.steps + 1):
        for p in model.parameters():
            p.grad = torch.randn_like(p) * 1e-3
        sync()
        t0 = time.perf_counter()
        mw.clip_grad_norm_(1.0)
        mw.step()
        mw.zero_grad()
        sync()
        dt = time.perf_counter() - t0
        emit({"what": "offloaded step", "step": step, "timed": step > 0, "seconds": dt,
              "gb_moved": 24 * n / 1e9, "gb_s": 24 * n / 1e9 / dt,
              "gpu_peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0})


if __name__ == "__main__":
    main()
