"""Transformer Engine's pickled FP8 state for the tests of fp8lab.train.te_state: crafted pickles, a checkpoint
tampered in place, and (for CPU tests, where TE is not installed) stand-ins for TE's recipe module and
for a TE module that reads its extra state as TE 2.20 does (``pickle.loads``, behind TE's opt-in)."""
from __future__ import annotations

import os
import pickle
import sys
import types
from pathlib import Path

import torch

# TE's recipe types under their module path, the fields they pickle (transformer_engine/common/recipe):
# what fp8lab.train.te_state allowlists by module path and name.
RECIPE_STANDIN = '''
from enum import Enum
from typing import Callable, NamedTuple, Optional, Union

from pydantic.dataclasses import dataclass


class _FormatHelper(NamedTuple):
    max_fwd: float
    max_bwd: float


class Format(Enum):
    E4M3 = _FormatHelper(max_fwd=448, max_bwd=448)
    HYBRID = _FormatHelper(max_fwd=448, max_bwd=57344)


class Recipe:
    _cached_repr = None

    def __setattr__(self, name, value):  # TE's: a set attribute drops the cached repr
        if name != "_cached_repr":
            object.__setattr__(self, "_cached_repr", None)
        object.__setattr__(self, name, value)


@dataclass(repr=False)
class DelayedScaling(Recipe):
    margin: int = 0
    fp8_format: Format = Format.HYBRID
    amax_history_len: int = 1024
    amax_compute_algo: Union[str, Callable] = "max"
    scaling_factor_compute_algo: Optional[Callable] = None
    reduce_amax: bool = True
    fp8_dpa: bool = False
    fp8_mha: bool = False
    backward_override: Optional[str] = None


@dataclass(frozen=True)
class MMParams:
    use_split_accumulator: bool = True
'''

# A module whose set_extra_state does what TE's does with a pickled extra state.
MODULE_STANDIN = '''
import os
import pickle

import torch


class Linear(torch.nn.Linear):
    """Delayed scaling's scale and amax history in ``_extra_state`` as TE pickles them; 0 bytes until used."""

    def __init__(self, n, recipe):
        super().__init__(n, n)
        self.recipe, self.used = recipe, False
        self.scale = torch.ones(3)
        self.amax = torch.zeros(recipe.amax_history_len, 3)

    def forward(self, x):
        self.used = True
        self.amax = torch.roll(self.amax, 1, 0)
        self.amax[0] = x.detach().abs().max()
        self.scale = 448.0 / self.amax.max(0).values
        return super().forward(x)

    def get_extra_state(self):
        if not self.used:
            return torch.empty(0, dtype=torch.uint8)
        state = {"recipe": self.recipe, "scale_fwd": self.scale.clone(), "amax_history_fwd": self.amax.clone(),
                 "scale_bwd": self.scale.clone(), "amax_history_bwd": self.amax.clone(),
                 "extra_fp8_variables": {"num_gemms": 1, "fp8_checkpoint": True, "fp8_max_fwd": 448.0}}
        return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8)

    def set_extra_state(self, state):
        if state is None or state.numel() == 0:
            return
        if os.environ.get("NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE", "0") != "1":
            raise RuntimeError("Refusing to load pickled Transformer Engine extra state")
        state = pickle.loads(state.detach().cpu().numpy().tobytes())
        self.recipe, self.used = state["recipe"], True
        self.scale, self.amax = state["scale_fwd"].clone(), state["amax_history_fwd"].clone()
'''


def install_standin_te(monkeypatch) -> types.SimpleNamespace:
    """``transformer_engine.common.recipe`` and ``transformer_engine.pytorch`` as the stand-ins above."""
    made = {}
    for name, source in (("transformer_engine", ""), ("transformer_engine.common", ""),
                         ("transformer_engine.common.recipe", RECIPE_STANDIN),
                         ("transformer_engine.pytorch", MODULE_STANDIN)):
        module = types.ModuleType(name)
        monkeypatch.setitem(sys.modules, name, module)
        exec(compile(source, f"<{name} stand-in>", "exec"), module.__dict__)
        made[name.split(".")[-1]] = module
    return types.SimpleNamespace(recipe=made["recipe"], pytorch=made["pytorch"])


class Payload:
    """Pickles as ``function(*args)``: what a crafted pickle makes ``pickle.loads`` call."""

    def __init__(self, function, *args):
        self.function, self.args = function, args

    def __reduce__(self):
        return self.function, self.args


def te_shaped(recipe, **extra) -> dict:
    """A state dict shaped like TE 2.20's (``recipe``, scales, amax histories, ``extra_fp8_variables``)."""
    return {"recipe": recipe, "scale_fwd": torch.tensor([1.0, 2.0, 4.0]), "amax_history_fwd": torch.rand(16, 3),
            "scale_bwd": torch.ones(2), "amax_history_bwd": torch.zeros(16, 2),
            "extra_fp8_variables": {"num_gemms": 1, "fp8_checkpoint": True, "fp8_max_fwd": 448.0, **extra}}


def shell_payload(marker: Path):
    """``os.system('touch marker')`` when unpickled."""
    return Payload(os.system, f"touch {marker}")


def extra_state_region(folder: Path, key: str) -> tuple[Path, int, int]:
    """(file, offset, length) of state-dict entry ``key`` (e.g. ``model.0._extra_state``) in DCP's data files."""
    import torch.distributed.checkpoint as dcp

    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    for index, info in metadata.storage_data.items():
        if index.fqn == key:
            return folder / info.relative_path, info.offset, info.length
    raise KeyError(key)


def tamper_in_place(folder: Path, key: str, payload: bytes) -> None:
    """Overwrite the pickle saved for ``key`` with ``payload`` (padded to its length: pickle ignores what
    follows its STOP), leaving DCP's ``.metadata``, and so fp8lab's manifest digest, as they were."""
    import io

    path, offset, length = extra_state_region(folder, key)
    data = bytearray(path.read_bytes())
    saved = torch.load(io.BytesIO(bytes(data[offset:offset + length])), weights_only=True).numpy().tobytes()
    assert len(payload) <= len(saved), f"payload of {len(payload)} bytes, the saved pickle has {len(saved)}"
    at = data.find(saved, offset, offset + length)  # torch.save stores the tensor's bytes uncompressed
    assert at >= 0
    data[at:at + len(saved)] = payload + b"\0" * (len(saved) - len(payload))
    path.write_bytes(bytes(data))
