"""One run per output folder: a lock held for the whole run.

:func:`acquire` takes an exclusive ``fcntl.flock`` on ``<output-dir>/.fp8lab-lock`` and writes its
holder (pid, host) into it. The kernel drops a flock when its process ends, kill -9 included, so a
lock left by a dead run is stale by construction and the next run simply takes it; while its
holder lives, a second run on the folder is refused with one line saying who holds it. At release
the holder's line is cleared (the empty file stays: fp8lab.records.ownership counts it as fp8lab's).

Under torchrun rank 0 takes it (one lock per job, whatever the ranks); a SageMaker job has its own
folders. A file system without flock (some network mounts) runs unlocked, with a note.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from fp8lab.records.ownership import LOCK


class RunLock:
    """The held lock; :meth:`release` (idempotent) clears and frees it."""

    def __init__(self, fh):
        self._fh = fh

    def release(self) -> None:
        if self._fh is None:
            return
        import fcntl

        try:
            self._fh.seek(0)
            self._fh.truncate()
            self._fh.flush()
        except OSError:
            pass
        fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
        self._fh.close()
        self._fh = None


def acquire(option: str, folder: str | Path) -> RunLock:
    """Lock ``folder`` (it exists) for this process; ValueError naming ``option`` when a live run holds it."""
    try:
        import fcntl
    except ImportError:  # not POSIX
        return RunLock(None)
    fh = open(Path(folder) / LOCK, "a+")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = _holder(fh.read())
        fh.close()
        raise ValueError(f"{option}={str(folder)!r} is in use by another fp8lab run ({holder}); allowed: wait for it "
                         f"to finish, or another {option}") from None
    except OSError as exc:  # no flock here (e.g. some network file systems)
        print(f"fp8lab: note: {option} cannot be locked ({exc.strerror}); make sure no other run uses it", flush=True)
        fh.close()
        return RunLock(None)
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n")
    fh.flush()
    return RunLock(fh)


def _holder(text: str) -> str:
    try:
        d = json.loads(text)
        return f"pid {int(d['pid'])} on {str(d['host'])[:64]}"
    except (ValueError, KeyError, TypeError):
        return "a live process"
