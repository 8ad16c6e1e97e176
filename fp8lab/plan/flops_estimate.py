"""``Estimate``: a job's time and cost from model FLOPs at an assumed MFU (a planning number, not a
measurement). Plans use ``fp8lab.analysis.estimates.MeasuredEstimate`` (measured throughput), which falls back to it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fp8lab.model.models import model_flops_per_token

if TYPE_CHECKING:
    from fp8lab.launch.spec import JobSpec

# Compiling Transformer Engine's PyTorch part in a job whose image has no usable TE (fp8lab.launch.image): an
# ASSUMPTION, not a measurement (fp8lab has not timed it on SageMaker; set-up says "several minutes" on a GPU machine)
TE_BUILD_S = 1200


@dataclass(frozen=True)
class Estimate:
    """How long and how much, from model FLOPs and an assumed MFU (a planning number, not a measurement)."""

    assumed_mfu: float = 0.35  # of the BF16 dense peak; typical for well-tuned dense LLM training
    fp8_speedup: float = 1.15  # FP8 over BF16 end to end; the source blog reports 13% (1B) to 18% (7B)
    startup_s: int = 600  # provisioning, image pull, pip install: billed or not, it is wall time
    te_build_s: int = TE_BUILD_S  # added where the job compiles TE (JobSpec.builds_te: an image without a usable TE)

    def __post_init__(self) -> None:
        if not 0 < self.assumed_mfu <= 1:
            raise ValueError(f"assumed_mfu={self.assumed_mfu!r} must be in (0, 1]")
        if self.fp8_speedup <= 0:
            raise ValueError(f"fp8_speedup={self.fp8_speedup!r} must be > 0")
        if self.startup_s < 0:
            raise ValueError(f"startup_s={self.startup_s!r} must be >= 0")
        if self.te_build_s < 0:
            raise ValueError(f"te_build_s={self.te_build_s!r} must be >= 0")

    def startup(self, spec: JobSpec) -> float:
        """A job's start-up: ``startup_s``, plus ``te_build_s`` where the job compiles TE (its image has none
        usable)."""
        return self.startup_s + (self.te_build_s if getattr(spec, "builds_te", False) else 0)

    def seconds(self, spec: JobSpec) -> float:
        flops = model_flops_per_token(spec.model_cfg, spec.layout.seq_len) * spec.total_tokens
        rate = spec.world_size * spec.info.bf16_tflops * 1e12 * self.assumed_mfu
        if spec.precision == "fp8":
            rate *= self.fp8_speedup
        return flops / rate + self.startup(spec)

    def basis(self, spec: JobSpec) -> str:
        """What a job's estimate rests on (the plan table's ``basis`` column)."""
        return (f"assumed MFU {self.assumed_mfu} of BF16 peak"
                + (f", FP8 x{self.fp8_speedup}" if spec.precision == "fp8" else ""))

    def run_memory(self, run_id: str) -> str | None:
        """The memory mode a measured run trained in; an assumed-MFU estimate has no measured runs: None."""
        return None

    def describe(self) -> str:
        return (f"estimate: MFU {self.assumed_mfu} of BF16 peak, FP8 speed-up x{self.fp8_speedup}, "
                f"+{self.startup_s} s start-up per job, +{self.te_build_s} s where a job compiles TE "
                f"(planning numbers, not measurements)")
