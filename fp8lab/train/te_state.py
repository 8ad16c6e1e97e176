"""Transformer Engine's FP8 scaling state from a checkpoint, read without unpickling code.

What TE writes (2.20, ``TransformerEngineBaseModule.get_extra_state`` in
``transformer_engine/pytorch/module/base.py``): under DelayedScaling a module's ``_extra_state`` is
``pickle.dumps`` of one dict in a uint8 tensor::

    {"recipe": DelayedScaling(...),                      # a dataclass of transformer_engine.common.recipe
     "scale_fwd": Tensor, "amax_history_fwd": Tensor,    # CPU float32 copies
     "scale_bwd": Tensor, "amax_history_bwd": Tensor,
     "extra_fp8_variables": {...}}                       # fp8_meta's bool/int/float/str/tuple/list values

(stateless recipes write an empty tensor). ``set_extra_state`` gives those bytes to ``pickle.loads``,
allowed only with ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``: a crafted checkpoint could run code there.

So fp8lab decodes them first with :class:`_Unpickler`, whose globals are only the few such a pickle
needs, each replaced by a stand-in: torch's tensor rebuild (its storage read with
``torch.load(weights_only=True)``, where torch's own reads it with ``weights_only=False``),
``OrderedDict`` (a tensor's hooks, always empty), torch's dtypes, ``torch.Size``, ``torch.device``,
sets, and TE's recipe types as fresh records, so the pickle can touch nothing shared. Anything else
refuses (:class:`RefusedState`). The decoded data is checked to be data only, rebuilt with TE's real
classes the way pickle builds them, and pickled again by fp8lab: TE then unpickles bytes fp8lab wrote
from plain data, never the checkpoint's bytes. (Checking the bytes and then letting TE unpickle them
would leave torch's own storage loader, ``weights_only=False``, to read the nested bytes, and TE's
classes exposed to BUILD; decoding and re-encoding leaves neither.)
"""
from __future__ import annotations

import dataclasses
import importlib
import io
import pickle
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

from fp8lab.train.distributed import unwrap

RECIPE_MODULE = "transformer_engine.common.recipe"
# TE's recipe types a pickled extra state refers to: the recipes that are dataclasses, their parameter
# dataclasses, and the Format enum with its value type. CustomRecipe (it holds a factory) is not here.
RECIPE_DATACLASSES = ("DelayedScaling", "Float8CurrentScaling", "Float8BlockScaling", "MXFP8BlockScaling",
                      "NVFP4BlockScaling", "QParams", "MMParams")
_FORMAT, _FORMAT_VALUE = "Format", "_FormatHelper"
_WRAPPERS = {"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"}  # not in state-dict names


class RefusedState(ValueError):
    """A ``_extra_state`` that is not Transformer Engine's FP8 state: ``reason`` says what it holds."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class _Record:
    """What the pickle built from one of TE's recipe types: its name, arguments and attributes."""

    type_name = ""

    def __new__(cls, *args):
        record = object.__new__(cls)
        record.args, record.state = args, None
        return record

    def __init__(self, *args):  # called by REDUCE (the Format enum's lookup by value)
        pass

    def __setstate__(self, state):  # BUILD: the dataclass's attributes
        self.state = state


def _tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None) -> torch.Tensor:
    """torch._utils._rebuild_tensor_v2 for a plain tensor: no gradient, hooks or Python attributes."""
    ok = (isinstance(storage, torch.storage.TypedStorage) and type(offset) is int and _ints(size) and _ints(stride)
          and requires_grad is False and not hooks and not metadata)
    if not ok:
        raise RefusedState("a tensor that is not a plain one (gradient, hooks, attributes or odd sizes)")
    try:
        return torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict()).clone()
    except RuntimeError as exc:
        raise RefusedState(f"a tensor whose sizes do not fit its data ({exc})") from None


def _ints(values) -> bool:
    return type(values) is tuple and all(type(v) is int for v in values)


def _storage(data) -> torch.storage.TypedStorage:
    """torch.storage._load_from_bytes with weights_only=True (torch's own uses weights_only=False)."""
    if type(data) is not bytes:
        raise RefusedState("a tensor storage that is not bytes")
    try:
        storage = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = str(exc).splitlines() or [""]
        why = next((line.strip() for line in lines[1:] if "global" in line.lower()), lines[0])  # the global it names
        raise RefusedState(f"a tensor storage that torch.load(weights_only=True) refuses ({why})") from None
    if not isinstance(storage, torch.storage.TypedStorage):
        raise RefusedState(f"a tensor storage holding a {type(storage).__name__}")
    return storage


# the globals a pickle of such data may name, each with what it builds
_FUNCTIONS = {("torch._utils", "_rebuild_tensor_v2"): _tensor, ("torch.storage", "_load_from_bytes"): _storage,
              ("collections", "OrderedDict"): OrderedDict, ("torch", "Size"): torch.Size,
              ("torch", "device"): torch.device,
              ("builtins", "set"): set, ("builtins", "frozenset"): frozenset}
_DATA = (bool, int, float, str, bytes, torch.dtype, torch.device)


class _Unpickler(pickle.Unpickler):
    """Each allowed global is a fresh stand-in, so a BUILD on it changes nothing shared."""

    def find_class(self, module: str, name: str):
        function = _FUNCTIONS.get((module, name))
        if function is not None:
            return lambda *args: function(*args)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)  # torch.float32 and the like: immutable
        if module == RECIPE_MODULE and name in (*RECIPE_DATACLASSES, _FORMAT, _FORMAT_VALUE):
            return type(name, (_Record,), {"type_name": name})
        raise RefusedState(f"it names {module}.{name}, which TE's state never holds")

    def persistent_load(self, pid):
        raise RefusedState("it holds a persistent id, which TE's state never does")


def decode(data: bytes) -> Any:
    """The state TE pickled in ``data``, rebuilt from data only (TE's recipe classes imported); RefusedState else."""
    try:
        return _plain(_Unpickler(io.BytesIO(data)).load())
    except RefusedState:
        raise
    except Exception as exc:  # a malformed pickle, or a stand-in called the wrong way
        first = (str(exc).splitlines() or [""])[0][:80]
        raise RefusedState(f"not a pickle of data: {type(exc).__name__}: {first}") from None


def _plain(obj: Any) -> Any:
    """``obj`` with TE's records made into TE's objects; RefusedState for anything that is not data."""
    if obj is None or type(obj) in _DATA:
        return obj
    if type(obj) is torch.Tensor:  # a copy: a BUILD on the decoded tensor can have set its grad or hooks
        return obj.detach().clone()
    if type(obj) in (list, tuple, set, frozenset, torch.Size):
        return type(obj)(_plain(v) for v in obj)
    if type(obj) in (dict, OrderedDict):
        if not all(type(k) in (str, int) for k in obj):
            raise RefusedState("a dict whose keys are not names")
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, _Record):
        return _rebuilt(obj)
    raise RefusedState(f"a {type(obj).__name__}, which is not data")


def _rebuilt(record: _Record) -> Any:
    """The TE object the pickle described, made the way pickle makes it (no TE code runs but Format's lookup)."""
    cls = getattr(importlib.import_module(RECIPE_MODULE), record.type_name)
    args = _plain(record.args)
    if record.type_name == _FORMAT_VALUE and record.state is None and len(args) == 2 \
            and all(type(a) in (int, float) for a in args):
        return cls(*args)
    if record.type_name == _FORMAT and record.state is None and len(args) == 1:
        try:
            return cls(args[0])
        except ValueError:
            raise RefusedState(f"a {RECIPE_MODULE}.Format that does not exist ({args[0]})") from None
    if record.type_name in RECIPE_DATACLASSES and not args and type(record.state) is dict:
        known = {f.name for f in dataclasses.fields(cls)} | {"_cached_repr"}
        unknown = sorted(set(record.state) - known, key=str)
        if unknown:
            raise (RefusedState(f"a {record.type_name} with attributes this Transformer Engine does not have "
                                f"({unknown})"))
        obj = cls.__new__(cls)
        obj.__dict__.update(_plain(record.state))
        return obj
    raise RefusedState(f"a {RECIPE_MODULE}.{record.type_name} built in a way pickle never builds it")


def reencoded(value: Any) -> torch.Tensor:
    """TE's extra-state tensor ``value`` decoded (:func:`decode`) and pickled again by fp8lab."""
    if not (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1):
        what = (f"a {value.dtype} tensor of {tuple(value.shape)}" if isinstance(value, torch.Tensor)
                else f"a {type(value).__name__}")
        raise RefusedState(f"{what}, where TE stores a 1-D uint8 tensor")
    if value.numel() == 0:  # a stateless recipe's, or before the first FP8 step
        return value
    state = decode(value.detach().cpu().numpy().tobytes())
    if type(state) is not dict:
        raise RefusedState(f"a {type(state).__name__}, where TE pickles a dict")
    return torch.frombuffer(bytearray(pickle.dumps(state)), dtype=torch.uint8).to(value.device)


def is_te(module: nn.Module | None) -> bool:
    """Whether TE reads this module's extra state (a class of transformer_engine in its MRO); unknown: True."""
    if module is None:
        return True
    return any(str(getattr(c, "__module__", "")).split(".")[0] == "transformer_engine" for c in type(module).__mro__)


def owners(model: nn.Module) -> dict[str, nn.Module]:
    """Modules by the name their state-dict keys use (without DDP's ``module.`` and wrapper parts)."""
    return {".".join(p for p in name.split(".") if p not in _WRAPPERS): m for name, m in unwrap(model).named_modules()}
