"""Facts about the machines fp8lab plans for, in one place: the GPUs (one table, :data:`GPUS`: memory,
dense BF16/FP8 peaks, HBM and NVLink bandwidth, generation, looked up by name with :func:`gpu_spec`),
SageMaker instance types and their assumed prices, the placeholders of a dry run and the folder
SageMaker syncs checkpoints from. Other modules read these facts from here (``fp8lab.launch``,
``fp8lab.train.entry`` and ``fp8lab.records.metrics`` re-export their old names); this module imports nothing of
fp8lab at module level, so any module may import it.

The layout resolver (``fp8lab.plan.layout``) sizes micro-batches from a GPU's memory; the launcher
plans SageMaker jobs for a GPU it cannot see, so it looks the memory up here by the instance's
GPU name. Memory is what ``torch.cuda.get_device_properties(i).total_memory`` reports (GiB), not
the marketing figure: an "80 GB" H100 reports about 79.2 GiB, a 141 GB H200 about 139.8 GiB.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class GPU:
    """What fp8lab knows of one GPU model, from NVIDIA's data sheets; None where this table does not say.

    ``fragment`` is matched against a GPU's name (as ``torch.cuda.get_device_name()`` or ``INSTANCES`` write
    it). Peaks are dense (no 2:4 sparsity) tensor-core FLOP/s; ``memory_gib`` is what torch reports (see the
    module's docstring); ``hbm``: HBM bandwidth in bytes/s, what memory-bound kernels (casts, norms,
    elementwise, the optimizer) scale with; ``nvlink``: NVLink bytes/s per GPU and direction (NVIDIA quotes
    900 GB/s for H100/H200 SXM, NVLink 4, and 1.8 TB/s for B200, NVLink 5, both directions together; half of
    that each way); ``generation``: one of :data:`GENERATIONS` (what runs on it: FP8 from Ada on, :func:`has_fp8`;
    a recipe kind's ``needs`` and TE's FP8 attention, fp8lab.fp8.recipe.TABLE).
    """

    fragment: str
    generation: str | None = None
    memory_gib: float | None = None
    bf16: float | None = None
    fp8: float | None = None
    hbm: float | None = None
    nvlink: float | None = None


# Matched in order, specific names first ("GB200" before "B200", "H200" before "H20", "L40S" before "L4"); a
# fact a row leaves None comes from the next matching row that has it (an "H100 PCIe" has the "H100" memory).
GPUS: tuple[GPU, ...] = (
    GPU("GH200", "hopper", bf16=989e12, fp8=1979e12, hbm=4.8e12),
    # H200 SXM (NVL, at a lower clock, is close; use --peak-tflops to set it)
    GPU("H200", "hopper", 139.8, bf16=989e12, fp8=1979e12, hbm=4.8e12, nvlink=450e9),
    GPU("H100 80GB", memory_gib=79.2),
    GPU("H100 PCIe", bf16=756e12, fp8=1513e12, hbm=2.0e12),
    GPU("H100 NVL", bf16=835e12, fp8=1671e12, hbm=3.9e12),
    # H100 SXM5 80 GB ("NVIDIA H100 80GB HBM3"), the GPU of SageMaker P5
    GPU("H100", "hopper", 79.2, bf16=989e12, fp8=1979e12, hbm=3.35e12, nvlink=450e9),
    GPU("H800", "hopper", bf16=989e12, fp8=1979e12, hbm=3.35e12),
    GPU("H20", "hopper"),
    GPU("GB200", "blackwell"),
    GPU("B200", "blackwell", 178.4, bf16=2250e12, fp8=4500e12, hbm=8.0e12, nvlink=900e9),
    GPU("B100", "blackwell", bf16=1750e12, fp8=3500e12, hbm=8.0e12),
    GPU("B300", "blackwell"),
    GPU("A100 80GB", memory_gib=79.2, hbm=2.0e12),
    GPU("A100-SXM4-80GB", memory_gib=79.2, hbm=2.0e12),  # torch's name for the SXM part: no "A100 80GB" in it
    GPU("A100 40GB", memory_gib=39.4),
    GPU("A100", "ampere", memory_gib=39.4, bf16=312e12, hbm=1.555e12, nvlink=300e9),
    GPU("L40S", "ada", bf16=362e12, fp8=733e12, hbm=0.864e12),
    GPU("L40", "ada", bf16=181e12, fp8=362e12, hbm=0.864e12),  # before "L4", which it contains
    GPU("L4", "ada", bf16=121e12, fp8=242e12, hbm=0.3e12),
)

# GPU generations in order, with the compute capability each starts at (NVIDIA's CUDA GPU list). FP8 tensor cores
# exist from Ada (8.9) on: the one statement of "this GPU has FP8" (has_fp8), for a GPU seen or planned.
GENERATIONS: dict[str, tuple[int, int]] = {"ampere": (8, 0), "ada": (8, 9), "hopper": (9, 0), "blackwell": (10, 0)}
FP8_GENERATION = "ada"
FP8_CAPABILITY = GENERATIONS[FP8_GENERATION]
FP8_CAPABILITY_TEXT = ".".join(map(str, FP8_CAPABILITY))  # "8.9", as messages write it


def _column(fact: str) -> tuple[tuple[str, Any], ...]:
    """(name fragment, value) of the GPUs that have ``fact``, in match order: the table :func:`gpu_spec` reads."""
    return tuple((g.fragment, getattr(g, fact)) for g in GPUS if getattr(g, fact) is not None)


# One column of GPUS each, under their old names
GPU_MEMORY_GIB = _column("memory_gib")
PEAK_BF16_DENSE = _column("bf16")
PEAK_FP8_DENSE = _column("fp8")
HBM_BANDWIDTH = _column("hbm")
NVLINK_BANDWIDTH = _column("nvlink")
GPU_GENERATION = _column("generation")


def gpu_spec(table: tuple[tuple[str, Any], ...], gpu_name: str | None) -> Any:
    """A value of one of the columns above for a GPU by (a fragment of) its name; None where unknown (a run whose
    records name no GPU has NaN there, read from a bare metrics.jsonl)."""
    if not isinstance(gpu_name, str):
        return None
    for key, value in table:
        if gpu_name and key.lower() in gpu_name.lower():
            return value
    return None


def gpu_model(gpu_name: str | None) -> str | None:
    """The row of :data:`GPUS` a GPU's name matches first (its fragment, e.g. "H100 80GB" for both "NVIDIA H100 80GB
    HBM3" and P5's "H100 80GB"): two names of one GPU model give the same; None where no row matches."""
    return next((g.fragment for g in GPUS if isinstance(gpu_name, str) and gpu_name
                 and g.fragment.lower() in gpu_name.lower()), None)


def on_instance_gpu(gpu_name: object, instance_type: str) -> bool:
    """Whether a run on ``gpu_name`` ran on the GPU model of ``instance_type`` (:data:`INSTANCES`), e.g. a run on an
    "NVIDIA H100 80GB HBM3" for ml.p5.48xlarge: its speed needs no projection to that instance."""
    return isinstance(gpu_name, str) and gpu_model(gpu_name) == gpu_model(INSTANCES[instance_type].gpu)


def gpu_label(gpu_name: object) -> str:
    """A GPU's name as tables and sentences write it: "H100 80GB HBM3" for "NVIDIA H100 80GB HBM3"."""
    return str(gpu_name).removeprefix("NVIDIA ")


def generation(gpu: str | tuple[int, int] | None) -> str | None:
    """The generation of a GPU by name (:data:`GPUS`) or by compute capability ``(major, minor)``; None: before
    Ampere, or a name the table does not know."""
    if isinstance(gpu, tuple):
        started = [g for g, cc in GENERATIONS.items() if tuple(gpu) >= cc]
        return started[-1] if started else None
    return gpu_spec(GPU_GENERATION, gpu)


def at_least(gen: str | None, needed: str) -> bool:
    """Whether generation ``gen`` is ``needed`` or later (None: no)."""
    return gen is not None and GENERATIONS[gen] >= GENERATIONS[needed]


def has_fp8(gpu: str | tuple[int, int] | None) -> bool:
    """Whether a GPU (by name, or by compute capability) has FP8 tensor cores: Ada (8.9) and later."""
    return at_least(generation(gpu), FP8_GENERATION)


def peak_bf16_flops(gpu_name: str | None) -> float | None:
    """Dense BF16 peak FLOP/s of a GPU by name; None for CPUs and GPUs not in the table."""
    return gpu_spec(PEAK_BF16_DENSE, gpu_name)


def gpu_memory_gib(gpu_name: str) -> float | None:
    """Memory of a GPU by (a fragment of) its name, or None when the table does not know it."""
    return gpu_spec(GPU_MEMORY_GIB, gpu_name)


# a container's memory limit (cgroup v2, then v1): a process is killed past it, whatever the machine has
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def cpu_memory_gib(limits: tuple[str, ...] = CGROUP_LIMITS) -> float:
    """Memory this process may use: the machine's physical memory, or its container's limit where lower (what a CPU
    run's tensors, and states kept in host memory, compete for)."""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError, AttributeError):  # not POSIX: assume a laptop
        return 16.0
    for path in limits:
        try:
            text = open(path, encoding="ascii").read().strip()
        except OSError:
            continue
        if text.isdigit():  # "max": no limit
            total = min(total, int(text) / 2**30)
    return total


# A study's choice of the fused loss's chunk kernel on this machine (a control): read by Machine.detect only
LOSS_KERNEL_ENV = "FP8LAB_FUSED_LOSS_KERNEL"
TE_DEBUG_UNKNOWN = "nvdlfw-inspect is not known to be installed there"  # a Machine made by hand


@dataclass(frozen=True)
class Machine:
    """Where a run goes: what the plan needs to know about it, this process's or a planned instance's.

    ``memory_gib`` is per device (one GPU, or the whole machine on a CPU). ``te_usable``: Transformer
    Engine imports and runs there (its layers are then the fastest BF16 fp8lab has as well).
    ``fp8``: the GPU has FP8 tensor cores. The software facts the plan reads are fields too, so a plan is
    a function of what it is given: ``te_release`` (Transformer Engine's version there, None: none or
    unknown), ``te_debug_problem`` (why TE's debug API cannot run there, None: it can) and ``loss_kernel``
    (the fused loss's chunk kernel a study chose there with :data:`LOSS_KERNEL_ENV`; None: the device's default).
    """

    device: str  # "cpu" | "cuda"
    name: str  # GPU name, or "cpu"
    memory_gib: float
    world_size: int = 1
    # host memory for each GPU's process (what states kept in host memory can use); None: not known
    host_memory_gib: float | None = None
    te_usable: bool = False
    fp8: bool = False
    unusable: tuple[tuple[str, str], ...] = ()  # (backend, why it cannot run here), as Machine.detect found them
    te_release: str | None = None
    te_debug_problem: str | None = TE_DEBUG_UNKNOWN
    loss_kernel: str | None = None

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    def backend_problem(self, name: str) -> str | None:
        """Why backend ``name`` cannot run here (None: it can, or this machine is planned, not seen)."""
        return dict(self.unusable).get(name)

    @classmethod
    def detect(cls, device, world_size: int = 1, memory_gib: float = 0.0, *,
               unusable: tuple[tuple[str, str], ...], te_release: str | None = None,
               te_debug_problem: str | None = TE_DEBUG_UNKNOWN) -> "Machine":
        """This process's device (a ``torch.device``); ``memory_gib`` > 0 caps it (an emulated smaller GPU);
        ``unusable``: (backend, why) of the backends that cannot run here, ``te_release`` and ``te_debug_problem``
        as this process finds them (``fp8lab.fp8.backends.detect_machine``); the loss kernel from
        :data:`LOSS_KERNEL_ENV`."""
        facts = {"unusable": unusable, "te_release": te_release, "te_debug_problem": te_debug_problem,
                 "loss_kernel": os.environ.get(LOSS_KERNEL_ENV) or None}
        if getattr(device, "type", device) != "cuda":
            return cls("cpu", "cpu", memory_gib or cpu_memory_gib(), world_size, **facts)
        import torch

        props = torch.cuda.get_device_properties(device)
        total = props.total_memory / 2**30
        te_ok = "te" not in dict(unusable)
        # the processes of one machine share its memory: one per GPU, at most as many as the job has
        host = cpu_memory_gib() / max(1, min(world_size, torch.cuda.device_count()))
        return cls("cuda", props.name, min(total, memory_gib) if memory_gib else total, world_size, host,
                   te_usable=te_ok, fp8=has_fp8((props.major, props.minor)), **facts)

    @classmethod
    def planned(cls, gpu_name: str, world_size: int, fp8: bool, te_release: str | None = None,
                te_debug_problem: str | None = None, host_memory_gib: float | None = None) -> "Machine":
        """A GPU this process cannot see (a SageMaker instance's): Transformer Engine installed there, at
        ``te_release`` (the launcher passes the pinned one, what the job installs), with TE's debug API
        (``te_debug_problem`` None: the job installs nvdlfw-inspect); the loss kernel is the GPU's default;
        ``host_memory_gib``: the instance's memory for each GPU's process (InstanceInfo.host_gib_per_gpu)."""
        mem = gpu_memory_gib(gpu_name)
        if mem is None:
            known = ", ".join(k for k, _ in GPU_MEMORY_GIB)
            raise ValueError(f"no memory size known for GPU {gpu_name!r}; known: {known}")
        return cls("cuda", gpu_name, mem, world_size, host_memory_gib, te_usable=True, fp8=fp8,
                   te_release=te_release, te_debug_problem=te_debug_problem)


# ----------------------------------------------------------------------------------------------
# SageMaker: instance types, assumed prices, dry-run placeholders, the checkpoint folder
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InstanceInfo:
    """What a SageMaker instance type offers for this experiment (its GPU's generation and FP8 from :data:`GPUS`)."""

    gpus: int  # GPUs per instance = torchrun processes per node
    gpu: str
    bf16_tflops: float  # dense BF16 peak per GPU (vendor datasheet), for time estimates
    host_gib: float  # the instance's memory (EC2's published size), shared by its GPUs' processes

    @property
    def host_gib_per_gpu(self) -> float:
        return self.host_gib / self.gpus

    @property
    def generation(self) -> str | None:
        return generation(self.gpu)

    @property
    def fp8(self) -> bool:
        """FP8 tensor cores (Hopper / Blackwell here); A100 has none."""
        return has_fp8(self.gpu)

    @property
    def blackwell(self) -> bool:
        return self.generation == "blackwell"


INSTANCES: dict[str, InstanceInfo] = {
    "ml.p5.48xlarge": InstanceInfo(8, "H100 80GB", 989.0, 2048.0),
    # one H100 of P5: one process, no FSDP (JobSpec's parallel)
    "ml.p5.4xlarge": InstanceInfo(1, "H100 80GB", 989.0, 256.0),
    "ml.p5e.48xlarge": InstanceInfo(8, "H200 141GB", 989.0, 2048.0),
    "ml.p5en.48xlarge": InstanceInfo(8, "H200 141GB", 989.0, 2048.0),
    "ml.p6-b200.48xlarge": InstanceInfo(8, "B200 180GB", 2250.0, 2048.0),
    "ml.p4d.24xlarge": InstanceInfo(8, "A100 40GB", 312.0, 1152.0),
    "ml.p4de.24xlarge": InstanceInfo(8, "A100 80GB", 312.0, 1152.0),
}

# On-demand USD per instance-hour used when no price is passed, with the date each holds for. ASSUMPTIONS, not
# quotes: the published SageMaker AI on-demand *training* price of ml.p5.48xlarge in US East (N. Virginia) as listed
# on aws.amazon.com/sagemaker/pricing around the source blog's date; ml.p5.4xlarge (one of P5's 8 GPUs) at an eighth
# of it. Prices differ by region and change (AWS cut P5 prices during 2025): pass price_per_hour, or look the
# current one up (fp8lab.core.prices: --price-per-hour lookup). Every cost is printed beside its price and date.
DEFAULT_PRICES_USD_PER_HOUR: dict[str, float] = {"ml.p5.48xlarge": 113.07, "ml.p5.4xlarge": round(113.07 / 8, 2)}
PRICE_AS_OF: dict[str, str] = {"ml.p5.48xlarge": "2024-11", "ml.p5.4xlarge": "2024-11"}
PRICE_SOURCE = (
    "assumed on-demand price of ml.p5.48xlarge SageMaker training in us-east-1 "
    "(SageMaker AI pricing page, as of 2024-11); check current pricing and pass your own price"
)
PRICE_SOURCES: dict[str, str] = {
    "ml.p5.48xlarge": "assumed: the SageMaker AI pricing page's on-demand training price; P5 prices were cut in "
                      "2025: pass your own price or look it up",
    "ml.p5.4xlarge": "assumed: an eighth of ml.p5.48xlarge's assumed price (one of its 8 GPUs); "
                     "pass your own price or look it up",
}


def price_for(instance_types: Iterable[str], price_per_hour: float | None) -> tuple[float, str]:
    """(USD per instance-hour, where that number comes from) for jobs on ``instance_types``.

    ``price_per_hour`` wins when given; else the assumed default, with its date. (fp8lab.core.prices.price_of
    returns the same as a ``Price``, and takes ``lookup``.)
    """
    if price_per_hour is not None:
        if isinstance(price_per_hour, bool) or not isinstance(price_per_hour, (int, float)) or not (
                0 < price_per_hour < math.inf):
            raise ValueError(f"price_per_hour={price_per_hour!r} is invalid; allowed: a finite number > 0 "
                             "(USD per instance-hour)")
        return float(price_per_hour), "price_per_hour given by the caller"
    types = set(instance_types)
    unknown = sorted(types - set(DEFAULT_PRICES_USD_PER_HOUR))
    if unknown or len(types) != 1:
        raise ValueError(f"no default price for {', '.join(unknown or sorted(types))}: pass price_per_hour "
                         f"(USD per instance-hour); defaults exist for {', '.join(DEFAULT_PRICES_USD_PER_HOUR)}")
    t = types.pop()
    return DEFAULT_PRICES_USD_PER_HOUR[t], f"{PRICE_SOURCES[t]} (as of {PRICE_AS_OF[t]})"


# Obvious placeholders that pass every validation, so a dry run works with no account:
# 111122223333 is the example account id AWS documentation uses, amzn-s3-demo-bucket its
# example bucket. A real launch refuses them.
PLACEHOLDER_ROLE = "arn:aws:iam::111122223333:role/fp8lab-sagemaker-execution-role"
PLACEHOLDER_BUCKET = "amzn-s3-demo-bucket"

# The folder SageMaker syncs with a job's checkpoint S3 URI (the trainer's default checkpoint folder there)
SAGEMAKER_CHECKPOINT_DIR = "/opt/ml/checkpoints"
# The folder SageMaker copies to a job's TensorBoardOutputConfig S3 path (the SDK's default local_path)
SAGEMAKER_TENSORBOARD_DIR = "/opt/ml/output/tensorboard"


# ----------------------------------------------------------------------------------------------
# For the scaling model (fp8lab.analysis.scaling): what else a GPU and an instance offer
# ----------------------------------------------------------------------------------------------

# EFA network bandwidth per instance in bit/s (AWS instance pages: P5 and P5e/P5en 3,200 Gbps;
# P4d 400 Gbps; P6-B200 3,200 Gbps). ml.p5.4xlarge: ASSUMED to be P5's per-GPU share (400 Gbps for its one GPU),
# not read from AWS's page; it enters only plans of several such instances.
EFA_GBPS: dict[str, float] = {"ml.p5.48xlarge": 3200.0, "ml.p5.4xlarge": 3200.0 / 8, "ml.p5e.48xlarge": 3200.0,
                              "ml.p5en.48xlarge": 3200.0,
                              "ml.p6-b200.48xlarge": 3200.0, "ml.p4d.24xlarge": 400.0, "ml.p4de.24xlarge": 400.0}

