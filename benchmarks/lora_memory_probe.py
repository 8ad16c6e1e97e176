"""Where a LoRA run's GPU memory goes: runs ``python -m fp8lab.train`` with the given arguments and prints the
memory allocated before and after the adapters go on (and the MLP split), the peak up to then, and the training
peak from then on (the build's transients are kept out of it).

    python3 benchmarks/lora_memory_probe.py --model data/reference/configs/llama-3.1-8b --task sft --lora-rank 16 ...
"""
import atexit
import runpy
import sys

import torch

from fp8lab.fp8 import fused
from fp8lab.train import lora


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def report(what: str) -> None:
    if not torch.cuda.is_available():
        print(f"[probe] {what}: no CUDA GPU", flush=True)
        return
    print(f"[probe] {what}: allocated {gib(torch.cuda.memory_allocated())}, "
          f"peak so far {gib(torch.cuda.max_memory_allocated())}", flush=True)


def wrap(owner, name: str) -> None:
    inner = getattr(owner, name)

    def probed(*a, **k):
        report(f"before {name}")
        out = inner(*a, **k)
        report(f"after {name}")
        if name == "apply" and torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()  # from here on: training's own peak
        return out

    setattr(owner, name, probed)


wrap(lora, "apply")
wrap(fused.FusedCausalLM, "split_mlps")
atexit.register(lambda: report("at exit (peak since the adapters went on)"))
sys.argv = ["fp8lab.train", *sys.argv[1:]]
runpy.run_module("fp8lab.train", run_name="__main__")
