"""One run per output folder: a lock held for the whole run.

:func:`acquire` takes an exclusive ``fcntl.flock`` on ``<output-dir>/.fp8lab-lock`` and writes its
holder (pid, host) into it. The kernel drops a flock when its process ends, kill -9 included, so a
lock left by a dead run is stale by construction and the next run simply takes it; while its
holder lives, a second run on the folder is refused with one line saying who holds it. At release
the holder's line is cleared (the empty file stays: fp8lab.records.ownership counts it as fp8lab's). The lock
file is opened without following a link (``O_NOFOLLOW``) and used only when it is a regular file with
no other name (no hard link): a planted link or FIFO is refused, never written through.

Under torchrun rank 0 takes it (one lock per job, whatever the ranks); a SageMaker job has its own
folders. A file system without flock (some network mounts) runs unlocked, with a note.
"""
from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

from fp8lab.records.ownership import LOCK


class RunLock:
    """The held lock; :meth:`release` (idempotent) clears and frees it."""

    def __init__(self, fh, shared: bool = False):
        self._fh, self._shared = fh, shared

    def release(self) -> None:
        if self._fh is None:
            return
        import fcntl

        try:
            if not self._shared:  # a reader's shared lock names no holder
                self._fh.seek(0)
                self._fh.truncate()
                self._fh.flush()
        except OSError:
            pass
        fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
        self._fh.close()
        self._fh = None


def acquire(option: str, folder: str | Path, user: str = "run") -> RunLock:
    """Lock ``folder`` (it exists) for this process; ValueError naming ``option`` when a live process holds it
    (``user``: what this process is, as the refusal says it)."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return RunLock(None)
    fh = _open(option, folder)
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = _holder(fh.read())
        fh.close()
        if holder == "a live process" and user == "prepare-data":  # readers name no holder
            holder = "a training run reads it"
        raise ValueError(f"{option}={str(folder)!r} is in use by another fp8lab {user} ({holder}); allowed: wait for "
                         f"it to finish, or another {option}") from None
    except OSError as exc:  # no flock here (e.g. some network file systems)
        print(f"fp8lab: note: {option} cannot be locked ({exc.strerror}); make sure no other run uses it", flush=True)
        fh.close()
        return RunLock(None)
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n")
    fh.flush()
    return RunLock(fh)


def refuse_in_use(option: str, folder: str | Path) -> None:
    """ValueError naming ``option`` when a live fp8lab run holds ``folder``'s lock; nothing is created or written.
    Checked before what the folder holds: a running run's step folder being written is its own, not a stranger's."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return
    try:
        fd = os.open(Path(folder) / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    with os.fdopen(fd, "r") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"{option}={str(folder)!r} is in use by another fp8lab run ({_holder(fh.read())}); "
                             f"allowed: wait for it to finish, or another {option}") from None
        except OSError:
            return
        fcntl.flock(fd, fcntl.LOCK_UN)


def acquire_shared(option: str, folder: str | Path) -> RunLock:
    """A reader's lock on ``folder`` (a prepared ``--data``): shared with other readers, refused (ValueError naming
    ``option``) while a writer holds it (``fp8lab prepare-data`` replacing its shards), and a writer refused while
    it is held. A folder without fp8lab's lock file, or one that cannot be opened (read-only, no flock), is read
    unlocked: nothing is created in a folder the run only reads."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return RunLock(None)
    try:
        fd = os.open(Path(folder) / LOCK, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return RunLock(None)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return RunLock(None)
    fh = os.fdopen(fd, "r")
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fh.read())
        fh.close()
        raise ValueError(f"{option}={str(folder)!r} is being written by fp8lab prepare-data ({holder}); allowed: wait "
                         f"for it to finish, then run again") from None
    except OSError:
        fh.close()
        return RunLock(None)
    return RunLock(fh, shared=True)


def _open(option: str, folder: str | Path):
    """The lock file, opened read-write without following a link; ValueError when it is no plain file."""
    path = Path(folder) / LOCK
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        fd, why = -1, exc.strerror or type(exc).__name__
    if fd >= 0:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
            os.set_blocking(fd, True)
            return os.fdopen(fd, "r+")
        os.close(fd)
        why = "not a regular file" if not stat.S_ISREG(st.st_mode) else "a hard link to another file"
    raise ValueError(f"{option}={str(folder)!r} holds a {LOCK} that fp8lab cannot use as its run lock ({why}; a "
                     f"symlink, FIFO or link is never written through); allowed: a folder where {LOCK} is fp8lab's "
                     f"own (remove that entry) or a new folder")


def _holder(text: str) -> str:
    """Who holds the lock, as its file says; a holder of this host that is gone (killed: the file kept its line while
    readers, who write none, hold the lock now) is no holder."""
    try:
        d = json.loads(text)
        pid, host = int(d["pid"]), str(d["host"])[:64]
    except (ValueError, KeyError, TypeError):
        return "a live process"
    if host == socket.gethostname()[:64]:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return "a live process"
        except OSError:
            pass
    return f"pid {pid} on {host}"
