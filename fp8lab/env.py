"""What this machine can do for FP8 training, and why not where it cannot.

FP8 tensor cores exist from compute capability 8.9 (Ada) and 9.0 (Hopper); Transformer
Engine and torchao need CUDA. Users ask this first, so it must never crash: every probe
is wrapped and turns failures into a reason string.
"""
from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
from dataclasses import asdict, dataclass, field

from fp8lab.core.pins import install_hint
from fp8lab.fp8.backends import detect_machine, fp8_gpu_problem
from fp8lab.plan import evidence
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.fp8_stats import fp8_stats_source



@dataclass
class EnvReport:
    python: str
    platform: str
    torch: str | None
    cuda: str | None
    gpu_count: int
    gpu_name: str | None
    compute_capability: str | None
    fp8_tensor_cores: bool
    fp8_reason: str | None
    transformer_engine: str | None
    transformer_engine_error: str | None
    torchao: str | None
    torchao_error: str | None
    transformers: str | None
    backends: dict[str, str | None] = field(default_factory=dict)
    auto_backend: str | None = None  # what backend 'auto' runs FP8 with here; None: refused (auto_refusal says why)
    auto_refusal: str | None = None
    # who reads the FP8 casts of a one-process FP8 run of backend 'auto' here (--fp8-stats-source auto), and why
    fp8_stats_source: str | None = None
    fp8_stats_reason: str | None = None

    def usable_backends(self) -> list[str]:
        return [name for name, why in self.backends.items() if why is None]

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        yes = lambda ok: "yes" if ok else "no"  # noqa: E731
        lines = [
            f"python               {self.python} ({self.platform})",
            f"torch                {self.torch or 'not installed'}"
            + (f" (CUDA {self.cuda})" if self.cuda else " (CPU build)" if self.torch else ""),
            f"transformers         {self.transformers or 'not installed'}",
            f"GPU                  {self.gpu_name or 'none'}"
            + (f" x{self.gpu_count}, compute capability {self.compute_capability}" if self.gpu_name else ""),
            f"FP8 tensor cores     {yes(self.fp8_tensor_cores)}" + (f" ({self.fp8_reason})" if self.fp8_reason else ""),
            f"Transformer Engine   {self.transformer_engine or 'no: ' + str(self.transformer_engine_error)}",
            f"torchao              {self.torchao or 'no: ' + str(self.torchao_error)}",
            "backends:",
        ]
        for name, why in self.backends.items():
            lines.append(f"  {name:<10} {'usable' if why is None else 'not usable: ' + why}")
        lines.append(f"backend 'auto'       {self.auto_backend or 'refused: ' + str(self.auto_refusal)}")
        if self.fp8_stats_source or self.fp8_stats_reason:
            lines.append(f"FP8 health read by   {self.fp8_stats_source or 'nobody'} ({self.fp8_stats_reason})")
        if self.auto_backend != "te":
            lines.append(f"Transformer Engine   {install_hint()}")
        return "\n".join(lines)

    def check(self) -> tuple[bool, str]:
        """(ok, one line) for the end of set-up: on an FP8 GPU, Transformer Engine must be usable;
        below compute capability 8.9 only emulated FP8 runs, which is said by name."""
        if not self.gpu_name:
            return True, f"no CUDA GPU: FP8 runs emulated ({self.fp8_reason})"
        if not self.fp8_tensor_cores:
            return True, (f"{self.gpu_name} (compute capability {self.compute_capability}) has no FP8 tensor cores: "
                          f"emulated FP8 only (--backend emulated, pure PyTorch, for learning; not for speed)")
        if self.backends.get("te") is None:
            return True, (f"{self.gpu_name}: Transformer Engine {self.transformer_engine} usable, FP8 available"
                          + (f"; torchao {self.torchao} usable" if self.backends.get("torchao") is None else ""))
        return False, f"{self.gpu_name}: Transformer Engine not usable: {self.backends.get('te')}"


def _version(module: str) -> tuple[str | None, str | None]:
    """(version, None) when the module imports, else (None, short reason)."""
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # ImportError, or a broken CUDA library (OSError, RuntimeError)
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return None, f"{type(exc).__name__}: {msg[:160]}"
    return str(getattr(mod, "__version__", "unknown")), None


def _installed_version(dist: str) -> str | None:
    """The installed version of distribution ``dist`` from its metadata, without importing it; None: not installed."""
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def report() -> EnvReport:
    """Probe torch, the GPU, Transformer Engine and torchao; never raises."""
    torch_version, _ = _version("torch")
    cuda = gpu_name = cc = None
    count = 0
    fp8 = False
    fp8_reason: str | None = "torch is not installed"
    if torch_version:
        import torch

        cuda = torch.version.cuda
        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            gpu_name = torch.cuda.get_device_name(0)
            major, minor = torch.cuda.get_device_capability(0)
            cc = f"{major}.{minor}"

            fp8_reason = fp8_gpu_problem()
            fp8 = fp8_reason is None
        else:
            fp8_reason = "no CUDA GPU visible" + ("" if cuda else " (this torch is a CPU build)")
    te_version, te_error = _version("transformer_engine.pytorch") if torch_version else (None, "needs torch")
    if te_version == "unknown":
        te_version, _ = _version("transformer_engine")
    ao_version, ao_error = _version("torchao") if torch_version else (None, "needs torch")
    hf_version = _installed_version("transformers")  # only reported: not imported (it takes about a second)
    backends: dict[str, str | None]
    try:
        # torch: `fp8lab env --help` and the report's header without it
        from fp8lab.fp8.convert import available_backends

        backends = dict(available_backends())
        auto, refusal = _auto_choice()
    except Exception as exc:  # the conversion layer itself failed to import
        backends = {"emulated": None if torch_version else "needs torch",
                    "te": f"fp8lab.fp8.convert failed to import: {exc}",
                    "torchao": f"fp8lab.fp8.convert failed to import: {exc}"}
        auto, refusal = None, f"fp8lab.fp8.convert failed to import: {exc}"
    stats_source, stats_reason = _fp8_stats_choice(auto)
    return EnvReport(
        python=platform.python_version(), platform=f"{platform.system()} {platform.machine()}",
        torch=torch_version, cuda=cuda, gpu_count=count, gpu_name=gpu_name, compute_capability=cc,
        fp8_tensor_cores=fp8, fp8_reason=fp8_reason, transformer_engine=te_version,
        transformer_engine_error=te_error, torchao=ao_version, torchao_error=ao_error,
        transformers=hf_version, backends=backends, auto_backend=auto, auto_refusal=refusal,
        fp8_stats_source=stats_source, fp8_stats_reason=stats_reason,
    )


def _auto_choice() -> tuple[str | None, str | None]:
    """(backend 'auto' picks, None) or (None, why it refuses), from the one selection function."""
    from fp8lab.fp8.convert import BackendUnavailableError, pick_backend  # torch, as in report()

    try:
        return pick_backend("auto"), None
    except BackendUnavailableError as exc:
        return None, str(exc)


def _fp8_stats_choice(backend: str | None) -> tuple[str | None, str | None]:
    """(source, why) that the plan's one rule (fp8lab.plan.fp8_stats.fp8_stats_source) picks for a one-process FP8 run
    on ``backend`` with every option at its default (this machine's facts, the packaged evidence); (None, why) when
    that cannot be said."""
    if backend is None:
        return None, "no FP8 backend 'auto' runs here"
    try:
        import torch  # as in report()

        here = detect_machine(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
        return fp8_stats_source(TrainConfig(precision="fp8"), backend, here, evidence.load())
    except Exception as exc:  # never crash the report
        return None, f"could not be decided: {type(exc).__name__}: {exc}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fp8lab env", description="What this machine can do for FP8 training.")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--check", action="store_true",
                        help="one line; exit 1 on an FP8 GPU where Transformer Engine is not usable (set-up's last "
                             "step)")
    args = parser.parse_args(argv)
    rep = report()
    if args.check:
        ok, line = rep.check()
        print(f"fp8lab env: {line}" + ("" if ok else f"; {install_hint()}"))
        return 0 if ok else 1
    print(json.dumps(rep.to_dict(), indent=2) if args.json else rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
