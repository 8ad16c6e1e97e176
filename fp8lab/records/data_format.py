"""What fp8lab's data looks like on disk, as facts the checks and the folder rules share with the
reader and writer (``fp8lab.data.tokens``): which text files a source names, what marks a prepared token
folder (its manifest's format and version), and whether a run tokenizes its ``--data`` itself.

Nothing here reads tokens or tokenizes; ``fp8lab.data.tokens``, ``fp8lab.data.checks`` and
``fp8lab.records.ownership`` build on it, and it imports none of them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from fp8lab.core.paths import DATA_DIR, shipped_path

CORPUS_DIR = DATA_DIR / "corpus"  # in a checkout; default_corpus() also finds the package's copy
MANIFEST = "manifest.json"
FORMAT = "fp8lab-tokens"
FORMAT_VERSION = 1
TOKEN_DTYPES = ("uint16", "uint32")  # a shard's token ids: uint16 when the vocabulary fits, else uint32 (never signed)
# one document per line: {"text": ...} (source code keeps its blank lines)
JSONL_SUFFIXES = (".jsonl", ".jsonl.xz", ".jsonl.gz")
TEXT_SUFFIXES = (".txt", ".md", ".txt.xz", ".txt.gz", ".md.xz", ".md.gz") + JSONL_SUFFIXES
# what a prepared folder's tokens train: next-token loss on text (pretrain), or instruction examples with the loss on
# the answers only (sft: fp8lab.data.sft); a manifest without "task" is pretrain
PRETRAIN, SFT = "pretrain", "sft"
TASKS = (PRETRAIN, SFT)


def default_corpus() -> list[Path]:
    """The shipped corpus files (sorted, so every machine reads them in the same order)."""
    corpus = shipped_path("corpus")
    files = sorted(p for p in corpus.iterdir() if p.name.endswith(TEXT_SUFFIXES)) if corpus.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no corpus text in {corpus.name}/ (expected kjv.txt.xz; see data/README.md)")
    return files


def text_files(source: str | Path | Iterable[str | Path] | None) -> list[Path]:
    """Resolve a file, a folder (searched recursively) or a list of them into text files, in order."""
    if source is None:
        return default_corpus()
    items = [source] if isinstance(source, (str, Path)) else list(source)
    files: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and q.name.endswith(TEXT_SUFFIXES))
            if not found:
                raise ValueError(f"source folder {p.name!r} holds no text files (accepted: {', '.join(TEXT_SUFFIXES)})")
            files.extend(found)
        elif p.is_file():
            files.append(p)
        elif p.exists():  # a FIFO, device or socket: never opened (a FIFO would block)
            raise ValueError(f"source {str(item)!r} is not a regular file (a FIFO, device or socket); allowed: text "
                             "files or folders")
        else:
            raise ValueError(f"source {str(item)!r} is not an existing file or folder "
                             "(for a Hugging Face dataset write hf:<name>)")
    return files


def is_prepared(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


def tokenized_here(source: str | Path | None) -> bool:
    """A run tokenizes its data itself (into its token cache) unless ``source`` is a prepared token
    folder or a Hugging Face dataset (``hf:<name>``, loaded by ``datasets``); None is the shipped corpus."""
    return source is None or not (str(source).startswith("hf:") or is_prepared(source))


def tokenizer_problem(path: Path) -> str | None:
    """Why ``path`` does not load as a ``tokenizers`` tokenizer.json (the error's kind), or None."""
    from tokenizers import Tokenizer

    if not path.is_file():
        return "not a regular file"
    try:
        Tokenizer.from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the Rust side raises plain Exception
        return type(exc).__name__
    return None
