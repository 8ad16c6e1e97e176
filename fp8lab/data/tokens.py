"""Real text in, fixed-length token windows out: the tokenizer, the token shards and the loader.

Loss curves only mean something on real text, so the project ships a public-domain English
corpus (the King James Bible, ``data/corpus/kjv.txt.xz``, see ``data/README.md``) and byte-level
BPE tokenizers trained on it with Hugging Face ``tokenizers``.

Pipeline::

    text files / HF dataset --prepare_data--> <dir>/manifest.json + train_00000.bin ... + val_00000.bin
    <dir> --TokenLoader(seed, rank, world_size)--> [micro_batch, seq_len] input / target tensors

(``fp8lab prepare-data`` and what a run reads, a model's own tokenizer or instruction data included, are
fp8lab.data.run_data's.)

The prepared folder is self-contained (it carries its tokenizer) and is what a SageMaker job
receives as its ``train`` input channel. Sampling is a pure function of (seed, sample index),
so a loader resumes at an exact position and N ranks together read exactly the windows one
process would read with an N-times larger batch.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import lzma
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from fp8lab.records.data_format import (  # noqa: F401 - the on-disk facts, re-exported where they were
    CORPUS_DIR, FORMAT, FORMAT_VERSION, JSONL_SUFFIXES, MANIFEST, PRETRAIN, TEXT_SUFFIXES, TOKEN_DTYPES, default_corpus,
    is_prepared, text_files, tokenized_here,
)
from fp8lab.data import checks as data_checks
from fp8lab.records import ownership, runlock
from fp8lab.core.validate import Check, is_count
from fp8lab.core.paths import shipped_path
from fp8lab.core.probes import check_member

EOS_TOKEN = "<|endoftext|>"  # appended after every document, so windows can span documents
DEFAULT_VOCAB = 32000  # Llama-2's vocabulary size: the 1B/7B models' embedding tables have 32000 rows
SHIPPED_VOCABS = (32000, 512)  # 512: the tiny test models' vocabulary (fp8lab.model.models llama-tiny/gptneo-tiny)
# the manifest's "tokenizer_source" for fp8lab's own BPE (a model folder's own: fp8lab.data.model_tokenizer.source)
BPE_SOURCE = {"kind": "fp8lab-bpe"}


# ----------------------------------------------------------------------------- text sources

def _open_text(path: Path):
    if path.name.endswith(".xz"):
        return lzma.open(path, "rt", encoding="utf-8")
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _jsonl_documents(path: Path) -> Iterator[str]:
    """The ``text`` of each line of a JSON-lines file (one whole document per line, e.g. a source file)."""
    who = f"file {path.name!r}"
    with _open_text(path) as fh:
        for n, line in enumerate(data_checks.bounded_lines(fh, who), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                obj = None
            text = data_checks.document_text(obj, path.name, n)
            if text.strip():
                yield text


def read_documents(files: Iterable[Path]) -> Iterator[str]:
    """Documents from text files: blocks separated by blank lines (one chapter each in the KJV); in
    ``.jsonl`` files one line each (JSONL_SUFFIXES). A damaged archive, a line or word past the bounds
    of fp8lab.data.checks, or a decode error is a ValueError naming the file."""
    for path in files:
        try:
            yield from _file_documents(Path(path))
        except data_checks.ARCHIVE_ERRORS as exc:
            raise ValueError(f"file {Path(path).name!r} is not a readable {Path(path).suffix} archive ({exc}); "
                             "allowed: text files, optionally compressed with xz or gzip") from None
        except UnicodeDecodeError as exc:  # name the file, not only the codec
            raise ValueError(f"text file {Path(path).name!r} is not UTF-8 ({exc.reason} at byte {exc.start} of a "
                             "read block); allowed: UTF-8 text") from None


def _file_documents(path: Path) -> Iterator[str]:
    if path.name.endswith(JSONL_SUFFIXES):
        yield from _jsonl_documents(path)
        return
    block: list[str] = []
    with _open_text(path) as fh:
        for line in data_checks.bounded_lines(fh, f"file {path.name!r}"):
            line = line.rstrip("\n")
            if line.strip():
                block.append(line)
            elif block:
                yield "\n".join(block)
                block = []
    if block:
        yield "\n".join(block)


def _is_hf(source: Any) -> bool:
    """Hugging Face datasets are named explicitly, ``hf:<name>``, so a mistyped path is never sent to the Hub."""
    return isinstance(source, str) and source.startswith("hf:")


def _hf_documents(name: str, split: str, text_field: str) -> Iterator[str]:
    """Documents of a Hugging Face dataset; a clear error when the package or the network is missing."""
    try:
        import datasets  # optional: not a project dependency
    except ImportError:
        raise RuntimeError(
            f"source hf:{name} is a Hugging Face dataset; loading it needs the "
            "'datasets' package (pip install datasets) and network access to the Hub. Offline, pass local text files."
        ) from None
    try:
        ds = datasets.load_dataset(name, split=split)
    except Exception as exc:  # offline, unknown name, gated: say which and how to proceed
        raise RuntimeError(
            f"could not load Hugging Face dataset {name!r} (split {split!r}): {type(exc).__name__}: {exc}. "
            "Without network access, pass local text files as the source."
        ) from None
    if text_field not in ds.column_names:
        raise ValueError(f"text_field {text_field!r} not in dataset {name!r}; columns: {', '.join(ds.column_names)}")
    for row in ds:
        text = row[text_field]
        if text and text.strip():
            yield text


# ----------------------------------------------------------------------------- tokenizer

def train_tokenizer(source: Any = None, vocab_size: int = DEFAULT_VOCAB, out_path: str | Path | None = None):
    """Train a byte-level BPE tokenizer (GPT-2 style, plus ``<|endoftext|>``) on local text.

    Deterministic: the same text and vocab_size give the same tokenizer file, which is how the
    shipped ``data/tokenizer*.json`` were made. When the corpus runs out of pairs to merge the
    vocabulary stops short of ``vocab_size`` (the KJV saturates at about 21k); ids then stay
    below the model's vocabulary, which is all the embedding table needs.
    """
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 258:
        raise ValueError("vocab_size must be an integer >= 258 (256 bytes + <|endoftext|> + 1 merge), got "
                         f"{vocab_size!r}")
    files = text_files(source)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(read_documents(files), trainer)
    if out_path is not None:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(out_path))
    return tok


def shipped_tokenizer_path(vocab_size: int = DEFAULT_VOCAB) -> Path:
    """Where the shipped tokenizer for a vocabulary size lives (tokenizer.json is the 32000 one)."""
    name = "tokenizer.json" if vocab_size == DEFAULT_VOCAB else f"tokenizer-{vocab_size}.json"
    return shipped_path(name)


def load_tokenizer(tokenizer: Any = None, vocab_size: int = DEFAULT_VOCAB):
    """A ``tokenizers.Tokenizer`` from an object, a ``tokenizer.json`` path, or the shipped one.

    With ``tokenizer=None`` the shipped tokenizer for ``vocab_size`` is used; sizes not shipped are
    trained on the shipped corpus (about a second, deterministic).
    """
    from tokenizers import Tokenizer

    if tokenizer is None:
        path = shipped_tokenizer_path(vocab_size)
        if path.is_file():
            return Tokenizer.from_file(str(path))
        return train_tokenizer(None, vocab_size)
    if isinstance(tokenizer, Tokenizer):
        return tokenizer
    p = Path(tokenizer)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise ValueError(f"tokenizer {str(tokenizer)!r} is not a tokenizer.json file or a folder holding one")
    why = data_checks.tokenizer_problem(p)
    if why:
        raise ValueError(f"--tokenizer={str(tokenizer)!r} does not load as a tokenizer ({why}); allowed: a "
                         "tokenizer.json written by the tokenizers library (e.g. fp8lab.data.tokens.train_tokenizer)")
    return Tokenizer.from_file(str(p))


# ----------------------------------------------------------------------------- preparing shards

def _dtype_for(vocab_size: int) -> np.dtype:
    return np.dtype(TOKEN_DTYPES[0] if vocab_size <= 2**16 else TOKEN_DTYPES[1])


class _ShardWriter:
    """Append token ids to fixed-size shard files ``<split>_00000.bin``... and remember their sizes."""

    def __init__(self, out_dir: Path, split: str, dtype: np.dtype, shard_tokens: int):
        self.out_dir, self.split, self.dtype, self.shard_tokens = out_dir, split, dtype, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self._fh = None
        self._n = 0
        self.documents = 0

    def _open(self) -> None:
        name = f"{self.split}_{len(self.shards):05d}.bin"
        self._fh = ownership.new_file(self.out_dir / name)  # O_EXCL: never over a file, never through a link
        ownership.record(self.out_dir, name, pending=True)
        self.shards.append({"file": name, "tokens": 0})
        self._n = 0

    def write(self, ids: np.ndarray) -> None:
        self.documents += 1
        while len(ids):
            if self._fh is None or self._n >= self.shard_tokens:
                self.close()
                self._open()
            take = ids[: self.shard_tokens - self._n]
            try:
                self._fh.write(take.astype(self.dtype).tobytes())
            except OSError as exc:  # a full disk, a file-size limit: the error names the shard
                raise OSError(exc.errno, exc.strerror, str(self.out_dir / self.shards[-1]["file"])) from None
            self._n += len(take)
            self.shards[-1]["tokens"] = self._n
            ids = ids[len(take):]

    def close(self) -> None:
        if self._fh is not None:
            fh, self._fh = self._fh, None
            try:
                fh.close()
            except OSError as exc:  # its last bytes did not fit: the error names the shard
                raise OSError(exc.errno, exc.strerror, str(self.out_dir / self.shards[-1]["file"])) from None

    @property
    def tokens(self) -> int:
        return sum(s["tokens"] for s in self.shards)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# a shard holds at least this many tokens (one file per token would be a file system's worst case), and a
# vocabulary spans the 256 bytes plus the end-of-text token, at most what uint32 ids and a trained BPE reach
SHARD_TOKENS = Check(lambda v: is_count(v, 1000) and v <= 1 << 40,
                     "an integer from 1000 to 2**40 (tokens per shard file)")
VOCAB_SIZE = Check(lambda v: is_count(v, 257) and v <= 1 << 22, "an integer from 257 to 4194304 (2**22)")
VAL_FRACTION = Check(lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 0.5,
                     "a number in (0, 0.5) (val_fraction: the share held out for the validation loss)")


def _check_prepare_args(val_fraction: Any, shard_tokens: Any) -> None:
    """Reject a ``val_fraction`` outside (0, 0.5) or a ``shard_tokens`` that is not a positive integer."""
    if not VAL_FRACTION(val_fraction):
        raise ValueError(f"--val-fraction={val_fraction!r} is invalid; allowed: {VAL_FRACTION.allowed}")
    if not SHARD_TOKENS(shard_tokens):
        raise ValueError(f"--shard-tokens={shard_tokens!r} is invalid; allowed: {SHARD_TOKENS.allowed}")


def _check_vocab_size(vocab_size: Any) -> None:
    if not VOCAB_SIZE(vocab_size):
        raise ValueError(f"--vocab-size={vocab_size!r} is invalid; allowed: {VOCAB_SIZE.allowed}")


def source_digest(files: Iterable[Path]) -> str:
    """sha256 over the text files' names and bytes, in order: the source's identity."""
    h = hashlib.sha256()
    for path in files:
        h.update(Path(path).name.encode() + b"\0")
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def describe_source(source: Any, hf_split: str = "train", text_field: str = "text") -> dict[str, Any]:
    """The manifest's ``source``: local files by name and content digest (no machine paths), or the dataset."""
    if not _is_hf(source):
        files = text_files(source)
        return {"kind": "local", "files": [p.name for p in files], "sha256": source_digest(files)}
    return {"kind": "huggingface", "dataset": source[3:], "split": hf_split, "text_field": text_field}


def _source_documents(source: Any, hf_split: str, text_field: str) -> tuple[Iterable[str], dict[str, Any]]:
    """The documents of ``source`` (local files or ``hf:<name>``) and its description for the manifest."""
    docs = read_documents(text_files(source)) if not _is_hf(source) else _hf_documents(source[3:], hf_split, text_field)
    return docs, describe_source(source, hf_split, text_field)


def identity(manifest: dict[str, Any]) -> str:
    """A short digest of what a prepared folder's tokens are: source (content digest for local text),
    tokenizer and token counts; the same wherever the folder is (a checkpoint's fingerprint holds it)."""
    key = {"source": manifest["source"], "tokenizer_sha256": manifest.get("tokenizer_sha256"),
           "tokens": {s: v["tokens"] for s, v in manifest["splits"].items()}}
    # a model's own tokenizer and instruction data are other data (keys absent for BPE text: identities unchanged)
    if manifest.get("tokenizer_source", BPE_SOURCE) != BPE_SOURCE:
        key["tokenizer_source"] = manifest["tokenizer_source"]
    if manifest.get("task", PRETRAIN) != PRETRAIN:
        key["task"] = manifest["task"]
    return "sha256:" + hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def corpus_record(data_dir: str | Path) -> dict[str, Any]:
    """What a result file says about the prepared corpus a run read: its name, identity, source, token counts
    (train, val), documents and tokenizer."""
    m = read_manifest(data_dir)
    return {"name": Path(data_dir).name, "identity": identity(m), "source": m["source"],
            "train_tokens": m["splits"]["train"]["tokens"], "val_tokens": m["splits"]["val"]["tokens"],
            "documents": m["documents"], "tokenizer_sha256": m["tokenizer_sha256"]}


def _fresh_writers(out: Path, dtype: np.dtype, shard_tokens: int) -> dict[str, _ShardWriter]:
    """Claim ``out`` (refused when it holds files fp8lab did not write: fp8lab.records.ownership), remove an
    earlier preparation's own files, and make a shard writer for each split."""
    ownership.refuse_foreign("out_dir", out, "tokens")
    ownership.remove_own(out, "tokens")
    ownership.claim(out, "tokens")
    return {s: _ShardWriter(out, s, dtype, shard_tokens) for s in ("train", "val")}


def _write_documents(docs: Iterable[str], tok: Any, eos: int, writers: dict[str, _ShardWriter], every: int,
                     batch_documents: int) -> int:
    """Tokenize ``docs`` in batches, every ``every``-th into val, the rest into train; returns the count."""

    def flush(batch: list[str], first_index: int) -> None:
        # no special tokens a model's tokenizer would add (a BOS per document): documents are joined by eos only
        for i, enc in enumerate(tok.encode_batch(batch, add_special_tokens=False)):
            ids = np.asarray(enc.ids + [eos], dtype=np.int64)
            split = "val" if (first_index + i) % every == every - 1 else "train"
            writers[split].write(ids)

    batch: list[str] = []
    index = 0
    for doc in docs:
        batch.append(doc)
        if len(batch) >= batch_documents:
            flush(batch, index)
            index += len(batch)
            batch = []
    if batch:
        flush(batch, index)
        index += len(batch)
    for w in writers.values():
        w.close()
    return index


def _write_manifest(out: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest.json`` into ``out`` atomically (a temporary file, then a rename)."""
    ownership.write_file(out / MANIFEST, json.dumps(manifest, indent=2) + "\n")
    shards = [sh["file"] for sp in manifest["splits"].values() for sh in sp["shards"]]
    ownership.record(out, MANIFEST, manifest["tokenizer"], *shards)  # fp8lab's files, with their digests


def prepare_data(
    source: Any = None,
    out_dir: str | Path = "prepared",
    tokenizer: Any = None,
    val_fraction: float = 0.05,
    *,
    vocab_size: int = DEFAULT_VOCAB,
    shard_tokens: int = 1 << 26,
    hf_split: str = "train",
    text_field: str = "text",
    batch_documents: int = 2048,
    tokenizer_source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokenize documents into memmap-able shards plus ``manifest.json``; returns the manifest.

    ``source``: None (the shipped corpus), local text files/folders (.txt, .md, optionally .xz/.gz),
    or ``hf:<dataset name>`` (needs ``datasets`` and the network; a clear error otherwise).
    Every ``round(1/val_fraction)``-th document goes to the validation split, so both splits cover
    the whole corpus. Ids are stored as uint16 when the vocabulary fits, else uint32.
    ``tokenizer`` may also be a transformers fast tokenizer (a model's own: fp8lab.data.model_tokenizer), whose
    ``eos_token`` ends each document; ``tokenizer_source`` is then what the manifest records about it.
    """
    _check_prepare_args(val_fraction, shard_tokens)
    if tokenizer is None:
        _check_vocab_size(vocab_size)
    docs, source_desc = _source_documents(source, hf_split, text_field)
    if hasattr(tokenizer, "backend_tokenizer"):  # a transformers fast tokenizer: its Rust tokenizer, as it encodes
        tok, eos, n_vocab = backend_of(tokenizer), tokenizer.eos_token_id, len(tokenizer)
        if eos is None:
            raise ValueError(f"the model's tokenizer ({type(tokenizer).__name__}) has no eos_token, which ends each "
                             "document; allowed: a tokenizer with an eos_token (tokenizer_config.json)")
    else:
        tok = load_tokenizer(tokenizer, vocab_size)
        eos = tok.token_to_id(EOS_TOKEN)
        if eos is None:
            raise ValueError(f"tokenizer has no {EOS_TOKEN!r} token (train it with fp8lab.data.tokens.train_tokenizer)")
        n_vocab = tok.get_vocab_size()
    dtype = _dtype_for(n_vocab)
    out = Path(out_dir)
    ownership.refuse_foreign("out_dir", out, "tokens")
    out.mkdir(parents=True, exist_ok=True)
    # one writer at a time, and none while a training run reads the folder (fp8lab.records.runlock.acquire_shared)
    lock = runlock.acquire("OUT_DIR", out, user="prepare-data")
    try:
        return _prepare_into(out, docs, source_desc, tok, eos, dtype, n_vocab, val_fraction, shard_tokens,
                             batch_documents, tokenizer_source or BPE_SOURCE)
    finally:
        lock.release()


def backend_of(tokenizer):
    """A transformers fast tokenizer's Rust tokenizer, as a copy without truncation or padding (a saved
    tokenizer.json may carry either; documents are encoded whole)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    tok.no_truncation()
    tok.no_padding()
    return tok


def _prepare_into(out: Path, docs, source_desc, tok, eos, dtype, n_vocab, val_fraction, shard_tokens,
                  batch_documents, tokenizer_source) -> dict[str, Any]:
    writers = _fresh_writers(out, dtype, shard_tokens)
    try:
        index = _write_documents(docs, tok, eos, writers, max(2, round(1 / val_fraction)), batch_documents)
        if writers["val"].tokens == 0 or writers["train"].tokens == 0:
            raise ValueError(f"source has too few documents ({index}) for a train/val split with "
                             f"val_fraction={val_fraction}")
        ownership.write_file(out / "tokenizer.json", tok.to_str())
        return _finish_manifest(out, tok, eos, dtype, n_vocab, source_desc, val_fraction, index, writers,
                                tokenizer_source)
    except BaseException:
        _abandon(out, writers.values())
        raise


def _abandon(out: Path, writers: Iterable[_ShardWriter]) -> None:
    """A preparation that failed (a full disk, a size limit, Ctrl-C): no partial shard stays behind (no manifest:
    not prepared). Each writer is closed, an error closing it ignored (the same full disk: the shard goes in any
    case), then fp8lab's own files in ``out`` are removed."""
    for w in writers:
        try:
            w.close()
        except OSError:
            pass
    ownership.remove_own(out, "tokens")


def _finish_manifest(out: Path, tok, eos, dtype, n_vocab, source_desc, val_fraction, index, writers,
                     tokenizer_source) -> dict[str, Any]:
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "dtype": dtype.name,
        "vocab_size": n_vocab,  # the tokenizer's real size: a model needs at least this many rows
        "eos_id": eos,
        "tokenizer": "tokenizer.json",
        "tokenizer_sha256": _sha256(out / "tokenizer.json"),
        "tokenizer_source": tokenizer_source,
        "task": PRETRAIN,
        "source": source_desc,
        "val_fraction": val_fraction,
        "documents": index,
        "splits": {s: {"tokens": w.tokens, "documents": w.documents, "shards": w.shards} for s, w in writers.items()},
    }
    _write_manifest(out, manifest)
    return manifest


def read_manifest(data_dir: str | Path) -> dict[str, Any]:
    """The manifest of a prepared folder, checked for the format this module writes."""
    p = Path(data_dir) / MANIFEST
    if not p.is_file():
        raise ValueError(f"data folder {str(data_dir)!r} has no {MANIFEST}; make one with "
                         "fp8lab.data.tokens.prepare_data")
    m = json.loads(p.read_text())
    if m.get("format") != FORMAT or m.get("version") != FORMAT_VERSION:
        raise ValueError(f"{p.name}: not an {FORMAT} v{FORMAT_VERSION} manifest (format={m.get('format')!r}, "
                         f"version={m.get('version')!r})")
    return m


# ----------------------------------------------------------------------------- reading and sampling

class TokenShards:
    """The token stream of one split, read through read-only memmaps (nothing loaded up front)."""

    def __init__(self, data_dir: str | Path, split: str = "train"):
        self.dir = Path(data_dir)
        self.manifest = read_manifest(self.dir)
        if split not in self.manifest["splits"]:
            raise ValueError(f"split must be one of {', '.join(self.manifest['splits'])}, got {split!r}")
        dtype = np.dtype(self.manifest["dtype"])
        self.arrays = [
            np.memmap(check_member(self.dir, s["file"]), dtype=dtype, mode="r", shape=(s["tokens"],))
            for s in self.manifest["splits"][split]["shards"] if s["tokens"] > 0
        ]
        self.starts = np.cumsum([0] + [len(a) for a in self.arrays])

    def __len__(self) -> int:
        return int(self.starts[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) as int64, across shard boundaries."""
        if start < 0 or start + length > len(self):
            raise IndexError(f"tokens [{start}, {start + length}) outside the split's {len(self)} tokens")
        out = np.empty(length, dtype=np.int64)
        filled = 0
        i = int(np.searchsorted(self.starts, start, side="right") - 1)
        while filled < length:
            lo = start + filled - self.starts[i]
            take = min(length - filled, len(self.arrays[i]) - lo)
            out[filled:filled + take] = self.arrays[i][lo:lo + take]
            filled += take
            i += 1
        return out


@dataclass(frozen=True)
class LoaderState:
    """Where a loader is: the number of sequences the whole job has consumed (all ranks)."""

    seed: int
    position: int


class TokenLoader:
    """Fixed-length windows in a seeded random order, split across ranks, resumable exactly.

    The split is cut into non-overlapping windows of ``seq_len + 1`` tokens. Epoch ``e`` visits
    them in the order of a permutation drawn from ``(seed, e)``; global sample ``g`` is window
    ``perm_e[g % n]`` with ``e = g // n``. A micro-batch on rank ``r`` takes samples
    ``position + r * B ... + B - 1`` and the position moves by ``world_size * B``: so the samples
    of one optimizer step are the same whatever the split into ranks and accumulation steps, and
    ``state_dict()`` (one integer) is all a checkpoint needs. ``shuffle=False`` reads windows in
    order (validation).
    """

    def __init__(self, data_dir: str | Path, split: str, seq_len: int, micro_batch_size: int, *,
                 seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = True):
        self._start(seq_len, micro_batch_size, seed, rank, world_size, shuffle)
        self.tokens = TokenShards(data_dir, split)
        self.num_windows = (len(self.tokens) - 1) // seq_len
        if self.num_windows < 1:
            raise ValueError(f"split {split!r} has {len(self.tokens)} tokens: too few for one window of "
                             f"seq_len={seq_len} (+1)")

    def _start(self, seq_len: int, micro_batch_size: int, seed: int, rank: int, world_size: int,
               shuffle: bool) -> None:
        """Check the layout's arguments (each by name) before any file is read, and start at position 0: shared
        with the loaders that serve other samples in this order (fp8lab.data.sft.SFTLoader's packed rows)."""
        for name, v in (("seq_len", seq_len), ("micro_batch_size", micro_batch_size), ("world_size", world_size)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank!r}")
        self.seq_len, self.batch, self.seed = seq_len, micro_batch_size, int(seed)
        self.rank, self.world_size, self.shuffle = rank, world_size, shuffle
        self.position = 0
        self._perm_epoch = -1
        self._perm: np.ndarray | None = None

    @property
    def vocab_size(self) -> int:
        return int(self.tokens.manifest["vocab_size"])

    def _window(self, sample: int) -> int:
        epoch, i = divmod(sample, self.num_windows)
        if not self.shuffle:
            return i
        if epoch != self._perm_epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm, self._perm_epoch = rng.permutation(self.num_windows), epoch
        return int(self._perm[i])

    def sample_indices(self) -> list[int]:
        """The global sample numbers this rank's next micro-batch will hold (for tests and logs)."""
        first = self.position + self.rank * self.batch
        return list(range(first, first + self.batch))

    def next_batch(self):
        """(input_ids, labels) as int64 tensors of shape [micro_batch_size, seq_len]; advances."""
        import torch

        rows = [self.tokens.read(self._window(g) * self.seq_len, self.seq_len + 1) for g in self.sample_indices()]
        self.position += self.world_size * self.batch
        arr = torch.from_numpy(np.stack(rows))
        return arr[:, :-1].contiguous(), arr[:, 1:].contiguous()

    def __iter__(self):
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"loader state has seed {state['seed']}, this loader {self.seed}: resuming would change "
                             "the data order")
        self.position = int(state["position"])

    @property
    def epoch(self) -> float:
        """Epochs of the split consumed so far (fractional)."""
        return self.position / self.num_windows


def ensure_prepared(data: str | Path | None, cache_dir: str | Path, vocab_size: int) -> Path:
    """A prepared folder for ``data``: used as is when it has a manifest, else prepared into cache_dir.

    ``data=None`` means the shipped corpus with the shipped tokenizer whose vocabulary fits the
    model (``min(vocab_size, 32000)`` rows; 512 for the tiny models). The cache is reused when it
    holds the same source (by content digest); else re-prepared, replacing only fp8lab's own files
    (a cache folder holding anything else is refused: fp8lab.records.ownership).
    """
    if data is not None and is_prepared(data):
        return Path(data)
    cache = Path(cache_dir)
    if reusable_cache(cache, data, vocab_size):
        return cache
    prepare_data(data, cache, None, vocab_size=min(vocab_size, DEFAULT_VOCAB))
    return cache


def reusable_cache(cache: str | Path, source: Any, vocab_size: int, *, tokenizer_source: dict[str, Any] | None = None,
                   task: str = PRETRAIN) -> bool:
    """``cache`` is a prepared folder holding ``source``'s tokens (the same content digest, or the same Hugging Face
    dataset) for ``task``, made by the tokenizer ``tokenizer_source`` (None: fp8lab's BPE) with at most
    ``vocab_size`` tokens: reused as it is. The one rule for every prepared cache (fp8lab's BPE here, a model's own
    tokenizer or instruction data in fp8lab.data.run_data), so the two never disagree on when a cache is stale. The
    source is compared last: its digest costs a pass over its bytes."""
    if not is_prepared(cache):
        return False
    m = read_manifest(cache)
    wanted = BPE_SOURCE if tokenizer_source is None else tokenizer_source
    return (m.get("tokenizer_source", BPE_SOURCE) == wanted and m.get("task", PRETRAIN) == task
            and m["vocab_size"] <= vocab_size and m["source"] == describe_source(source))


def tokens_per_epoch(data_dir: str | Path, split: str = "train") -> int:
    return len(TokenShards(data_dir, split))


def describe(data_dir: str | Path) -> str:
    """One line about a prepared folder, for logs."""
    m = read_manifest(data_dir)
    t, v = m["splits"]["train"]["tokens"], m["splits"]["val"]["tokens"]
    src = m["source"].get("files") or m["source"].get("dataset")
    return (f"data: {src} | vocab {m['vocab_size']} ({m['dtype']}) | train {t} tokens, val {v} tokens | "
            f"{math.ceil(m['documents'])} documents")
