"""Checks that run before anything is computed, prepared or written: one clear line per bad input.

Each check raises ``ValueError`` whose message names the option (``--output-dir``), or the file and
the option that pointed to it (``--data``), and says what is allowed. The commands turn that into
``<command>: error: <message>`` and a non-zero exit; the Python API raises it as it is.

* :func:`check_writable_dir` / :func:`check_writable_file`: a folder or file fp8lab will write,
  tested up front by creating (and removing) a probe file in the nearest existing folder, which also
  catches what permission bits do not show (read-only mounts, immutable folders, a root user);
* :func:`check_data_source`: a ``--data`` text file or folder (UTF-8 text, not binary, not empty,
  enough documents for a train/validation split) or a prepared folder (a readable manifest whose
  shards are all there), before any tokenizing;
* :func:`check_prepared_size`: after tokenizing, both splits hold at least one window;
* :func:`parse_count`: a positive integer written as ``1000000000``, ``1e9`` or ``1_000_000_000``;
* the shared value checks: :func:`is_int`, :func:`is_num`, :func:`is_count` and the :class:`Check`
  objects (``POSITIVE_INT``, ``NONNEG_INT``, ``AUTO_OR_POSITIVE_INT`` ...) that option fields declare
  (fp8lab.options) and ``fp8lab.launch.JobSpec`` uses for its own fields;
* :func:`check_notebook_values`: notebook parameters against their declared defaults' types and,
  for notebooks that train, the trainer's own checks (``NOTEBOOK_CHECKS``).
"""
from __future__ import annotations

import argparse
import codecs
import gzip
import json
import lzma
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

SCAN_BYTES = 64 << 20  # text read per --data file up front; a decode error past this is caught while tokenizing


# --------------------------------------------------------------------------------------- paths

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


# --------------------------------------------------------------------------------------- --data

def _open_binary(path: Path):
    if path.name.endswith(".xz"):
        return lzma.open(path, "rb")
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def scan_text_file(path: Path, option: str = "--data", limit: int = SCAN_BYTES) -> int:
    """Documents (blank-line separated blocks) in the first ``limit`` bytes; ValueError if not UTF-8 text."""
    who = f"{option}: file {path.name!r}"
    decoder = codecs.getincrementaldecoder("utf-8")()
    docs, in_doc, read, line_no = 0, False, 0, 0
    try:
        with _open_binary(path) as fh:
            head = fh.peek(8192)[:8192] if hasattr(fh, "peek") else b""
            if b"\x00" in head:
                raise ValueError(f"{who} is binary (NUL bytes near its start), not text; allowed: UTF-8 text "
                                 "files (.txt, .md, optionally .xz/.gz) or a prepared folder")
            for raw in fh:
                line_no += 1
                if b"\x00" in raw:
                    raise ValueError(f"{who} is binary (NUL bytes on line {line_no}), not text; "
                                     "allowed: UTF-8 text files (.txt, .md, optionally .xz/.gz) or a prepared folder")
                try:
                    text = decoder.decode(raw)
                except UnicodeDecodeError as exc:
                    raise ValueError(f"{who} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line {line_no}); "
                                     "allowed: UTF-8 text (convert it first, e.g. iconv -f latin1 -t utf-8)") from None
                if text.strip():
                    docs += not in_doc
                    in_doc = True
                else:
                    in_doc = False
                read += len(raw)
                if read >= limit:
                    return docs
            try:
                decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                raise ValueError(f"{who} is not UTF-8 text (it ends inside a multi-byte character); "
                                 "allowed: UTF-8 text") from None
    except (lzma.LZMAError, gzip.BadGzipFile, EOFError) as exc:
        raise ValueError(f"{who} is not a readable {path.suffix} archive ({exc}); "
                         "allowed: text files, optionally compressed with xz or gzip") from None
    except OSError as exc:
        raise ValueError(f"{who} cannot be read ({exc.strerror or exc})") from None
    if docs == 0:
        raise ValueError(f"{who} is empty (no text); allowed: UTF-8 text with at least one paragraph")
    return docs


def check_data_source(value: str | list | None, option: str = "--data", val_fraction: float = 0.05) -> None:
    """A ``--data`` source (or a list of text sources) is usable before anything is tokenized; None and
    ``hf:`` pass (checked when loaded)."""
    from fp8lab import data as fdata

    if value is None or (isinstance(value, str) and value.startswith("hf:")):
        return
    if isinstance(value, (str, Path)) and fdata.is_prepared(value):
        check_prepared_folder(Path(value), option)
        return
    try:
        files = fdata.text_files(value)
    except ValueError as exc:
        raise ValueError(f"{option}={value if isinstance(value, list) else str(value)!r}: {exc}") from None
    docs = sum(scan_text_file(f, option) for f in files)
    need = max(2, round(1 / val_fraction))  # every need-th document goes to validation (fdata.prepare_data)
    if docs < need:
        names = ", ".join(repr(f.name) for f in files[:3]) + (" ..." if len(files) > 3 else "")
        raise ValueError(f"{option}: {names} hold(s) {docs} document(s) (paragraphs separated by blank lines); "
                         f"allowed: at least {need}, since every {need}th goes to the validation split")


def check_prepared_folder(folder: Path, option: str = "--data") -> dict[str, Any]:
    """A prepared folder's manifest parses, has the expected format, and its shards and tokenizer exist."""
    from fp8lab import data as fdata

    mpath = folder / fdata.MANIFEST
    who = f"{option}: {fdata.MANIFEST} in {folder.name!r}"
    try:
        m = json.loads(mpath.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{who} is not valid JSON (line {exc.lineno}: {exc.msg}); allowed: a folder written by "
                         "fp8lab prepare-data (re-create it), or text files") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise ValueError(f"{who} cannot be read ({type(exc).__name__}); allowed: a folder written by fp8lab prepare-data") from None
    if not isinstance(m, dict) or m.get("format") != fdata.FORMAT or m.get("version") != fdata.FORMAT_VERSION:
        got = (m.get("format"), m.get("version")) if isinstance(m, dict) else type(m).__name__
        raise ValueError(f"{who} is not an {fdata.FORMAT} v{fdata.FORMAT_VERSION} manifest (found {got}); "
                         "allowed: a folder written by fp8lab prepare-data")
    try:
        itemsize = __import__("numpy").dtype(m["dtype"]).itemsize
        shards = [(s["file"], int(s["tokens"])) for split in ("train", "val") for s in m["splits"][split]["shards"]]
        tokenizer = m["tokenizer"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{who} lacks {exc} or has a wrong type there; allowed: a folder written by fp8lab prepare-data") from None
    for name in [n for n, _ in shards] + [tokenizer]:
        check_member(folder, name, option)
    for name, tokens in shards:
        f = folder / name
        if not f.is_file() or f.stat().st_size < tokens * itemsize:
            raise ValueError(f"{option}: shard {name!r} in {folder.name!r} is missing or shorter than its manifest says "
                             f"({tokens} tokens); re-create the folder with fp8lab prepare-data")
    if not (folder / tokenizer).is_file():
        raise ValueError(f"{option}: {tokenizer!r} (the tokenizer) is missing from {folder.name!r}")
    check_token_ids(folder, m, option)
    return m


def check_member(folder: Path, name: Any, option: str = "--data") -> Path:
    """A file a manifest names: a relative path that stays inside ``folder``, symlinks followed."""
    from fp8lab.paths import is_inside

    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts \
            or not is_inside(folder / name, folder):
        raise ValueError(f"{option}: the manifest in {folder.name!r} names a file outside its folder ({name!r}); "
                         "allowed: file names inside the prepared folder (re-create it with fp8lab prepare-data)")
    return folder / name


TOKEN_SCAN_CHUNK = 1 << 24  # tokens read at a time when scanning shards for out-of-vocabulary ids


def check_token_ids(folder: Path, manifest: dict[str, Any], option: str = "--data") -> None:
    """Every token id in the shards is below the manifest's vocab_size (which the trainer compares with
    the model's): an id past the embedding would fail inside the first step. Reads every shard once
    (memory-mapped, in chunks: about a second per GB)."""
    import numpy as np

    vocab = manifest.get("vocab_size")
    if not is_count(vocab):
        raise ValueError(f"{option}: the manifest in {folder.name!r} has vocab_size={vocab!r}; allowed: a positive "
                         "integer (re-create the folder with fp8lab prepare-data)")
    dtype = np.dtype(manifest["dtype"])
    for split in ("train", "val"):
        for s in manifest["splits"][split]["shards"]:
            n = int(s["tokens"])
            if n <= 0:
                continue
            arr = np.memmap(folder / s["file"], dtype=dtype, mode="r", shape=(n,))
            top = max(int(arr[i:i + TOKEN_SCAN_CHUNK].max()) for i in range(0, n, TOKEN_SCAN_CHUNK))
            if top >= vocab:
                raise ValueError(f"{option}: shard {s['file']!r} in {folder.name!r} holds token id {top}, outside the "
                                 f"manifest's vocab_size {vocab} (ids 0..{vocab - 1}); allowed: shards written with "
                                 "that tokenizer (re-create the folder with fp8lab prepare-data)")


def check_prepared_size(manifest: dict[str, Any], seq_len: int, option: str = "--data") -> None:
    """Both splits hold at least one window of ``seq_len + 1`` tokens."""
    src = manifest.get("source", {})
    names = src.get("files") or ([src["dataset"]] if src.get("dataset") else [])
    who = f"{option} ({', '.join(map(repr, names[:3]))}{' ...' if len(names) > 3 else ''})" if names else option
    for split in ("train", "val"):
        n = manifest["splits"][split]["tokens"]
        if n < seq_len + 1:
            raise ValueError(f"{who}: its {split} split holds {n} tokens, too few for one sequence of --seq-len "
                             f"{seq_len} (+1); allowed: more text, or a smaller --seq-len (at most {max(1, n - 1)})")


# --------------------------------------------------------------------------------------- numbers

def is_int(v: Any) -> bool:
    """An int that is not a bool (True is an int to Python, never a count to fp8lab)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def is_count(v: Any, low: int = 1) -> bool:
    """An integer >= ``low`` (1: a positive integer; 0: an integer >= 0)."""
    return is_int(v) and v >= low


@dataclass(frozen=True)
class Check:
    """A value test and what it allows, as error messages say it (``allowed: <allowed>``)."""

    ok: Callable[[Any], bool]
    allowed: str

    def __call__(self, value: Any) -> bool:
        return self.ok(value)


def one_of(choices: tuple, sep: str = " | ") -> Check:
    return Check(lambda v, cs=tuple(choices): isinstance(v, str) and v in cs, sep.join(choices))


def optional(check: Check) -> Check:
    """None, or a value ``check`` accepts (same wording: None means the default)."""
    return Check(lambda v: v is None or check(v), check.allowed)


AUTO = "auto"  # a value the layout resolver (fp8lab.layout) or the trainer picks per machine
BOOL = Check(lambda v: isinstance(v, bool), "True | False")
AUTO_BOOL = Check(lambda v: v == AUTO or isinstance(v, bool), "auto | True | False")
POSITIVE_INT = Check(is_count, "a positive integer")
NONNEG_INT = Check(lambda v: is_count(v, 0), "an integer >= 0")
AUTO_OR_POSITIVE_INT = Check(lambda v: v == AUTO or is_count(v), "auto or a positive integer")
NONNEG_NUM = Check(lambda v: is_num(v) and v >= 0, "a number >= 0")
UNIT_OPEN = Check(lambda v: is_num(v) and 0 < v < 1, "a number in (0, 1)")  # a learning rate
UNIT_HALF_OPEN = Check(lambda v: is_num(v) and 0 <= v < 1, "a number in [0, 1)")  # an AdamW beta
PATH = Check(lambda v: isinstance(v, str) and bool(v), "a non-empty path")
# A run's length, bounded: more steps than any LLM run has taken (Llama 3 405B: ~1.2M), more tokens
# than any has seen (~15e12); beyond that it is a typo (1e23 for 1e3) that would run until stopped.
MAX_STEPS = 10**8
MAX_TOKENS = 10**15
STEP_COUNT = Check(lambda v: is_count(v) and v <= MAX_STEPS, "a positive integer, at most 1e8 (100,000,000)")
TOKEN_COUNT = Check(lambda v: is_count(v) and v <= MAX_TOKENS, "a positive integer, at most 1e15")


def step_numbers(allowed: str) -> Check:
    """A tuple of step numbers (>= 1)."""
    return Check(lambda v: isinstance(v, tuple) and all(is_count(s) for s in v), allowed)


_COUNT = re.compile(r"^\d[\d_]*(\.\d*)?([eE]\+?\d+)?$")


def parse_count(text: str) -> int:
    """A positive integer from '1000000000', '1e9', '1_000_000_000' or '2.5e9' (argparse ``type=``)."""
    s = str(text).strip()
    try:
        f = float(s.replace("_", "")) if _COUNT.match(s) else math.nan
    except ValueError:
        f = math.nan
    if not math.isfinite(f) or not f.is_integer() or f < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: a positive whole number, e.g. 1000000000 or 1e9")
    return int(f)


def _number(kind: type, low: float, strict: bool) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            v = kind(float(text)) if kind is float else int(text)
        except (TypeError, ValueError):
            v = None
        if v is None or not math.isfinite(v) or v < low or (strict and v == low):
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; allowed: {what} {'>' if strict else '>='} {low:g}")
        return v
    return parse


positive_float = _number(float, 0, strict=True)
nonneg_float = _number(float, 0, strict=False)
positive_int = _number(int, 1, strict=False)
nonneg_int = _number(int, 0, strict=False)


def whole_number(value: Any) -> Any:
    """An integral float (1e9) as int, for APIs that take counts; anything else unchanged (checked later)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


# --------------------------------------------------------------------------------------- notebooks

def _kind(default: Any) -> tuple[str, Callable[[Any], bool]] | None:
    if isinstance(default, bool):
        return "True or False", lambda v: isinstance(v, bool)
    if isinstance(default, int):
        return "an integer", lambda v: is_int(v) or (isinstance(v, float) and math.isfinite(v) and v.is_integer())
    if isinstance(default, float):
        return "a number", is_num
    # a string default is left to the notebook's own checks: it may stand for "auto" or a number
    if isinstance(default, list):
        return "a list, e.g. " + repr(default), lambda v: isinstance(v, (list, tuple))
    return None


def check_notebook_values(name: str, declared: dict[str, Any], comments: dict[str, str], params: dict[str, Any]) -> None:
    """Each value has its default's type (the parameters cell's comment says what is allowed)."""
    for key, value in params.items():
        kind = _kind(declared.get(key))
        if kind is not None and not kind[1](value):
            hint = f" ({comments[key]})" if comments.get(key) else ""
            raise ValueError(f"notebook {name}: parameter {key}={value!r} is invalid; allowed: {kind[0]}{hint}, "
                             f"default {declared[key]!r}")


def _train_pair_check(values: dict[str, Any]) -> None:
    """Notebook 03: every run it would start passes the trainer's own checks (fp8lab.train.TrainConfig)."""
    import dataclasses

    from fp8lab.options import FP8_BACKENDS
    from fp8lab.train import TrainConfig

    backends = values.get("backends")
    choices = ("auto", *FP8_BACKENDS)
    if isinstance(backends, str) or not isinstance(backends, (list, tuple)) or not backends or any(
            b not in choices for b in backends):
        raise ValueError(f"backends={backends!r} is invalid; allowed: a non-empty list of "
                         f"{', '.join(repr(b) for b in choices)}")
    options = {f.name for f in dataclasses.fields(TrainConfig)} - {"precision", "backend", "recipe"}
    base = {k: v for k, v in values.items() if k in options}  # the parameters named like trainer options
    if base.get("lr") == "auto":  # trainpair picks it by model size
        del base["lr"]
    for backend in backends:
        TrainConfig(**base, precision="fp8", backend=backend, recipe=values.get("recipe", "auto"))


NOTEBOOK_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "03_train_bf16_vs_fp8": _train_pair_check,  # its parameters are TrainConfig options
}


def check_notebook_semantics(name: str, declared: dict[str, Any], params: dict[str, Any]) -> None:
    """The notebook's own checks on its full parameter set (defaults + given), named as the notebook names them."""
    check = NOTEBOOK_CHECKS.get(name)
    if check is None:
        return
    try:
        check({**declared, **params})
    except ValueError as exc:
        # the trainer says --seq-len; the notebook parameter is seq_len
        msg = re.sub(r"--([a-z0-9-]+)", lambda m: m.group(1).replace("-", "_"), str(exc))
        raise ValueError(f"notebook {name}: parameter {msg}") from None


def parameter_comments(source: str) -> dict[str, str]:
    """``name = value  # comment`` lines of a parameters cell: name -> comment."""
    out = {}
    for line in source.splitlines():
        m = re.match(r"^(\w+)\s*(?::[^=]+)?=.*?#\s*(.+)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


# --------------------------------------------------------------------------------------- a training run

def check_run(c, paths, source: str | None) -> None:
    """Before a training run computes, tokenizes or writes anything: its folders and its data (fp8lab.train)."""
    from fp8lab import data as fdata

    check_writable_dir("--output-dir", paths.output_dir)
    if c.checkpoint_every >= 0:
        check_writable_dir("--checkpoint-dir", paths.checkpoint_dir)
    elif paths.checkpoint_dir.exists() and not paths.checkpoint_dir.is_dir():
        raise ValueError(f"--checkpoint-dir={str(paths.checkpoint_dir)!r} is a file, not a folder")
    if c.save_model:
        check_writable_dir("--model-dir", paths.model_dir)
    check_data_source(source)
    if source is None or not (str(source).startswith("hf:") or fdata.is_prepared(source)):
        check_writable_dir("--output-dir", paths.data_cache)  # text is tokenized there


def check_cli_recipe(c, recipe_given: bool) -> None:
    """``fp8lab train --precision bf16 --recipe X``: with ``--backend auto`` a BF16 run is the plain HF
    model, so the recipe would be silently ignored.

    Not refused: an explicit ``--backend`` (a BF16 run then uses the converted layers that recipe
    picks, as fp8lab.launch and fp8lab.trainpair do for their baselines; SageMaker jobs always pass
    their recipe), and the Python API (TrainConfig keeps accepting it, for those callers)."""
    if recipe_given and c.precision == "bf16" and c.backend == "auto" and c.recipe != "auto":
        raise ValueError(f"--recipe={c.recipe!r} has no effect with --precision bf16 and --backend auto (the plain "
                         "Hugging Face model); allowed: leave --recipe out, --precision fp8, or an FP8 --backend "
                         "(te | torchao | emulated: BF16 on the converted layers that recipe picks)")


class OneLineParser(argparse.ArgumentParser):
    """argparse with one line on a bad option, ``<prog>: error: <message> (see --help)``, and exit code 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
