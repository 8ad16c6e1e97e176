"""Where the repository's shipped files are, independent of the working directory.

Notebooks run with their cwd under ``outputs/``; the library finds ``data/`` from here. The default corpus and
tokenizers also ship inside the package (``fp8lab/shipped/``, package data of a wheel mapped from ``data/``):
:func:`shipped_path` finds them in ``DATA_DIR`` first (a checkout, or FP8LAB_DATA_DIR holding them), then there.
"""
from __future__ import annotations

import contextlib
import functools
import os
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# FP8LAB_DATA_DIR lets an installed copy (or a SageMaker job) point at another data folder.
DATA_DIR = Path(os.environ.get("FP8LAB_DATA_DIR", REPO_ROOT / "data"))
RESULTS_DIR = DATA_DIR / "results"
PACKAGE_DIR = Path(__file__).resolve().parents[1]  # fp8lab/
SHIPPED_DIR = PACKAGE_DIR / "shipped"  # an installed package's copy of data/'s default corpus, tokenizers, instructions
# what that copy holds, relative to data/ (pyproject.toml's package data for fp8lab.shipped lists the same)
SHIPPED_FILES = ("corpus/kjv.txt.xz", "tokenizer.json", "tokenizer-512.json", "sft/kjv-qa.jsonl")


def shipped_path(name: str) -> Path:
    """``data/<name>`` (``corpus``, ``tokenizer.json``, ...): in DATA_DIR where it is there, else the checkout's
    ``data/`` (FP8LAB_DATA_DIR elsewhere), else the package's copy; DATA_DIR's path where none has it."""
    for base in (DATA_DIR, REPO_ROOT / "data", SHIPPED_DIR):
        if (base / name).exists():
            return base / name
    return DATA_DIR / name

# The committed result files are read in several places by one command (the results index's digest, the runs, the
# FP8 statistics): each is opened once per process while unchanged (size and mtime), its bytes kept here. Only files
# under RESULTS_DIR are kept (17 MB today); a user's own runs are read as they are asked for.
_RESULT_BYTES: dict[str, tuple[tuple[int, int], bytes]] = {}
_CALL_BYTES: list[dict[str, tuple[tuple[int, int], bytes]]] = []  # the files kept by files_read_once blocks


def read_result_bytes(path: str | Path) -> bytes:
    """The bytes of ``path``: for a file under RESULTS_DIR read once per process while it is unchanged; inside a
    :func:`files_read_once` block, any file once per block."""
    path = Path(path)
    st = os.stat(path)
    key = os.path.realpath(path)  # once: resolving is most of the cost where a report reads thousands of files
    if key == _results_root() or key.startswith(_results_root() + os.sep):
        kept = _RESULT_BYTES
    elif _CALL_BYTES:
        kept = _CALL_BYTES[0]
    else:
        return path.read_bytes()
    stamp = (st.st_size, st.st_mtime_ns)
    hit = kept.get(key)
    if hit is None or hit[0] != stamp:
        data = path.read_bytes()
        kept[key] = (stamp, data)
        return data
    return hit[1]


@functools.lru_cache(maxsize=None)
def _results_root() -> str:
    return os.path.realpath(RESULTS_DIR)


@contextlib.contextmanager
def files_read_once():
    """While the block runs, every file read through :func:`read_result_bytes` is opened once (a user's own runs
    too, which a report reads twice: their steps, then their FP8 statistics); forgotten when the outermost ends."""
    _CALL_BYTES.append(_CALL_BYTES[0] if _CALL_BYTES else {})
    try:
        yield
    finally:
        _CALL_BYTES.pop()


def read_result_text(path: str | Path) -> str:
    """``Path(path).read_text(encoding="utf-8")`` (newlines translated as it does), through
    :func:`read_result_bytes`."""
    text = read_result_bytes(path).decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def is_inside(path: str | Path, root: str | Path) -> bool:
    """True when ``path``, symlinks followed, lies in ``root`` (a manifest's shard, a model's tokenizer)."""
    try:
        Path(path).resolve().relative_to(Path(root).resolve())
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------ paths in files people share
# Run configs, summaries, executed notebooks and reports are shared: they never hold an absolute
# machine path (user names, mount points). A path inside the run's folder is written relative to
# it; any other absolute path becomes "<abs>/" plus its last part.

ABSOLUTE_PLACEHOLDER = "<abs>"


def shareable_path(value: object, base: str | Path | None = None) -> object:
    """``value`` as written in a shared file: relative to ``base`` (the run folder) when inside it,
    as typed when relative, else ``<abs>/<name>``; non-path values are returned unchanged."""
    if value is None or not isinstance(value, (str, Path)) or str(value).startswith(("hf:", "s3://")):
        return value
    p = Path(value)
    if not p.is_absolute():
        return str(value)
    if base is not None:
        try:
            rel = p.resolve().relative_to(Path(base).resolve())
            return rel.as_posix() or "."
        except ValueError:
            pass
    return f"{ABSOLUTE_PLACEHOLDER}/{p.name}" if p.name else ABSOLUTE_PLACEHOLDER


_ABSOLUTE_IN_TEXT = re.compile(r"(?:^|(?<=[\s'\"(=\[]))/[^\s'\"()\],]+")


def shareable_text(text: str) -> str:
    """A message (an OSError's, torch's) with every absolute path in it written ``<abs>/<name>``: summaries and
    logs are shared, and a checkpoint folder's full path names the user and the machine."""
    def share(m: re.Match) -> str:
        path = m.group(0).rstrip(".")  # a sentence's full stop stays the sentence's
        return str(shareable_path(path)) + m.group(0)[len(path):]

    return _ABSOLUTE_IN_TEXT.sub(share, text)


def shareable_argv(argv: list[str], base: str | Path | None = None) -> list[str]:
    """Command-line words with every absolute path (alone or after ``--opt=``) made shareable."""
    out = []
    for word in argv:
        opt, eq, val = word.partition("=") if word.startswith("--") else ("", "", word)
        if eq:
            out.append(f"{opt}={shareable_path(val, base)}")
        else:
            out.append(str(shareable_path(word, base)) if word.startswith("/") else word)
    return out


def shareable_run_record(options: dict, defaults: dict, argv: list[str] | None, base: str | Path,
                         path_keys: tuple[str, ...] = ("data", "output_dir", "checkpoint_dir", "model_dir")) -> dict:
    """The path options and the ``command`` of a run's config.json, shareable.

    ``argv`` given: the command line as typed, its absolute paths made shareable. ``argv`` None (the
    Python API, a notebook kernel): the equivalent ``fp8lab train`` command from the options that
    differ from ``defaults``, instead of the interpreter's own argv (a kernel launcher and its
    connection file)."""
    out = {k: shareable_path(options.get(k), base) for k in path_keys if k in options}
    if argv is None:
        words = []
        for k, v in options.items():
            if k in defaults and v != defaults[k] and v not in ((), [], {}):
                v = shareable_path(v, base) if k in path_keys else v
                if isinstance(v, dict):
                    v = ",".join(f"{a}={b}" for a, b in v.items())
                elif isinstance(v, (list, tuple)):
                    v = ",".join(str(x) for x in v)
                words += ["--" + k.replace("_", "-").replace("model-overrides", "model-override"), str(v)]
        out["command"] = "fp8lab train " + " ".join(words) + "  # via the Python API (fp8lab.train.entry.train)"
    else:
        out["command"] = "fp8lab train " + " ".join(shareable_argv(list(argv), base))
    return out
