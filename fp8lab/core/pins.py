"""The pinned GPU stack (torch, Transformer Engine, torchao), read from ``constraints-gpu.txt``
beside this file: the one place the versions live. ``scripts/setup.sh`` installs with that file as
pip constraints; the SageMaker job's requirements, ``fp8lab env`` and the backends' "not installed"
messages take their versions and the install command from here.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

CONSTRAINTS = Path(__file__).resolve().parents[1] / "constraints-gpu.txt"
INSTALL_COMMAND = "bash scripts/setup.sh"  # README, setup.sh and every "install it" message say this
MIN_TE = (2, 9)  # te.autocast first shipped in TE 2.9 (see constraints-gpu.txt)


@functools.lru_cache(maxsize=1)
def pins() -> dict[str, str]:
    """Package name (lower case, '-' separated) -> pinned version."""
    out = {}
    for line in CONSTRAINTS.read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s#;]+)", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def requirement(name: str, extras: str = "") -> str:
    """A pip requirement pinned to the tested version, e.g. 'transformer-engine[pytorch]==2.20.2'."""
    return f"{name}{f'[{extras}]' if extras else ''}=={pins()[name]}"


def install_hint() -> str:
    """What to run to get the pinned Transformer Engine and torchao on an NVIDIA machine."""
    p = pins()
    return (f"install: `{INSTALL_COMMAND}` from the fp8lab checkout on the GPU machine (Transformer Engine "
            f"{p['transformer-engine']}, torchao {p['torchao']} for torch {p['torch']}, pinned in "
            f"fp8lab/constraints-gpu.txt)")


def installed(dist: str) -> str | None:
    """The installed version of a distribution (``transformer-engine`` or its ``_`` spelling), without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    for name in (dist, dist.replace("-", "_")):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def installed_te() -> str | None:
    """Transformer Engine's installed version (the metapackage, or its PyTorch part where only that is installed)."""
    return installed("transformer-engine") or installed("transformer-engine-torch")


def te_supported(version: str | None) -> bool:
    """Whether a Transformer Engine version (e.g. '2.8.0', '2.20.2') has what fp8lab calls."""
    nums = re.findall(r"\d+", version or "")
    return len(nums) >= 2 and (int(nums[0]), int(nums[1])) >= MIN_TE
