"""Training checkpoints that survive kill -9, spot interruptions and a change of world size.

One checkpoint is a folder ``step_00000120/``:

* model and optimizer state through ``torch.distributed.checkpoint`` (DCP), which writes each
  rank's shards in parallel and reshards on load, so DDP, FSDP2 and one process all read it.
  The model state includes the FP8 scaling state that modules keep in their state dict
  (Transformer Engine's amax history and scales live in each module's ``_extra_state``);
* ``trainer_rank{r}.pt`` per rank: the trainer's stateful entries (``train_state``: step, tokens,
  counters and this rank's RNG states, see fp8lab.train.components.TrainState; the scheduler; the
  data-loader position), the run's fingerprint and config.

* ``fp8lab-checkpoint.json``: fp8lab's manifest, the sha256 of DCP's ``.metadata`` (rank 0).

It is written into ``step_00000120.tmp/`` and renamed when every rank has finished, so a folder
without ``.tmp`` is complete; a crash mid-write leaves only a ``.tmp`` that is ignored (and
removed at the next start). Resuming takes the newest complete folder that loads.

Loading unpickles no code: ``trainer_rank{r}.pt`` is read with ``torch.load(weights_only=True)``
(numpy's RNG state allowlisted), DCP's bytes entries too, and DCP's ``.metadata`` (a pickle) is
read only when its digest matches the manifest, through an unpickler that knows DCP's metadata
classes and nothing else. A folder fp8lab did not write (no manifest, another digest) does not load.
The manifest is no signature (the tensors are not digested), so Transformer Engine's delayed-scaling
state, a pickle inside a tensor that TE's ``set_extra_state`` unpickles, is read first on its own and
decoded by fp8lab.train.te_state's allowlisting unpickler; TE gets bytes fp8lab pickled again from that
plain data, and a crafted one is refused, naming its file, before anything is loaded.
"""
from __future__ import annotations

import json
import os
import pickle
import random
import re
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import nn

from fp8lab.train import distributed as fdist
from fp8lab.train import te_state
from fp8lab.train.master_weights import MasterWeights
from fp8lab.train.fused_states import FusedStates
from fp8lab.records import ownership

_NAME = re.compile(r"^step_(\d{8})$")
TRAINER_FILE = "trainer_rank{rank}.pt"
MANIFEST = ownership.CHECKPOINT_MANIFEST
METADATA = ownership.CHECKPOINT_METADATA


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:08d}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of complete checkpoints, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _NAME.match(p.name)
        if m and p.is_dir() and (p / ".metadata").is_file() and (p / TRAINER_FILE.format(rank=0)).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found, reverse=True)


def rng_state(device: torch.device) -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


@contextmanager
def _quiet_single_process(env: fdist.DistEnv) -> Iterator[None]:
    """DCP warns that it 'assumes a single process' when no process group exists: that is the intent."""
    with warnings.catch_warnings():
        if not env.distributed:
            warnings.filterwarnings("ignore", message=".*assuming the intent is to", category=UserWarning)
        yield


def _is_master(optimizer) -> bool:
    return isinstance(optimizer, (MasterWeights, FusedStates))


def _model_and_optim_state(model: nn.Module, optimizer: torch.optim.Optimizer):
    """Model + optimizer state dicts. With fp32 master weights (--param-dtype bf16) the model part
    holds the masters where the parameters go, so the layout and precision are an fp32 run's."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if _is_master(optimizer):
        return optimizer.model_state_dict(get_model_state_dict(model)), optimizer.state_dict()
    return get_state_dict(model, optimizer)


def save(root: str | Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
         trainer_state: dict[str, Any], env: fdist.DistEnv, keep: int = 2) -> Path:
    """Write checkpoint ``step`` atomically (every rank calls this) and keep the newest ``keep``."""
    import torch.distributed.checkpoint as dcp

    root = Path(root)
    final = step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    if env.is_main:
        # unmarked: step folders with fp8lab's manifest are its (fp8lab.records.ownership)
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists() or tmp.is_symlink():
            _remove_own(tmp)
    fdist.barrier(env)
    tmp.mkdir(parents=True, exist_ok=True)  # each node's local disk needs the folder (multi-node jobs)
    if env.local_rank == 0 and not (tmp / MANIFEST).exists():
        # first, so a save cut short leaves a folder that says it is fp8lab's (fp8lab.records.ownership.own_checkpoint)
        _write_manifest(tmp, step, pending=True)
    fdist.barrier(env)
    model_sd, optim_sd = _model_and_optim_state(model, optimizer)
    with _quiet_single_process(env):
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp))
    torch.save(trainer_state, tmp / TRAINER_FILE.format(rank=env.rank))
    if env.is_main:  # DCP's coordinator (rank 0) wrote .metadata
        _write_manifest(tmp, step)
    fdist.barrier(env)
    # rank 0 renames; then, on a node whose disk rank 0 does not share, that node's first rank
    if env.is_main:
        _promote(tmp, final)
    fdist.barrier(env)
    if not env.is_main and env.local_rank == 0 and tmp.exists():
        _promote(tmp, final)
    fdist.barrier(env)
    if env.is_main or env.local_rank == 0:
        # by folder name: on a node that does not share rank 0's disk the folders hold shards but no .metadata
        # only folders fp8lab wrote (its manifest inside): a user's own step_NNNNNNNN folder is never deleted
        named = sorted(((int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name))
                        and ownership.own_checkpoint(p)), reverse=True)
        for _, old in named[keep:]:
            _delete(old, ignore_errors=True)
    return final


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_manifest(folder: Path, step: int, pending: bool = False) -> None:
    manifest = {"written_by": "fp8lab", "step": step,
                "sha256": {METADATA: None if pending else _sha256(folder / METADATA)}}
    ownership.write_file(folder / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def verify(path: str | Path) -> None:
    """ValueError unless ``path`` holds fp8lab's manifest and DCP metadata matching its digest."""
    path = Path(path)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
        want = manifest["sha256"][METADATA] if manifest.get("written_by") == "fp8lab" else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        want = None
    if want is None:
        raise ValueError(f"not written by fp8lab (no valid {MANIFEST}); nothing in it was read")
    if _sha256(path / METADATA) != want:
        raise ValueError(f"its {METADATA} is not the one fp8lab wrote (sha256 differs from {MANIFEST}); nothing in it "
                         "was read")


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's metadata classes, torch sizes, dtypes and layouts, paths: nothing that can run code."""

    _ALLOWED = {"torch.distributed.checkpoint.filesystem": {"_StorageInfo"}, "torch.serialization": {"_get_layout"},
                "pathlib": {"Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
                "collections": {"OrderedDict"}, "torch": {"Size"}}

    def find_class(self, module: str, name: str):
        if module == "torch.distributed.checkpoint.metadata":
            obj = super().find_class(module, name)
            if isinstance(obj, type):
                return obj
        elif module == "torch" and isinstance(getattr(torch, name, None),
                                              (torch.dtype, torch.layout, torch.memory_format)):
            return getattr(torch, name)
        elif name in self._ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{METADATA} refers to {module}.{name}, which a DCP checkpoint never holds")


def _reader(path: Path):
    """DCP's file reader with the metadata read by :class:`_MetadataUnpickler`, once: every ``dcp.load`` through
    this reader gets that one object (DCP's load only reads it), so the file is parsed once per :func:`load`."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(dcp.FileSystemReader):
        _parsed = None

        def read_metadata(self, *args: Any, **kwargs: Any):
            if self._parsed is None:
                with open(Path(self.path) / METADATA, "rb") as fh:
                    self._parsed = _MetadataUnpickler(fh).load()
                if getattr(self._parsed, "storage_meta", None) is None:
                    self._parsed.storage_meta = StorageMeta()
            self._parsed.storage_meta.load_id = self.load_id
            return self._parsed

    return SafeReader(str(path))


def _planner():
    """DCP's default load planner reading its bytes entries (e.g. AdamW's settings) with weights_only."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    from torch.distributed.checkpoint._traverse import set_element

    class WeightsOnlyPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value) -> None:  # DefaultLoadPlanner's, with weights_only=True
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return WeightsOnlyPlanner()


@contextmanager
def _weights_only_trainer_state() -> Iterator[None]:
    """torch.load(weights_only=True) with numpy's RNG state (an uint32 array) allowlisted."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    with torch.serialization.safe_globals([_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]):
        yield


def _promote(tmp: Path, final: Path) -> None:
    if final.exists() or final.is_symlink():  # re-saving the same step after a resume
        _remove_own(final)
    tmp.rename(final)


def _remove_own(path: Path) -> None:
    """Delete a checkpoint folder fp8lab wrote; OSError (the save fails, nothing deleted) for any other."""
    if not ownership.own_checkpoint(path):
        raise FileExistsError(17, f"{path.name} exists and is not a checkpoint fp8lab wrote; it is kept")
    _delete(path)


def _delete(path: Path, ignore_errors: bool = False) -> None:
    """Delete a checkpoint folder of fp8lab's (flat: ownership.own_checkpoint) so that a kill at any moment leaves
    one that is no longer complete (its metadata goes first) and still says it is fp8lab's (its manifest goes
    last): a restart neither loads it nor refuses the folder as another job's."""
    try:
        for q in sorted(path.iterdir(), key=lambda q: (q.name != METADATA, q.name == MANIFEST)):
            q.unlink(missing_ok=True)
        path.rmdir()
    except OSError:
        if not ignore_errors:
            raise


def load(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer, env: fdist.DistEnv) -> dict[str, Any]:
    """Restore model + optimizer in place and return this rank's trainer state (the caller restores its RNG)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict, set_state_dict

    path = Path(path)
    verify(path)
    reader = _reader(path)
    reader.read_metadata()  # through fp8lab's unpickler, before DCP reads it
    extra = _extra_states(path, reader, model, get_model_state_dict(model), env)  # checked before anything changes
    model_sd, optim_sd = _model_and_optim_state(model, optimizer)
    state = {"model": {k: v for k, v in model_sd.items() if k not in extra}, "optim": optim_sd}
    with _quiet_single_process(env):  # the masters and AdamW states are filled in place
        dcp.load(state, storage_reader=reader, planner=_planner())
    state["model"].update(extra)
    with _te_pickled_state_allowed():
        if _is_master(optimizer):
            set_model_state_dict(model, state["model"])  # non-parameter state (FP8 scaling) and bf16(master)
            optimizer.load_state_dict(state["optim"])
        else:
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    mine = path / TRAINER_FILE.format(rank=env.rank)
    if not mine.is_file():  # resumed with more ranks than saved: rank 0's counters and RNG
        mine = path / TRAINER_FILE.format(rank=0)
    with _weights_only_trainer_state():
        return torch.load(mine, map_location="cpu", weights_only=True)


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    """Rank 0's trainer state of checkpoint ``path`` (its fingerprint, config and step) without loading any weights:
    what a re-run is compared with before it tokenizes or builds anything. Checked as :func:`load` checks it (fp8lab's
    manifest, then ``torch.load(weights_only=True)``); ValueError or torch's error when it does not read."""
    path = Path(path)
    verify(path)
    with _weights_only_trainer_state():
        return torch.load(path / TRAINER_FILE.format(rank=0), map_location="cpu", weights_only=True)


def _extra_states(path: Path, reader: Any, model: nn.Module, model_sd: dict[str, Any],
                  env: fdist.DistEnv) -> dict[str, Any]:
    """The model's tensor ``_extra_state`` entries read from checkpoint ``path``, Transformer Engine's
    decoded and pickled again by fp8lab (fp8lab.train.te_state); RefusedState naming the file if one is not
    TE's FP8 state. Read on their own, into new tensors: a refusal leaves the model as it was.

    TE's extra state is a uint8 tensor whose length depends on what it holds (a fresh model has a
    0-byte one until its first FP8 forward), so each is read at the size the checkpoint saved.
    """
    import torch.distributed.checkpoint as dcp

    keys = [k for k, v in model_sd.items() if k.endswith("_extra_state") and isinstance(v, torch.Tensor)]
    if not keys:
        return {}
    metadata = reader.read_metadata()
    wanted = {"model": {k: _like_saved(model_sd[k], metadata.state_dict_metadata.get(f"model.{k}")) for k in keys}}
    with _quiet_single_process(env):
        dcp.load(wanted, storage_reader=reader, planner=_planner())
    modules = te_state.owners(model)
    out = dict(wanted["model"])
    for key, value in out.items():
        name = key[: -len("_extra_state")].rstrip(".")
        if not te_state.is_te(modules.get(name)):
            continue  # another module's: it reads its own state (TE's opt-in does not concern it)
        try:
            out[key] = te_state.reencoded(value)
        except te_state.RefusedState as exc:
            raise te_state.RefusedState(
                f"{path.name}/{_file_of(metadata, f'model.{key}')}: refused the Transformer Engine FP8 state of "
                f"{name or 'the model'!r} ({exc.reason}); nothing loaded or deleted: delete {path.name} if you did not "
                "write it"
            ) from None
    return out


def _like_saved(value: torch.Tensor, meta: Any) -> torch.Tensor:
    """A new tensor to read ``value``'s entry into, of the size and dtype the checkpoint saved."""
    size = getattr(meta, "size", None)
    if size is None:
        return torch.empty_like(value)
    return torch.empty(tuple(size), dtype=meta.properties.dtype, device=value.device)


def _file_of(metadata: Any, fqn: str) -> str:
    """The DCP data file that holds ``fqn`` (e.g. ``__0_0.distcp``)."""
    for index, info in (getattr(metadata, "storage_data", None) or {}).items():
        if getattr(index, "fqn", None) == fqn:
            return str(getattr(info, "relative_path", "?"))
    return METADATA


_TE_UNSAFE_PICKLE = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"


@contextmanager
def _te_pickled_state_allowed() -> Iterator[None]:
    """Let Transformer Engine read its delayed-scaling state back, for this load only.

    TE stores DelayedScaling's amax history and scales as a pickle in ``_extra_state`` and, since
    unpickling can run code, refuses to load it unless ``NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE=1``.
    What TE unpickles here is no checkpoint's bytes but fp8lab's: :func:`_extra_states` decoded the
    checkpoint's with fp8lab.train.te_state and pickled the plain data again. The opt-in is given around
    that load only and the variable restored afterwards.
    """
    old = os.environ.get(_TE_UNSAFE_PICKLE)
    os.environ[_TE_UNSAFE_PICKLE] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(_TE_UNSAFE_PICKLE, None)
        else:
            os.environ[_TE_UNSAFE_PICKLE] = old


def remove_unfinished(root: str | Path, step: int) -> None:
    """After a failed save: its ``step_NNNNNNNN.tmp`` goes (fp8lab's, by its manifest), freeing the space it took."""
    tmp = step_dir(Path(root), step).with_name(f"step_{step:08d}.tmp")
    if ownership.own_checkpoint(tmp):
        _delete(tmp, ignore_errors=True)


def foreign_steps(root: str | Path, last_step: int) -> list[str]:
    """``step_NNNNNNNN`` folders in ``root`` that fp8lab did not write and that a run of ``last_step`` steps might
    save over (a step <= ``last_step``: periodic, final or on SIGTERM): such a save would fail, so the run is refused
    before it trains."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir() if (m := _NAME.match(p.name)) and int(m.group(1)) <= last_step
                  and not ownership.own_checkpoint(p))


def remove_partial(root: str | Path) -> list[Path]:
    """Delete ``*.tmp`` folders left by a crash mid-save (rank 0, before training starts)."""
    root = Path(root)
    removed = []
    if root.is_dir():
        for p in root.glob("step_*.tmp"):
            if ownership.own_checkpoint(p):  # only what a checkpoint write leaves
                _delete(p, ignore_errors=True)
                removed.append(p)
    return removed
