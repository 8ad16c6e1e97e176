"""Path probes: a folder or file fp8lab will write is tested up front, by creating (and removing) a probe
file in the nearest existing folder, which also catches what permission bits do not show (read-only
mounts, immutable folders, a root user). One clear line naming the option on failure."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from fp8lab.core.paths import is_inside


def _nearest_existing(p: Path) -> Path:
    q = p
    while not q.exists() and q.parent != q:
        q = q.parent
    return q


def _probe(folder: Path) -> str | None:
    """Why ``folder`` cannot take a new file, or None (a probe file is created and removed)."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".fp8lab-write-check-")
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    os.unlink(name)
    return None


def check_writable_dir(option: str, value: Any) -> Path:
    """``value`` is a folder that exists and takes new files, or can be created where it is."""
    if not isinstance(value, (str, Path)) or not str(value).strip():
        raise ValueError(f"{option}={value!r} is invalid; allowed: a non-empty folder path")
    p = Path(value)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{option}={str(value)!r} is a file, not a folder; allowed: a folder path (existing or new)")
    base = _nearest_existing(p)
    if not base.is_dir():
        raise ValueError(f"{option}={str(value)!r} cannot be created: {_show(base, p)} is a file; "
                         "allowed: a folder path (existing or new)")
    why = _probe(base)
    if why is not None:
        raise ValueError(f"{option}={str(value)!r} is not writable ({why} in {_show(base, p)}); "
                         "allowed: a folder you can write to")
    return p


def check_writable_file(option: str, value: Any) -> Path:
    """``value`` names a file that can be written (its folder exists or can be created; it is no folder)."""
    if not isinstance(value, (str, Path)) or not str(value).strip():
        raise ValueError(f"{option}={value!r} is invalid; allowed: a non-empty file path")
    p = Path(value)
    if p.is_dir():
        raise ValueError(f"{option}={str(value)!r} is a folder; allowed: a file path, e.g. report.html")
    try:
        check_writable_dir(option, p.parent)
    except ValueError as exc:
        why = str(exc).split(" is ", 1)[-1].split(" cannot ", 1)[-1].split("; allowed")[0]
        raise ValueError(f"{option}={str(value)!r} cannot be written: its folder {str(p.parent)!r} is {why}; "
                         "allowed: a file path in a folder you can write to") from None
    return p


def _show(base: Path, asked: Path) -> str:
    """The existing folder above ``asked``, as the user wrote it (never made absolute)."""
    return repr(str(base)) if base != Path(".") else "the working folder"


def check_member(folder: Path, name: Any, option: str = "--data") -> Path:
    """A file a manifest names: a relative path that stays inside ``folder``, symlinks followed."""
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts \
            or not is_inside(folder / name, folder):
        raise ValueError(f"{option}: the manifest in {folder.name!r} names a file outside its folder ({name!r}); "
                         "allowed: file names inside the prepared folder (re-create it with fp8lab prepare-data)")
    return folder / name



def refuse_replacing(option: str, value: Any, ours: Callable[[str], bool], what: str) -> None:
    """ValueError naming ``option`` unless ``value`` is new or a regular file whose first 4 KiB ``ours`` accepts (a file
    fp8lab wrote, ``what`` says which): a user's file, a link, a folder, a device (``/dev/null`` as root) or a FIFO is
    never replaced."""
    p = Path(value)
    if not os.path.lexists(p):
        return
    if p.is_symlink() or not p.is_file():
        kind = "a symlink" if p.is_symlink() else "a folder" if p.is_dir() else "a device, FIFO or socket"
        raise ValueError(f"{option}={str(value)!r} is {kind}, not {what}; fp8lab never replaces it; allowed: a new "
                         f"file name, or {what}")
    try:
        with open(p, "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace")
    except OSError as exc:
        raise ValueError(f"{option}={str(value)!r} cannot be read ({exc.strerror}); allowed: a new file name") from None
    if not ours(head):
        raise ValueError(f"{option}={str(value)!r} exists and is not {what}; fp8lab never replaces it; allowed: a new "
                         f"file name, or {what}")
