"""A process killed (kill -9) while it stages new tokens beside the prepared cache, or while it swaps them in, leaves
its temporary folders behind; the next preparation in that place removes them, and the prepared data is right. A
folder a live process is still writing is kept, whole, and that process's swap still lands."""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fp8lab.core.paths import REPO_ROOT
from fp8lab.data import run_data
from fp8lab.data import tokens as fdata
from fp8lab.records import ownership

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "HF_HUB_OFFLINE": "1"}

# A process preparing SOURCE into CACHE with an accept step, as a re-run does (fp8lab.train.trainer): "staging" is
# killed (SIGKILL) while the new tokens wait beside the cache, "swapping" between the swap's two renames, and
# "waiting" prints its staged folder and waits for a line on stdin before it lets the swap go on.
CHILD = """
import os, signal, sys
from pathlib import Path
from fp8lab.data import run_data
from fp8lab.records import ownership

mode, source, cache = sys.argv[1:4]

def accept(staged):
    if mode == "staging":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "waiting":
        print(staged, flush=True)
        sys.stdin.readline()

if mode == "swapping":
    rename = Path.rename

    def dying(self, target):
        if self.name.startswith(ownership.TMP_PREFIX):  # the staged tokens renamed into the cache's place
            os.kill(os.getpid(), signal.SIGKILL)
        return rename(self, target)

    Path.rename = dying
run_data.ensure_prepared(source, cache, 512, accept=accept)
"""


def text(path: Path, seed: int) -> Path:
    """A small text corpus (200 documents), different for each ``seed``."""
    words = ["light", "water", "stone", "field", "river", "bread", "house", "night", "morning", "king"]
    docs = [" ".join(words[(i * 7 + j * seed) % len(words)] for j in range(40)) + f" {seed}." for i in range(200)]
    path.write_text("\n\n".join(docs) + "\n")
    return path


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden ones too) with its content digest."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def temp_folders(where: Path) -> list[str]:
    return sorted(p.name for p in where.iterdir() if p.name.startswith(ownership.TMP_PREFIX))


def child(mode: str, source: Path, cache: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, mode, str(source), str(cache)], env=ENV, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def holds(cache: Path, source: Path) -> bool:
    """``cache`` is a readable prepared folder of ``source``'s tokens."""
    m = fdata.read_manifest(cache)
    return (m["source"]["sha256"] == fdata.source_digest([source]) and len(fdata.TokenShards(cache, "train")) > 0
            and len(fdata.TokenShards(cache, "val")) > 0)


@pytest.mark.parametrize("mode, again", [("staging", "b"), ("staging", "a"), ("swapping", "b")])
def test_the_next_preparation_removes_what_a_killed_one_left_beside_the_cache(tmp_path, mode, again):
    sources = {"a": text(tmp_path / "a.txt", 1), "b": text(tmp_path / "b.txt", 3)}
    cache = tmp_path / "run" / "data"
    assert run_data.ensure_prepared(str(sources["a"]), cache, 512) == cache
    proc = child(mode, sources["b"], cache)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    left = temp_folders(cache.parent)
    # staging: the new tokens, whole; swapping: those and the cache's earlier tokens, and no cache (renamed away)
    assert len(left) == (1 if mode == "staging" else 2) and all(f"-{proc.pid}-" in n for n in left), left
    assert cache.is_dir() == (mode == "staging")
    assert fdata.is_prepared(cache.parent / left[0])

    out = run_data.ensure_prepared(str(sources[again]), cache, 512, accept=lambda staged: None)
    assert out == cache and holds(cache, sources[again])
    assert temp_folders(cache.parent) == []  # the dead process's folders went (and this preparation's own)
    assert sorted(p.name for p in cache.parent.iterdir()) == ["data"]


def test_a_folder_a_live_process_stages_is_kept_and_its_swap_lands(tmp_path):
    a, b = text(tmp_path / "a.txt", 1), text(tmp_path / "b.txt", 3)
    cache = tmp_path / "run" / "data"
    run_data.ensure_prepared(str(a), cache, 512)
    proc = child("waiting", b, cache)
    try:
        staged = Path(proc.stdout.readline().strip())
        assert staged.parent == cache.parent and f"-{proc.pid}-" in staged.name, staged  # (stderr: read at exit)
        before = tree(staged)
        assert "manifest.json" in before
        # this process's own staging folder: alive too (as the run itself re-entering, e.g. another rank's call)
        mine = run_data._temp_folder(cache, "")
        mine.mkdir()
        (mine / "part").write_text("being written")

        # another preparation in the same place (here it reuses the cache's tokens): it removes neither
        assert run_data.ensure_prepared(str(a), cache, 512, accept=lambda s: None) == cache and holds(cache, a)
        assert tree(staged) == before and (mine / "part").read_text() == "being written"
        assert run_data.ensure_prepared(str(a), cache, 512) == cache  # without accept too
        assert tree(staged) == before

        _, err = proc.communicate("go\n", timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert holds(cache, b) and temp_folders(cache.parent) == [mine.name]
