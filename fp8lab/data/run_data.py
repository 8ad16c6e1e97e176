"""What a run reads, by its task and its model's tokenizer: the prepared folder (made once, reused while the source,
the tokenizer and the task are the same), the checks on it, and its loader; and ``fp8lab prepare-data``.

* ``--task pretrain`` with fp8lab's BPE tokenizer: ``fp8lab.data.tokens`` as before;
* ``--task pretrain`` with a model folder's own tokenizer (fp8lab.data.model_tokenizer): the same shards, tokenized
  by that tokenizer, its end-of-text token between documents;
* ``--task sft``: instruction records (fp8lab.data.sft), with the model's tokenizer and chat template where its
  folder has them.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import sys
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

from fp8lab.core.probes import check_writable_dir
from fp8lab.core.validate import OneLineParser, parse_count
from fp8lab.data import checks as data_checks
from fp8lab.data import model_tokenizer
from fp8lab.data import sft
from fp8lab.data import tokens as fdata
from fp8lab.records import ownership
from fp8lab.records.data_format import PRETRAIN, SFT, TASKS, is_prepared


def task_of(manifest: dict[str, Any]) -> str:
    """The task a prepared folder's tokens are for (older manifests: pretrain)."""
    return manifest.get("task", PRETRAIN)


def check_source(source: Any, task: str, model: str | None, vocab_size: int, option: str = "--data",
                 scan_tokens: bool = True) -> None:
    """Before anything is tokenized or built: the data for the task (text, instruction records, or a prepared folder
    of that task) and, where the run tokenizes with the model folder's tokenizer, that it loads and fits the model's
    ``vocab_size``."""
    if task == SFT:
        sft.check_source(source, option)
    else:
        data_checks.check_data_source(source, option, scan_tokens=scan_tokens)
        if source is not None and is_prepared(source):
            theirs = task_of(fdata.read_manifest(source))  # (the folder was checked just now)
            if theirs != PRETRAIN:
                raise ValueError(f"{option}={str(source)!r} holds tokens prepared for --task {theirs}; allowed: "
                                 f"--task {theirs}, or text / a folder prepared for pretraining")
    if (source is None or not is_prepared(source)) and model_tokenizer.folder(model) is not None:
        model_tokenizer.check_fits(model, model_tokenizer.load(model, vocab_size), vocab_size)


def ensure_prepared(data: Any, cache_dir: str | Path, vocab_size: int, *, model: str | None = None,
                    task: str = PRETRAIN, val_fraction: float = 0.05,
                    accept: Callable[[Path], None] | None = None) -> Path:
    """The prepared folder a run reads: ``data`` itself when prepared, else ``cache_dir``, reused when it holds the
    same source, tokenizer and task, else prepared there (fp8lab's own files replaced, nobody else's).

    ``accept``: where the cache holds another preparation, the new tokens are written into a temporary folder beside
    it and ``accept(folder)`` is called (a ValueError refuses them); only then do they replace the cache's, so a run
    refused for its data (another corpus than its checkpoint's, an example too long) leaves the cache as it was.

    Such temporary folders beside ``cache`` that a process of this host left when it died (a kill -9 mid-way) are
    removed first, fp8lab's own files in them (_remove_stale_temp_folders); those of a live process are kept."""
    if data is not None and is_prepared(data):
        return Path(data)
    cache = Path(cache_dir)
    _remove_stale_temp_folders(cache)
    if accept is None or not is_prepared(cache):
        return _prepare_or_reuse(data, cache, vocab_size, model, task, val_fraction)
    if _reusable(data, cache, vocab_size, model, task):  # (the source's digest read once)
        return cache
    staged = _temp_folder(cache, "")
    try:
        _prepare_or_reuse(data, staged, vocab_size, model, task, val_fraction)
        accept(staged)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)  # made here and now: nothing in it is anyone else's
        raise
    _swap_in(staged, cache)
    return cache


def _reusable(data: Any, cache: Path, vocab_size: int, model: str | None, task: str) -> bool:
    """``cache`` holds ``data``'s tokens for this task and the model's tokenizer: reused as it is (by the rule
    fp8lab.data.tokens.reusable_cache, which its ensure_prepared applies to fp8lab's BPE too)."""
    return fdata.reusable_cache(cache, _files(data, task), vocab_size, tokenizer_source=model_tokenizer.source(model),
                                task=task)


def _files(data: Any, task: str) -> Any:
    """What a source is read as: a Hugging Face dataset (``hf:``) as named, else its text files (None: the shipped
    corpus, or for sft the shipped instruction set)."""
    hub = isinstance(data, str) and data.startswith("hf:")  # a Hugging Face dataset: read by prepare_data itself
    return data if hub else fdata.text_files(sft.shipped() if task == SFT and data is None else data)


def _prepare_or_reuse(data: Any, cache: Path, vocab_size: int, model: str | None, task: str,
                      val_fraction: float) -> Path:
    wanted = model_tokenizer.source(model)
    if task == PRETRAIN and wanted == fdata.BPE_SOURCE:
        return fdata.ensure_prepared(data, cache, vocab_size)
    files = _files(data, task)
    if fdata.reusable_cache(cache, files, vocab_size, tokenizer_source=wanted, task=task):  # (as _reusable)
        return cache
    tok = model_tokenizer.load(model, vocab_size)
    model_tokenizer.check_fits(model, tok, vocab_size)
    if task == SFT:
        sft.prepare(files, cache, tok, tokenizer_source=wanted, val_fraction=val_fraction)
    else:
        fdata.prepare_data(files, cache, tok, val_fraction, tokenizer_source=wanted)
    return cache


def _swap_in(staged: Path, cache: Path) -> None:
    """Put the accepted tokens of ``staged`` in ``cache``'s place by two renames (a kill between them leaves no cache,
    which the next run prepares again, never a half-replaced one); the earlier tokens then go, fp8lab's own files
    only (the run's folder check refused a cache holding anyone else's)."""
    old = _temp_folder(cache, "old-")
    cache.rename(old)
    staged.rename(cache)
    _remove_own_folder(old)


def _remove_own_folder(folder: Path) -> None:
    """fp8lab's own token files in ``folder`` go, then the folder when nothing else is left in it."""
    ownership.remove_own(folder, "tokens")
    left = [p for p in folder.iterdir() if p.name not in (ownership.MARKER, ownership.LOCK)
            and not p.name.startswith(ownership.TMP_PREFIX)]
    if not left:  # else kept, under a temporary name fp8lab never reads: it deletes nothing it did not write
        shutil.rmtree(folder, ignore_errors=True)


# ----------------------------------------------------------------------------- temporary folders beside a cache

def _host_tag(host: str) -> str:
    """A host name as 8 hex digits: any host fits a folder name, and hosts sharing a disk tell theirs apart."""
    return hashlib.sha256(host.encode("utf-8", "surrogateescape")).hexdigest()[:8]


def _temp_folder(cache: Path, role: str) -> Path:
    """A new temporary folder's path beside ``cache`` (``role``: "" for staged tokens, "old-" for the tokens being
    replaced), named with this process's pid and host so that the next preparation can tell whether its maker still
    lives (_stale_temp_folders)."""
    tag = f"{os.getpid()}-{_host_tag(socket.gethostname())}-{uuid.uuid4().hex[:8]}"
    return cache.with_name(f"{ownership.TMP_PREFIX}{cache.name}-{role}{tag}")


def _stale_temp_folders(names: Iterable[str], cache_name: str, host: str, alive: Callable[[int], bool]) -> list[str]:
    """Of ``names`` (entries beside the cache ``cache_name``), the temporary folders (_temp_folder) that a process
    of ``host`` made and that is gone (``alive(pid)`` false). A pid is only known on its own host, so another host's
    folder (a disk shared by nodes) is never stale here, nor a name without pid and host (made by an earlier fp8lab,
    whose maker is unknown)."""
    shape = re.compile(re.escape(f"{ownership.TMP_PREFIX}{cache_name}-") + r"(?:old-)?([1-9][0-9]{0,9})-"
                       + re.escape(_host_tag(host)) + r"-[0-9a-f]{8}")
    return [n for n in names if (hit := shape.fullmatch(n)) and not alive(int(hit.group(1)))]


def _alive(pid: int) -> bool:
    """A process ``pid`` runs on this host (one of another user's included: signalling it is refused, not absent)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # EPERM: it exists; a pid past the platform's range: kept, as undecidable
        return True
    return True


def _remove_stale_temp_folders(cache: Path) -> None:
    """Remove the temporary folders beside ``cache`` that a dead process of this host left (killed while it staged
    new tokens or swapped them in): fp8lab's own files in them, as that process would have (_remove_own_folder)."""
    try:
        names = [p.name for p in cache.parent.iterdir() if p.name.startswith(ownership.TMP_PREFIX)]
    except OSError:  # no parent folder yet (a first run) or none readable: nothing was left there
        return
    for name in _stale_temp_folders(names, cache.name, socket.gethostname(), _alive):
        folder = cache.parent / name
        if folder.is_symlink() or not folder.is_dir():
            continue  # not a folder fp8lab made: never followed or removed
        try:
            _remove_own_folder(folder)
        except (OSError, ValueError):  # removed by another rank at once, or not removable now: tried next time
            pass


def check_prepared(data_dir: str | Path, manifest: dict[str, Any], seq_len: int, task: str,
                   option: str = "--data") -> None:
    """A prepared folder serves the run: made for its task, and long enough (pretrain: a window in each split; sft:
    every example fits a row)."""
    if task_of(manifest) != task:
        raise ValueError(f"{option}: {Path(data_dir).name!r} holds tokens prepared for --task {task_of(manifest)}; "
                         f"allowed with --task {task}: data prepared for it (or its text / records)")
    if task == SFT:
        sft.check_lengths(data_dir, manifest, seq_len, option)
    else:
        data_checks.check_prepared_size(manifest, seq_len, option)


def loader(data_dir: str | Path, split: str, seq_len: int, micro_batch_size: int, **kw) -> fdata.TokenLoader:
    """The loader of a prepared folder's split: packed instruction rows for sft, token windows otherwise."""
    cls = sft.SFTLoader if task_of(fdata.read_manifest(data_dir)) == SFT else fdata.TokenLoader
    return cls(data_dir, split, seq_len, micro_batch_size, **kw)


def notes(data_dir: str | Path, manifest: dict[str, Any], seq_len: int, model: str | None = None) -> list[str]:
    """The run's lines about its data beyond fp8lab.data.tokens.describe: a model's own tokenizer (or a trained
    ``model`` folder without one), and for sft the examples, the template and what packing does to attention."""
    out = []
    if manifest.get("tokenizer_source", fdata.BPE_SOURCE) != fdata.BPE_SOURCE:
        out.append(f"tokenized with {describe_tokenizer(manifest)}")
    elif model_tokenizer.foreign_ids(model):
        out.append(f"note: --model {model!r} holds trained weights but no tokenizer files, so its data is tokenized "
                   "with fp8lab's BPE, whose ids mean nothing to those weights (a new vocabulary, not a fine-tune); "
                   "save the model's tokenizer beside it (tokenizer.save_pretrained) to fine-tune it")
    if task_of(manifest) == SFT:
        out.append(sft.describe(data_dir, seq_len))
    return out


def describe_tokenizer(manifest: dict[str, Any]) -> str:
    """Which tokenizer a prepared folder's tokens are, in words (the run's opening lines)."""
    src = manifest.get("tokenizer_source", fdata.BPE_SOURCE)
    if src.get("kind") == "model":
        return f"the model's own tokenizer ({src['name']}: {', '.join(src['files'])}, {manifest['vocab_size']} tokens)"
    return f"fp8lab's byte-level BPE tokenizer ({manifest['vocab_size']} tokens)"


# ----------------------------------------------------------------------------- fp8lab prepare-data

def main(argv: list[str] | None = None) -> int:
    """``fp8lab prepare-data OUT_DIR [--source ...]``: prepare a token folder (e.g. a SageMaker channel)."""
    p = OneLineParser(prog="fp8lab prepare-data", description="Tokenize text into fp8lab token shards.")
    p.add_argument("out_dir", help="folder to write manifest.json, tokenizer.json and the shards into")
    p.add_argument("--source", nargs="+", default=None,
                   help="text files/folders, or hf:<dataset> (default: the shipped KJV corpus; with --task sft the "
                        "shipped instruction set)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the shipped one for --vocab-size)")
    p.add_argument("--model", default=None,
                   help="a model folder: tokenize with its own tokenizer (transformers AutoTokenizer, local files)")
    p.add_argument("--task", default=PRETRAIN, choices=TASKS,
                   help="pretrain: text | sft: instruction JSONL (messages or prompt/response), loss on the answers")
    p.add_argument("--vocab-size", type=parse_count, default=fdata.DEFAULT_VOCAB,
                   help="which shipped tokenizer (32000 or 512; another size is trained on the shipped corpus)")
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--shard-tokens", type=parse_count, default=1 << 26, help="tokens per shard file (at least 1000)")
    args = p.parse_args(argv)
    source = args.source[0] if args.source and len(args.source) == 1 else (args.source or None)
    try:
        m = _prepare(args, source)
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        print(f"fp8lab prepare-data: error: {exc}", file=sys.stderr)
        return 2
    except (OSError, KeyboardInterrupt) as exc:  # a full disk, a file-size limit, Ctrl-C: the partial shards are gone
        why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else (
            f"{exc.strerror or exc}" + (f" ({Path(exc.filename).name})" if getattr(exc, "filename", None) else ""))
        print(f"fp8lab prepare-data: error: {why}; the partial shards were removed, so OUT_DIR holds no prepared data "
              "(files of the user's are untouched): free space if needed and run it again", file=sys.stderr)
        return 1
    print(fdata.describe(args.out_dir))
    return 0 if m else 1


def _prepare(args, source) -> dict[str, Any]:
    fdata._check_prepare_args(args.val_fraction, args.shard_tokens)
    if args.model is not None and args.tokenizer is not None:
        raise ValueError(f"--model={args.model!r} and --tokenizer={args.tokenizer!r}: give one of them (--model "
                         "tokenizes with the folder's own tokenizer)")
    if args.model is not None and model_tokenizer.folder(args.model) is None:
        raise ValueError(f"--model={args.model!r} is not a model folder with tokenizer files; allowed: a folder "
                         "written by save_pretrained with its tokenizer (tokenizer.json, tokenizer_config.json)")
    if args.tokenizer is None and args.model is None:
        fdata._check_vocab_size(args.vocab_size)
    check_writable_dir("OUT_DIR", args.out_dir)
    ownership.refuse_foreign("OUT_DIR", args.out_dir, "tokens")
    if args.task == SFT:
        if args.tokenizer is not None:
            raise ValueError("--tokenizer with --task sft: allowed: --model FOLDER (its tokenizer and chat template), "
                             "or neither (fp8lab's BPE and the plain template)")
        sft.check_source(source, "--source")
        tok = model_tokenizer.load(args.model, args.vocab_size)
        return sft.prepare(source, args.out_dir, tok, tokenizer_source=model_tokenizer.source(args.model),
                           val_fraction=args.val_fraction, option="--source")
    data_checks.check_data_source(source, "--source", args.val_fraction if 0 < args.val_fraction < 0.5 else 0.05)
    if args.model is not None:
        return fdata.prepare_data(source, args.out_dir, model_tokenizer.load(args.model), args.val_fraction,
                                  shard_tokens=args.shard_tokens, tokenizer_source=model_tokenizer.source(args.model))
    return fdata.prepare_data(source, args.out_dir, args.tokenizer, args.val_fraction, vocab_size=args.vocab_size,
                              shard_tokens=args.shard_tokens)


if __name__ == "__main__":
    raise SystemExit(main())
