"""Facts about the machines fp8lab plans for: GPU memory and how to read this machine's.

The layout resolver (``fp8lab.layout``) sizes micro-batches from a GPU's memory; the launcher
plans SageMaker jobs for a GPU it cannot see, so it looks the memory up here by the instance's
GPU name. Memory is what ``torch.cuda.get_device_properties(i).total_memory`` reports (GiB), not
the marketing figure: an "80 GB" H100 reports about 79.2 GiB, a 141 GB H200 about 139.8 GiB.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

# GiB as torch reports them, by a name fragment of the GPU; matched in order (specific first).
GPU_MEMORY_GIB: tuple[tuple[str, float], ...] = (
    ("H200", 139.8),
    ("H100 80GB", 79.2),
    ("H100", 79.2),  # SXM5 80 GB, the GPU of SageMaker P5
    ("B200", 178.4),
    ("A100 80GB", 79.2),
    ("A100 40GB", 39.4),
    ("A100", 39.4),
)


def gpu_memory_gib(gpu_name: str) -> float | None:
    """Memory of a GPU by (a fragment of) its name, or None when the table does not know it."""
    for key, gib in GPU_MEMORY_GIB:
        if key.lower() in gpu_name.lower():
            return gib
    return None


def cpu_memory_gib() -> float:
    """Physical memory of this machine (what a CPU run's tensors compete for)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a laptop
        return 16.0


@dataclass(frozen=True)
class Machine:
    """Where a run goes: what the layout resolver needs to know about it.

    ``memory_gib`` is per device (one GPU, or the whole machine on a CPU). ``te_usable``: Transformer
    Engine imports and runs here (its layers are then the fastest BF16 fp8lab has as well).
    ``fp8``: the GPU has FP8 tensor cores.
    """

    device: str  # "cpu" | "cuda"
    name: str  # GPU name, or "cpu"
    memory_gib: float
    world_size: int = 1
    te_usable: bool = False
    fp8: bool = False

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    @classmethod
    def detect(cls, device, world_size: int = 1, memory_gib: float = 0.0) -> "Machine":
        """This process's device (a ``torch.device``); ``memory_gib`` > 0 caps it (an emulated smaller GPU)."""
        if getattr(device, "type", device) != "cuda":
            return cls("cpu", "cpu", memory_gib or cpu_memory_gib(), world_size)
        import torch

        from fp8lab.backends import available_backends

        props = torch.cuda.get_device_properties(device)
        total = props.total_memory / 2**30
        te_ok = available_backends().get("te") is None
        return cls("cuda", props.name, min(total, memory_gib) if memory_gib else total, world_size,
                   te_usable=te_ok, fp8=(props.major, props.minor) >= (8, 9))

    @classmethod
    def planned(cls, gpu_name: str, world_size: int, fp8: bool) -> "Machine":
        """A GPU this process cannot see (a SageMaker instance's): Transformer Engine assumed installed there."""
        mem = gpu_memory_gib(gpu_name)
        if mem is None:
            raise ValueError(f"no memory size known for GPU {gpu_name!r}; known: {', '.join(k for k, _ in GPU_MEMORY_GIB)}")
        return cls("cuda", gpu_name, mem, world_size, te_usable=True, fp8=fp8)
