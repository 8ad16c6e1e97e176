"""fp8lab writes, replaces and deletes only what it wrote itself.

Each folder fp8lab writes into is one of four kinds, each with the names fp8lab puts there:

* ``run`` (``--output-dir``): config.json, metrics.jsonl, summary.json, loss.png, profile.json, the
  run lock, and the default ``checkpoints/``, ``model/`` and ``data/`` folders (and ``te-debug/``);
* ``tokens`` (the token cache ``<output-dir>/data``, ``fp8lab prepare-data OUT_DIR``): manifest.json,
  tokenizer.json, ``train_NNNNN.bin`` / ``val_NNNNN.bin``;
* ``checkpoints`` (``--checkpoint-dir``): ``step_NNNNNNNN/`` folders;
* ``model`` (``--model-dir``): the Hugging Face export.

A folder fp8lab creates gets a marker, :data:`MARKER`: ``{"written_by": "fp8lab", "kind": ..., "files":
{name: {"bytes": n, "sha256": ...}}}``, the files fp8lab wrote there with their digests (:func:`record`).
A file is fp8lab's only when the marker names it and its bytes still have that digest (for an
append-only log, :data:`APPEND`, its first ``bytes`` bytes; a file fp8lab created with ``O_EXCL`` and is
still writing has ``"sha256": null``); a sub-folder of a run is fp8lab's by its name (``checkpoints/``,
``model/``, ``data/``, each checked as its own kind when used); a checkpoint folder's ``step_NNNNNNNN/``
is fp8lab's when it holds fp8lab's checkpoint manifest. Anything else (a symlink, a file the marker
does not name or whose bytes changed, a folder without the marker that is not empty) is the user's:
fp8lab refuses to write there, asking for a new folder, and never deletes or overwrites it.

fp8lab creates files only as new files (``O_CREAT | O_EXCL | O_NOFOLLOW``: never through a link, never
over an existing file, :func:`new_file`) or writes a fresh temporary file it created and renames it over
the target (:func:`write_file`); its temporary files are named ``.fp8lab-tmp-*`` and are never read
(one left by a crash is ignored).

:func:`check_run_folders` (the trainer's set-up, before any folder is created) also refuses folders
that overlap where one run would clobber another's files: two write folders that are the same, a
write folder inside one whose contents fp8lab replaces (checkpoints, model, tokens), a write folder
in or around the ``--data``/``--model`` the run reads, and the repository checkout's own folders.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import tempfile
import uuid
from pathlib import Path
from typing import Any

from fp8lab.records.data_format import tokenized_here
from fp8lab.core.paths import DATA_DIR, REPO_ROOT

MARKER = ".fp8lab-owner.json"
LOCK = ".fp8lab-lock"  # fp8lab.records.runlock
# fp8lab's own temporary files (fresh names, O_EXCL): never read, a crash's leftover ignored
TMP_PREFIX = ".fp8lab-tmp-"
APPEND = ("metrics.jsonl",)  # append-only: the marker's digest covers the file's first bytes
TE_DEBUG_DIR = "te-debug"  # in a run folder: nvdlfw-inspect's own log (fp8lab.fp8.te_debug)
# a run folder's sub-folders: fp8lab's by name, each checked as its own kind when used
MERGED_MODEL = "merged"  # a LoRA run's merged model: a model folder of its own inside the model folder
SUBFOLDERS = {"run": ("checkpoints", "model", "data", TE_DEBUG_DIR), "model": (MERGED_MODEL,)}
_STEP = re.compile(r"step_\d{8}")
_STEP_TMP = re.compile(r"step_\d{8}\.tmp")
CHECKPOINT_MANIFEST = "fp8lab-checkpoint.json"  # fp8lab.train.checkpoint's manifest in each checkpoint folder
CHECKPOINT_METADATA = ".metadata"  # DCP's metadata file
# what fp8lab.train.checkpoint (and DCP's file-system writer) put into a checkpoint folder
_CHECKPOINT_FILES = re.compile(r"(__\d+_\d+\.distcp|trainer_rank\d+\.pt|(__\d+)?" + re.escape(CHECKPOINT_METADATA)
                               + r"(\.tmp)?|" + re.escape(CHECKPOINT_MANIFEST) + "|" + re.escape(TMP_PREFIX) + r".*)")
KINDS = ("run", "tokens", "checkpoints", "model")
# the checkout's own parts (when fp8lab runs from a clone): never a place for run outputs
CHECKOUT_PARTS = ("fp8lab", "data", "tests", "notebooks", "docs", "benchmarks", "scripts", ".git", ".venv")


# ------------------------------------------------------------------------------------ creating files

def new_file(path: str | Path):
    """A new file opened for binary writing: created by this call (``O_EXCL``), never through a link
    (``O_NOFOLLOW``); FileExistsError when the name is taken."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    return os.fdopen(fd, "wb")


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _umask()  # this process's, read once (os.umask can only be read by setting it)


def write_file(path: str | Path, data: bytes | str) -> None:
    """``path`` written whole: into a fresh temporary file fp8lab creates beside it, then renamed over it
    (a link at ``path`` is replaced, never written through; on any error the temporary file goes and
    ``path`` stays as it was). A device, FIFO, socket or folder at ``path`` is never replaced (OSError)."""
    path = Path(path)
    refuse_special(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX)
    try:
        os.fchmod(fd, 0o666 & ~UMASK)  # as open() would create it (mkstemp's files are private)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        os.replace(name, path)
    except BaseException as exc:
        try:
            os.unlink(name)
        except OSError:
            pass
        if isinstance(exc, OSError) and not exc.filename:  # a full disk, a size limit: the error names the file
            raise OSError(exc.errno, exc.strerror, str(path)) from None
        raise


def refuse_special(path: str | Path) -> None:
    """OSError (EEXIST) when ``path`` exists as anything but a regular file or a symlink: a device node (``/dev/null``
    for root), a FIFO, a socket or a folder is no file fp8lab may replace."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        kind = "a folder" if stat.S_ISDIR(mode) else "a device, FIFO or socket"
        raise FileExistsError(errno.EEXIST, f"{Path(path).name} is {kind}, not a file fp8lab may replace; it is kept")


def sha256_of(path: Path, limit: int | None = None) -> str:
    """SHA-256 of a file's bytes (its first ``limit`` bytes when given)."""
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as fh:
        while left is None or left > 0:
            block = fh.read(1 << 20 if left is None else min(1 << 20, left))
            if not block:
                break
            h.update(block)
            left = None if left is None else left - len(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------ the marker

def _marker(folder: Path) -> dict[str, Any] | None:
    p = Path(folder) / MARKER
    if p.is_symlink() or not p.is_file():
        return None
    try:
        m = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or m.get("written_by") != "fp8lab" or m.get("kind") not in KINDS:
        return None
    if not isinstance(m.get("files"), dict):
        m["files"] = {}
    return m


def marker_kind(folder: Path) -> str | None:
    """The kind fp8lab marked ``folder`` with, or None (no marker, or not fp8lab's)."""
    m = _marker(folder)
    return m["kind"] if m else None


def _write_marker(folder: Path, m: dict[str, Any]) -> None:
    write_file(Path(folder) / MARKER, json.dumps(m, indent=1, sort_keys=True) + "\n")


def record(folder: str | Path, *names: str, pending: bool = False, digest: tuple[int, str] | None = None) -> None:
    """Note in ``folder``'s marker that fp8lab wrote ``names`` there, with their digests (now), or
    ``pending`` (created with O_EXCL, still being written), or the given ``digest`` (bytes, sha256) of
    the first bytes of an append-only file; a name that no longer exists is dropped."""
    folder = Path(folder)
    m = _marker(folder)
    if m is None:
        raise ValueError(f"{folder.name!r} is not an fp8lab folder (no {MARKER})")
    for name in names:
        p = folder / name
        if not p.is_file() or p.is_symlink():
            m["files"].pop(name, None)
        elif pending:
            m["files"][name] = {"bytes": None, "sha256": None}
        elif digest is not None:
            m["files"][name] = {"bytes": digest[0], "sha256": digest[1]}
        else:
            m["files"][name] = {"bytes": p.stat().st_size, "sha256": sha256_of(p)}
    _write_marker(folder, m)


def _owned_file(folder: Path, name: str, m: dict[str, Any]) -> bool:
    """``name`` is a regular file the marker names, with the bytes fp8lab wrote."""
    entry = m["files"].get(name)
    p = folder / name
    if not isinstance(entry, dict) or p.is_symlink() or not p.is_file():
        return False
    st = p.stat()
    if st.st_nlink != 1:  # a hard link: another name shares the bytes
        return False
    n, digest = entry.get("bytes"), entry.get("sha256")
    if n is None and digest is None:  # created with O_EXCL, not finished (a crash mid-write)
        return True
    if not isinstance(n, int) or not isinstance(digest, str):
        return False
    if name in APPEND:
        return st.st_size >= n and sha256_of(p, n) == digest
    return st.st_size == n and sha256_of(p) == digest


def own_checkpoint(path: Path) -> bool:
    """``path`` is a checkpoint folder fp8lab wrote, holding only the files a checkpoint has and fp8lab's
    manifest: a ``step_NNNNNNNN``, an unfinished ``step_NNNNNNNN.tmp`` (the manifest is written first, its
    digest when the save completes), or a node's share of a checkpoint on a disk rank 0 does not write (shards and
    the node's own manifest, no metadata). Shards without the manifest are another job's. A step folder that is
    empty or holds only fp8lab's temporary files (a save killed before its manifest landed, a deletion killed after
    its last file) is fp8lab's too: removing it loses nothing."""
    if path.is_symlink() or not path.is_dir() or not (_STEP.fullmatch(path.name) or _STEP_TMP.fullmatch(path.name)):
        return False
    if not _checkpoint_shaped(path):
        return False
    if all(q.name.startswith(TMP_PREFIX) for q in path.iterdir()):
        # a save killed before its manifest landed, or a deletion after its last file: nothing of anyone's to lose
        return True
    m = _json_file(path / CHECKPOINT_MANIFEST)
    return m.get("written_by") == "fp8lab"  # its digests are checked when it loads (fp8lab.train.checkpoint.verify)


def _json_file(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def _checkpoint_shaped(path: Path) -> bool:
    """A folder holding only the (regular) files a checkpoint has."""
    return all(_CHECKPOINT_FILES.fullmatch(q.name) and not q.is_symlink() and q.is_file() for q in path.iterdir())


def _owned(folder: Path, kind: str, name: str, m: dict[str, Any] | None) -> bool:
    p = folder / name
    if name.startswith(TMP_PREFIX):
        return True  # never read or written through; left by a crash
    if name == LOCK:  # fp8lab.records.runlock's, in a run, checkpoint or token folder
        return (kind in ("run", "checkpoints", "tokens")
                and not p.is_symlink() and p.is_file() and p.stat().st_nlink == 1)
    if kind == "checkpoints":  # a checkpoint without fp8lab's manifest is no reason to refuse: it never loads or goes
        return own_checkpoint(p) or (bool(_STEP.fullmatch(name)) and not p.is_symlink() and p.is_dir()
                                     and _checkpoint_shaped(p))
    if name in SUBFOLDERS.get(kind, ()):
        return p.is_dir() and not p.is_symlink()
    return m is not None and _owned_file(folder, name, m)


def foreign(folder: str | Path, kind: str) -> list[str]:
    """Entries of ``folder`` fp8lab did not write as a folder of ``kind`` (empty: fp8lab may write there)."""
    folder = Path(folder)
    if folder.is_symlink() and folder.exists() and not folder.is_dir():
        return [folder.name]
    if not folder.is_dir():
        return []
    names = sorted(p.name for p in folder.iterdir() if p.name != MARKER)
    m = _marker(folder)
    if m is not None and m["kind"] != kind:
        return [f"{MARKER} (an fp8lab {m['kind']} folder, not a {kind} folder)"]
    return [n for n in names if not _owned(folder, kind, n, m)]


def refuse_foreign(option: str, folder: str | Path, kind: str) -> None:
    """ValueError naming ``option`` when ``folder`` holds files fp8lab did not write."""
    m = _marker(Path(folder)) if Path(folder).is_dir() else None
    if m is not None and m["kind"] != kind:  # fp8lab's own folder, of another kind: say so, not "files not ours"
        raise ValueError(f"{option}={str(folder)!r} is an fp8lab {m['kind']} folder, not a {kind} folder; fp8lab "
                         f"never mixes them; allowed: a new or empty folder, or an fp8lab {kind} folder")
    bad = foreign(folder, kind)
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ValueError(f"{option}={str(folder)!r} holds files fp8lab did not write ({shown}); fp8lab never "
                         f"overwrites or deletes them; allowed: a new or empty folder, or one fp8lab wrote")


def claim(folder: str | Path, kind: str, run: str | None = None) -> Path:
    """Create ``folder`` if needed and mark it as fp8lab's (after :func:`refuse_foreign` said it may). A run folder's
    marker gets the run's id (:func:`run_id`); ``run``: that id, noted in a model folder as the run it holds."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    old = _marker(folder)
    m = dict(old or {"written_by": "fp8lab", "kind": kind, "files": {}})
    if kind == "run" and not m.get("run_id"):
        m["run_id"] = uuid.uuid4().hex
    elif run:
        m["run_id"] = run
    if m != old:
        _write_marker(folder, m)
    return folder


def run_id(folder: str | Path) -> str | None:
    """The id of the run whose folder (or whose exported model folder) ``folder`` is, or None (none noted)."""
    m = _marker(Path(folder))
    v = m.get("run_id") if m else None
    return v if isinstance(v, str) else None


def remove_own(folder: str | Path, kind: str) -> None:
    """Delete the files of ``folder`` that fp8lab wrote (named in its marker, bytes unchanged), nothing else."""
    folder = Path(folder)
    m = _marker(folder)
    if m is None or m["kind"] != kind:
        return
    gone = [n for n in list(m["files"]) if _owned_file(folder, n, m)]
    for n in gone:
        (folder / n).unlink()
    record(folder, *gone)  # drops them from the marker


# ------------------------------------------------------------------------------------ a run's folders

def _inside(a: Path, b: Path) -> bool:
    """``a`` is ``b`` or inside it."""
    return a == b or b in a.parents


def _checkout_parts() -> list[Path]:
    parts = [REPO_ROOT / n for n in CHECKOUT_PARTS] if (REPO_ROOT / "pyproject.toml").is_file() else []
    return [p.resolve() for p in parts + [DATA_DIR] if p.exists()]


def check_run_folders(c, paths, source: str | None, *, model_folder: str | None) -> None:
    """Refuse (ValueError, one line naming the options) folders of a run that overlap, reach into the
    checkout, or hold files fp8lab did not write (see the module doc). Writes nothing. ``model_folder``:
    ``--model`` where it names a local folder of the user's (``fp8lab.model.user``), else None."""
    tokenized = tokenized_here(source)
    writes = [("--output-dir", paths.output_dir, "run")]
    if c.checkpoint_every >= 0 or c.resume:
        writes.append(("--checkpoint-dir", paths.checkpoint_dir, "checkpoints"))
    if c.save_model:
        writes.append(("--model-dir", paths.model_dir, "model"))
    if tokenized:
        writes.append(("--output-dir (its token cache data/)", paths.data_cache, "tokens"))
    reads = [("--data", source)] if source is not None and not str(source).startswith("hf:") else []
    if model_folder is not None:
        reads.append(("--model", model_folder))
    resolved = [(o, Path(p).resolve(), k) for o, p, k in writes]
    _check_overlaps(resolved, [(o, Path(p).resolve()) for o, p in reads])
    for (option, _, kind), (_, shown, _) in zip(resolved, writes):
        refuse_foreign(option, shown, kind)
    holder = run_id(paths.model_dir) if c.save_model else None
    if holder is not None and holder != run_id(paths.output_dir):
        raise ValueError(f"--model-dir={str(paths.model_dir)!r} holds the model another run exported (its "
                         f"{MARKER} names another run folder); this run would replace it; allowed: a new --model-dir, "
                         "or that run's own --output-dir")


def _check_overlaps(writes: list[tuple[str, Path, str]], reads: list[tuple[str, Path]]) -> None:
    for i, (oa, a, ka) in enumerate(writes):
        for ob, b, kb in writes[i + 1:]:
            if a == b:
                raise ValueError(f"{oa} and {ob} are the same folder ({a.name!r}); fp8lab would write one's files "
                                 f"over the other's; allowed: separate folders (the defaults are inside --output-dir)")
        for ob, b, kb in writes:
            if kb != "run" and a != b and _inside(a, b):
                raise ValueError(f"{oa} is inside {ob} ({b.name!r}), whose contents fp8lab replaces; allowed: "
                                 f"{oa} outside {ob}")
        for ob, b in reads:
            if _inside(a, b) or (ka != "run" and _inside(b, a)):
                where = "inside" if _inside(a, b) else "around"
                raise ValueError(f"{oa} is {where} {ob} ({b.name!r}): fp8lab would write where the run reads; "
                                 f"allowed: an {oa.split()[0]} apart from {ob}, e.g. a new folder")
        _check_checkout(oa, a)


def _check_checkout(option: str, folder: Path) -> None:
    parts = _checkout_parts()
    hit = ([p.name + "/" for p in parts if _inside(folder, p)]
           or (["its root"] if parts and folder == REPO_ROOT.resolve() else []))
    if hit:
        raise ValueError(f"{option} is in the fp8lab checkout ({hit[0]}); fp8lab never writes there; allowed: a "
                         "folder outside it, or under runs/ or outputs/")
