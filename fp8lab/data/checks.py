"""Data scans: a ``--data`` text file or folder (UTF-8 text, not binary, not empty, enough documents for
a train/validation split) or a prepared folder (a readable manifest whose shards are all there),
checked before any tokenizing; after tokenizing, both splits hold at least one window."""
from __future__ import annotations

import codecs
import gzip
import json
import lzma
import zlib
from pathlib import Path
from typing import Any

from fp8lab.records import data_format as fformat
from fp8lab.records.data_format import tokenizer_problem  # noqa: F401 (also read as data.checks.tokenizer_problem)
from fp8lab.core.probes import check_member
from fp8lab.core.validate import is_count

SCAN_BYTES = 64 << 20  # text read per --data file up front; a decode error past this is caught while tokenizing
# bounds on one line and one "word" (a run without whitespace: one piece for the BPE tokenizer, whose time grows
# faster than its length): checked in the scan and again while tokenizing, so memory and time stay bounded
MAX_LINE_BYTES = 64 << 20
MAX_WORD_CHARS = 1 << 20
# a damaged .xz / .gz, as its reader raises it
ARCHIVE_ERRORS = (lzma.LZMAError, gzip.BadGzipFile, zlib.error, EOFError)


def bounded_lines(fh, who: str):
    """The lines of ``fh`` (bytes or text), each read with a size limit; ValueError naming ``who`` and the
    line when a line or a word in it is longer than the bounds."""
    n = 0
    while True:
        line = fh.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        n += 1
        if len(line) > MAX_LINE_BYTES:
            raise ValueError(f"{who}: line {n} is longer than {MAX_LINE_BYTES >> 20} MiB; allowed: lines (documents) "
                             f"of at most {MAX_LINE_BYTES >> 20} MiB")
        if len(line) > MAX_WORD_CHARS and max(map(len, line.split()), default=0) > MAX_WORD_CHARS:
            raise ValueError(f"{who}: line {n} holds a word (a run without spaces) longer than {MAX_WORD_CHARS:,} "
                             "characters; allowed: text whose words are shorter (split or drop that data)")
        yield line


def document_text(obj, name: str, line_no: int) -> str:
    """The ``text`` of one .jsonl line's object (file ``name``): a string of valid Unicode (no lone surrogates)."""
    where = f"line {line_no} of {name!r}"
    if not isinstance(obj, dict) or "text" not in obj:
        raise ValueError(f"{where} is not a JSON object with a \"text\" string; allowed in .jsonl sources: one "
                         "{\"text\": ...} object per line")
    text = obj["text"]
    if not isinstance(text, str):
        kind = {bool: "true/false", int: "a number", float: "a number", list: "a list",
                dict: "an object"}.get(type(text), "null")
        raise ValueError(f"{where}: field \"text\" is {kind}, not a string; allowed: a string")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{where}: field \"text\" holds a lone surrogate (\\u{ord(text[exc.start]):04x} at character "
                         f"{exc.start}); allowed: valid Unicode text") from None
    return text


def _open_binary(path: Path):
    if path.name.endswith(".xz"):
        return lzma.open(path, "rb")
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def not_utf8(who: str, exc: UnicodeDecodeError, line_no: int) -> ValueError:
    """The one line for a file that is not UTF-8: its first bad byte and line. A UTF-16 file (its byte-order mark)
    gets its own iconv hint: converting it as Latin-1 would garble every character."""
    utf16 = line_no == 1 and exc.start == 0 and bytes(exc.object[:2]) in (b"\xff\xfe", b"\xfe\xff")
    return ValueError(f"{who} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} on line {line_no}"
                      f"{', a UTF-16 byte-order mark' if utf16 else ''}); allowed: UTF-8 text (convert it first, e.g. "
                      f"iconv -f {'utf-16' if utf16 else 'latin1'} -t utf-8)")


def unreadable_archive(who: str, path: Path, exc: BaseException, files: str = "text files") -> ValueError:
    """The one line for a damaged (or mislabelled) .xz / .gz file, ``exc`` being its reader's error."""
    return ValueError(f"{who} is not a readable {path.suffix} archive ({exc}); allowed: {files}, optionally compressed "
                      "with xz or gzip")


def utf8_lines(path: Path, who: str, files: str = "text files"):
    """The lines of a file (an .xz / .gz one decompressed), bounded (:func:`bounded_lines`) and decoded as UTF-8: a
    damaged archive, a byte that is not UTF-8 or a file that cannot be read is a ValueError naming ``who`` and, for a
    decode error, the line, worded as :func:`scan_text_file` words them (``files``: what its "allowed" names)."""
    line_no = 0
    try:
        with _open_binary(path) as fh:
            for raw in bounded_lines(fh, who):
                line_no += 1
                try:
                    text = raw.decode("utf-8")  # whole lines: a multi-byte character never spans two
                except UnicodeDecodeError as exc:
                    raise not_utf8(who, exc, line_no) from None
                yield text
    except ARCHIVE_ERRORS as exc:
        raise unreadable_archive(who, path, exc, files) from None
    except OSError as exc:
        raise ValueError(f"{who} cannot be read ({exc.strerror or exc})") from None


def scan_text_file(path: Path, option: str = "--data", limit: int = SCAN_BYTES) -> int:
    """Documents (blank-line separated blocks) in the first ``limit`` bytes; ValueError if not UTF-8 text."""
    who = f"{option}: file {path.name!r}"
    jsonl = path.name.endswith(fformat.JSONL_SUFFIXES)  # one document per line, blank lines inside it are escaped
    decoder = codecs.getincrementaldecoder("utf-8")()
    docs, in_doc, read, line_no = 0, False, 0, 0
    try:
        with _open_binary(path) as fh:
            head = fh.peek(8192)[:8192] if hasattr(fh, "peek") else b""
            if b"\x00" in head:
                raise ValueError(f"{who} is binary (NUL bytes near its start), not text; allowed: UTF-8 text "
                                 "files (.txt, .md, optionally .xz/.gz) or a prepared folder")
            for raw in bounded_lines(fh, who):
                line_no += 1
                if b"\x00" in raw:
                    raise ValueError(f"{who} is binary (NUL bytes on line {line_no}), not text; "
                                     "allowed: UTF-8 text files (.txt, .md, optionally .xz/.gz) or a prepared folder")
                try:
                    text = decoder.decode(raw)
                except UnicodeDecodeError as exc:
                    raise not_utf8(who, exc, line_no) from None
                if text.strip():
                    docs += jsonl or not in_doc
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
    except ARCHIVE_ERRORS as exc:
        raise unreadable_archive(who, path, exc) from None
    except OSError as exc:
        raise ValueError(f"{who} cannot be read ({exc.strerror or exc})") from None
    if docs == 0:
        raise ValueError(f"{who} is empty (no text); allowed: UTF-8 text with at least one paragraph")
    return docs


def check_data_source(value: str | list | None, option: str = "--data", val_fraction: float = 0.05,
                      scan_tokens: bool = True) -> None:
    """A ``--data`` source (or a list of text sources) is usable before anything is tokenized; None and
    ``hf:`` pass (checked when loaded). ``scan_tokens``: also read a prepared folder's every token id
    (:func:`check_token_ids`; a training job does that once, on rank 0: :func:`scan_token_ids`)."""
    if isinstance(value, str) and value.startswith("hf:"):
        import importlib.util

        if importlib.util.find_spec("datasets") is None:
            raise ValueError(f"{option}={value!r} is a Hugging Face dataset, which needs the 'datasets' package (not "
                             "installed: pip install datasets) and the network; allowed: local text files or a "
                             "prepared folder")
        return
    if value is None:
        return
    if isinstance(value, (str, Path)) and fformat.is_prepared(value):
        check_prepared_folder(Path(value), option, scan_tokens)
        return
    try:
        files = fformat.text_files(value)
    except ValueError as exc:
        raise ValueError(f"{option}={value if isinstance(value, list) else str(value)!r}: {exc}") from None
    seen: set[Path] = set()
    for f in files:
        if f.resolve() in seen:
            raise ValueError(f"{option}: file {f.name!r} is given twice (its documents would be trained on twice); "
                             "allowed: each file once")
        seen.add(f.resolve())
    docs = sum(scan_text_file(f, option) for f in files)
    # every need-th document goes to validation (fp8lab.data.tokens.prepare_data)
    need = max(2, round(1 / val_fraction))
    if docs < need:
        names = ", ".join(repr(f.name) for f in files[:3]) + (" ..." if len(files) > 3 else "")
        raise ValueError(f"{option}: {names} hold(s) {docs} document(s) (paragraphs separated by blank lines); "
                         f"allowed: at least {need}, since every {need}th goes to the validation split")


def check_prepared_folder(folder: Path, option: str = "--data", scan_tokens: bool = True) -> dict[str, Any]:
    """A prepared folder's manifest parses, has the expected format, and its shards and tokenizer exist;
    with ``scan_tokens`` every token id is below its vocab_size (:func:`check_token_ids`)."""
    mpath = folder / fformat.MANIFEST
    who = f"{option}: {fformat.MANIFEST} in {folder.name!r}"
    try:
        m = json.loads(mpath.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{who} is not valid JSON (line {exc.lineno}: {exc.msg}); allowed: a folder written by "
                         "fp8lab prepare-data (re-create it), or text files") from None
    except (UnicodeDecodeError, OSError) as exc:
        raise ValueError(f"{who} cannot be read ({type(exc).__name__}); allowed: a folder written by fp8lab "
                         "prepare-data") from None
    if not isinstance(m, dict) or m.get("format") != fformat.FORMAT or m.get("version") != fformat.FORMAT_VERSION:
        got = (m.get("format"), m.get("version")) if isinstance(m, dict) else type(m).__name__
        raise ValueError(f"{who} is not an {fformat.FORMAT} v{fformat.FORMAT_VERSION} manifest (found {got}); "
                         "allowed: a folder written by fp8lab prepare-data")
    if m.get("dtype") not in fformat.TOKEN_DTYPES:
        raise ValueError(f"{who} has dtype={m.get('dtype')!r}; allowed: {' | '.join(fformat.TOKEN_DTYPES)} (what "
                         "fp8lab prepare-data writes; re-create the folder with it)")
    try:
        itemsize = __import__("numpy").dtype(m["dtype"]).itemsize
        shards = [(s["file"], int(s["tokens"])) for split in ("train", "val") for s in m["splits"][split]["shards"]]
        tokenizer = m["tokenizer"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{who} lacks {exc} or has a wrong type there; allowed: a folder written by fp8lab "
                         "prepare-data") from None
    for name in [n for n, _ in shards] + [tokenizer]:
        check_member(folder, name, option)
    for name, tokens in shards:
        f = folder / name
        if not f.is_file() or f.stat().st_size < tokens * itemsize:
            raise ValueError(f"{option}: shard {name!r} in {folder.name!r} is missing or shorter than its manifest "
                             f"says ({tokens} tokens); re-create the folder with fp8lab prepare-data")
    if not (folder / tokenizer).is_file():
        raise ValueError(f"{option}: {tokenizer!r} (the tokenizer) is missing from {folder.name!r}")
    why = tokenizer_problem(folder / tokenizer)
    if why:
        raise ValueError(f"{option}: {tokenizer!r} in {folder.name!r} does not load as a tokenizer ({why}); allowed: a "
                         "folder written by fp8lab prepare-data (re-create it)")
    if scan_tokens:
        check_token_ids(folder, m, option)
    return m


def scan_token_ids(source: str | Path | None, option: str = "--data") -> None:
    """The token-id scan of a ``--data`` that is a prepared folder (already checked without it by
    :func:`check_prepared_folder`); other sources are tokenized by the run itself, nothing to scan."""
    if source is None or not fformat.is_prepared(source):
        return
    folder = Path(source)
    check_token_ids(folder, json.loads((folder / fformat.MANIFEST).read_text(encoding="utf-8")), option)


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
