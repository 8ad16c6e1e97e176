"""Instruction data (``--task sft``): JSON-lines records in, packed rows with the loss on the answers only out.

Each line of a ``.jsonl`` file is one example, either a conversation or a prompt and its response::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "..."}]}
    {"prompt": "...", "response": "...", "system": "..."}          # "system" optional

Roles are ``system``, ``user`` and ``assistant``; every assistant turn is an answer the model is trained on, and a
user turn comes before the first one; answers and user turns are non-empty, and a record has one form, not both. The
text is the tokenizer's chat template (``apply_chat_template``) where the tokenizer has one, else
:data:`PLAIN_TEMPLATE` (docs/own-model.md shows it). An answer's tokens are found by rendering the conversation up
to each assistant turn (its prompt with the generation prompt, then with the answer): the characters between the
two, trailing whitespace left out, are the answer and its end-of-turn marker, and the tokens that start there carry
the loss; every other token's label is the ignore index (-100, fp8lab.plan.fused_loss.IGNORE_INDEX), so the mean
loss is over answer tokens only.

:func:`prepare` tokenizes once into a prepared folder (the manifest's ``task`` is ``sft``): per split the token ids
(``<split>_00000.bin``), a loss mask (``<split>_mask_00000.bin``, 1 on answer tokens) and the examples' record
numbers and lengths (``<split>_examples.json``). The held-out split is a fixed, seeded choice of examples
(:data:`SPLIT_SEED`, whatever the run's seed), so every run's validation loss is the same examples' answer loss.

:class:`SFTLoader` packs whole examples into rows of ``seq_len`` tokens (next-fit, in a seeded order), pads the
rest (label -100), and serves them like ``fp8lab.data.tokens.TokenLoader`` (resumable by one position). An
example longer than a row is refused before training, naming its record. Attention is causal over the whole row:
no attention path of fp8lab's (TE's fused blocks, the emulator's, the HF modules of ``--fuse False`` / ``--backend
none``) is given a per-example mask or positions restarting per example, so an example sees the examples packed
before it in its row as context (:data:`PACKING_NOTE`, said in the run's log), alike in BF16 and FP8 runs; its
loss is still only its own answer tokens.

Bad records are refused before anything is tokenized (:func:`check_source`), one line naming the record and field,
as is a damaged prepared folder when it is opened (:func:`check_prepared`); a chat template that refuses a record is
named with that record when it is rendered, before a model is built.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from fp8lab.core.paths import shipped_path
from fp8lab.core.probes import check_member
from fp8lab.core.validate import is_count
from fp8lab.data import checks as data_checks
from fp8lab.data import tokens as fdata
from fp8lab.plan.fused_loss import IGNORE_INDEX
from fp8lab.records import ownership, runlock
from fp8lab.records.data_format import FORMAT, FORMAT_VERSION, JSONL_SUFFIXES, SFT, text_files

ROLES = ("system", "user", "assistant")
SHIPPED = "sft/kjv-qa.jsonl"  # the shipped instruction set (data/sft/, made by build_kjv_instructions)
SPLIT_SEED = 0  # the held-out examples: the same for every run of a folder
# the template for tokenizers without a chat template (fp8lab's BPE, a folder without one); docs/own-model.md
PLAIN_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}### Assistant:\n{{ message['content'] }}{{ eos_token }}\n\n"
    "{% else %}### {{ message['role'] | capitalize }}:\n{{ message['content'] }}\n\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}### Assistant:\n{% endif %}"
)
PACKING_NOTE = ("examples are packed into rows without a per-example attention mask (no attention path of fp8lab's "
                "gets one): an example attends to the examples before it in its row; the loss counts its answer tokens "
                "only")
RECORD_FORMS = ('{"messages": [{"role": ..., "content": ...}, ...]} or {"prompt": ..., "response": ...} per line; '
                "roles " + " | ".join(ROLES))


# ----------------------------------------------------------------------------- records

def shipped() -> Path:
    """The shipped instruction set: ``--task sft``'s data when ``--data`` is not given."""
    return shipped_path(SHIPPED)


def _kind(v: Any) -> str:
    return {bool: "true/false", int: "a number", float: "a number", list: "a list", dict: "an object",
            str: "a string"}.get(type(v), "null")


# what an empty turn of each role is refused with (None: it may be empty). An empty user turn is refused in both
# record forms: the answer would follow no question, which is almost always a conversion that lost the prompt
NONEMPTY = {"user": "a non-empty prompt (the user turn the answer follows)",
            "assistant": "a non-empty answer (the text trained on)", "system": None}


def _text(obj: dict, key: str, where: str, field: str, role: str) -> str:
    v = obj[key]
    if not isinstance(v, str):
        raise ValueError(f"{where}: field {field} is {_kind(v)}, not a string; allowed: {RECORD_FORMS}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError as exc:  # a \ud800-style escape without its pair: no tokenizer can encode it
        raise ValueError(f"{where}: field {field} is not valid Unicode text (a lone surrogate, "
                         f"\\u{ord(v[exc.start]):04x} at character {exc.start}); allowed: valid Unicode text (a "
                         "\\ud800-\\udbff escape followed by its \\udc00-\\udfff pair)") from None
    if NONEMPTY[role] and not v.strip():
        raise ValueError(f"{where}: field {field} is empty; allowed: {NONEMPTY[role]}")
    return v


def to_messages(obj: Any, where: str) -> list[dict[str, str]]:
    """The conversation of one parsed record (``where`` names it in errors): its messages, or system/prompt/response
    as messages; ValueError naming the field that is missing, of a wrong type, of an unknown role or empty."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where} is {_kind(obj)}, not a JSON object; allowed: {RECORD_FORMS}")
    if "messages" in obj:
        both = [k for k in ("prompt", "response", "system") if k in obj]
        if both:  # only one of the two conversations would be trained on
            raise ValueError(f"{where}: fields messages and {' / '.join(both)} are both given (one form would be "
                             f"dropped unseen); allowed: one form per record, {RECORD_FORMS}")
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise ValueError(f"{where}: field messages is {'an empty list' if msgs == [] else _kind(msgs)}; allowed: "
                             "a list of {\"role\": ..., \"content\": ...} objects")
        out = []
        for i, m in enumerate(msgs):
            field = f"messages[{i}]"
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"{where}: field {field} is not an object with \"role\" and \"content\"; allowed: "
                                 f"{RECORD_FORMS}")
            if m["role"] not in ROLES:
                raise ValueError(f"{where}: field {field}.role is {m['role']!r}; allowed: " + " | ".join(ROLES))
            out.append({"role": m["role"], "content": _text(m, "content", where, f"{field}.content", m["role"])})
        roles = [m["role"] for m in out]
        if "assistant" not in roles:
            raise ValueError(f"{where}: field messages has no assistant turn; allowed: at least one (the answer "
                             "trained on)")
        if "user" not in roles[:roles.index("assistant")]:
            raise ValueError(f"{where}: field messages[{roles.index('assistant')}] is an assistant turn before any "
                             "user turn; allowed: a user turn first (the prompt)")
        return out
    missing = [k for k in ("prompt", "response") if k not in obj]
    if missing:
        raise ValueError(f"{where}: field {missing[0]} is missing (and there is no messages list); allowed: "
                         f"{RECORD_FORMS}")
    out = [{"role": "user", "content": _text(obj, "prompt", where, "prompt", "user")},
           {"role": "assistant", "content": _text(obj, "response", where, "response", "assistant")}]
    if "system" in obj:
        out.insert(0, {"role": "system", "content": _text(obj, "system", where, "system", "system")})
    return out


def records(files: list[Path], option: str = "--data") -> Iterator[tuple[int, list[dict[str, str]]]]:
    """(record number, messages) of every non-blank line of the files, numbered from 1 across them; a bad record
    is a ValueError naming the file, the record (and its line) and the field."""
    for n, _, msgs in _records(files, option):
        yield n, msgs


def _records(files: list[Path], option: str) -> Iterator[tuple[int, str, list[dict[str, str]]]]:
    """:func:`records` with each record's name in errors (file, record, line), for the errors found later (render)."""
    n = 0
    for path in files:
        if not path.name.endswith(JSONL_SUFFIXES):
            raise ValueError(f"{option}: file {path.name!r} is not JSON lines; with --task sft allowed: .jsonl files "
                             f"of {RECORD_FORMS}")
        who = f"{option}: file {path.name!r}"
        for line_no, line in enumerate(data_checks.utf8_lines(path, who, ".jsonl files"), 1):
            if not line.strip():
                continue
            n += 1
            where = f"{who} record {n} (line {line_no})"
            try:
                obj = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where} is not JSON ({exc.msg} at column {exc.colno}); allowed: "
                                 f"{RECORD_FORMS}") from None
            except (ValueError, RecursionError) as exc:  # valid JSON past Python's limits: digits, nesting depth
                why = "lists or objects nested too deeply" if isinstance(exc, RecursionError) else \
                    str(exc).split(";")[0]
                raise ValueError(f"{where} is JSON that Python's json cannot read ({why}); allowed: "
                                 f"{RECORD_FORMS}") from None
            yield n, where, to_messages(obj, where)


def check_source(source: Any, option: str = "--data") -> int:
    """Every record of a ``--task sft`` source (None: the shipped set) is valid, before anything is tokenized;
    returns how many there are (at least 2: one held out). A prepared folder is checked as ``--data`` (fp8lab.data.
    checks) and by :func:`check_prepared`, and must have been prepared for sft."""
    if isinstance(source, (str, Path)) and fdata.is_prepared(source):
        m = data_checks.check_prepared_folder(Path(source), option, scan_tokens=False)
        if m.get("task") != SFT:
            raise ValueError(f"{option}={str(source)!r} holds tokens prepared for --task {m.get('task', 'pretrain')}; "
                             "allowed with --task sft: a .jsonl file or a folder from fp8lab prepare-data --task sft")
        return check_prepared(Path(source), m, option)
    files = _files(source, option)
    count = sum(1 for _ in records(files, option))
    if count < 2:
        raise ValueError(f"{option}: {', '.join(repr(f.name) for f in files[:3])} hold(s) {count} record(s); "
                         "allowed: at least 2 (one is held out for the validation loss)")
    return count


def _files(source: Any, option: str) -> list[Path]:
    try:
        return text_files(shipped() if source is None else source)
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


# ----------------------------------------------------------------------------- rendering

def template_of(tokenizer) -> tuple[str, str]:
    """(the chat template the examples are rendered with, "chat_template" | "plain")."""
    own = getattr(tokenizer, "chat_template", None)
    if isinstance(own, str) and own:
        return own, "chat_template"
    return PLAIN_TEMPLATE, "plain"


def _template_name(tokenizer) -> str:
    """The template in errors: the model folder's (named by ``--model``, which brought it) or fp8lab's plain one."""
    if template_of(tokenizer)[1] == "plain":
        return "fp8lab's plain chat template"
    folder = Path(getattr(tokenizer, "name_or_path", "") or "").name
    return f"--model's chat template ({folder!r})" if folder else "--model's chat template"


def render(tokenizer, messages: list[dict[str, str]], where: str = "record") -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one conversation: 1 on the tokens of each assistant answer and its end-of-turn
    marker, 0 elsewhere (module doc). A template that refuses the conversation, or does not render the earlier turns
    as a prefix of the later ones (so cannot show where an answer starts), is a ValueError naming the record."""
    template, _ = template_of(tokenizer)

    def text(msgs, prompt=False):
        try:
            return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=prompt,
                                                 chat_template=template)
        except Exception as exc:  # noqa: BLE001 - the template is the model folder's code: any failure is one line
            said = " ".join(str(exc).split())[:200]
            raise ValueError(f"{where}: {_template_name(tokenizer)} fails on it ({type(exc).__name__}: {said}); "
                             "allowed: records that template accepts (many refuse a system turn, or turns that do "
                             "not alternate user / assistant), or a --model whose template renders them") from None

    full = text(messages)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before, upto = text(messages[:i], prompt=True), text(messages[:i + 1])
        if not (upto.startswith(before) and full.startswith(upto)):
            raise ValueError(f"{where}: {_template_name(tokenizer)} does not render the conversation's earlier turns "
                             f"as the start of the later ones (turn {i}), so the answer's tokens cannot be found; "
                             "allowed: a template that appends each turn (or another --model)")
        spans.append((len(before), len(upto.rstrip())))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    starts = [a for a, _ in enc["offset_mapping"]]
    mask = [int(any(lo <= s < hi for lo, hi in spans)) for s in starts]
    return list(enc["input_ids"]), mask


# ----------------------------------------------------------------------------- preparing

def split_of(count: int, val_fraction: float) -> np.ndarray:
    """Whether each of ``count`` examples is held out: ``max(1, round(count * val_fraction))`` of them, chosen by a
    permutation of :data:`SPLIT_SEED` (deterministic; the same for every run)."""
    held = np.zeros(count, dtype=bool)
    held[np.random.default_rng(SPLIT_SEED).permutation(count)[:max(1, round(count * val_fraction))]] = True
    return held


def prepare(source: Any, out_dir: str | Path, tokenizer, *, tokenizer_source: dict[str, Any] | None = None,
            val_fraction: float = 0.05, option: str = "--data") -> dict[str, Any]:
    """Tokenize the instruction records of ``source`` (None: the shipped set) with ``tokenizer`` (a transformers fast
    tokenizer: fp8lab.data.model_tokenizer.load) into ``out_dir``; returns the manifest (module doc)."""
    if not fdata.VAL_FRACTION(val_fraction):
        raise ValueError(f"--val-fraction={val_fraction!r} is invalid; allowed: {fdata.VAL_FRACTION.allowed}")
    files = _files(source, option)
    count = check_source(source, option)
    out = Path(out_dir)
    ownership.refuse_foreign("out_dir", out, "tokens")
    out.mkdir(parents=True, exist_ok=True)
    lock = runlock.acquire("OUT_DIR", out, user="prepare-data")
    try:
        return _prepare_into(out, files, count, tokenizer, tokenizer_source, val_fraction, option)
    finally:
        lock.release()


def _prepare_into(out: Path, files, count, tokenizer, tokenizer_source, val_fraction, option) -> dict[str, Any]:
    n_vocab = len(tokenizer)
    dtype = fdata._dtype_for(n_vocab)
    writers = fdata._fresh_writers(out, dtype, 1 << 40)
    masks = {s: fdata._ShardWriter(out, f"{s}_mask", np.dtype(np.uint8), 1 << 40) for s in writers}
    held = split_of(count, val_fraction)
    examples: dict[str, list[list[int]]] = {"train": [], "val": []}
    try:
        for n, where, msgs in _records(files, option):
            ids, mask = render(tokenizer, msgs, where)
            split = "val" if held[n - 1] else "train"
            writers[split].write(np.asarray(ids, dtype=np.int64))
            masks[split].write(np.asarray(mask, dtype=np.uint8))
            examples[split].append([n, len(ids)])
        for w in (*writers.values(), *masks.values()):
            w.close()
        ownership.write_file(out / "tokenizer.json", fdata.backend_of(tokenizer).to_str())
        for s, rows in examples.items():
            ownership.write_file(out / f"{s}_examples.json", json.dumps(rows) + "\n")
        template, kind = template_of(tokenizer)
        manifest = {
            "format": FORMAT, "version": FORMAT_VERSION, "task": SFT, "dtype": dtype.name, "vocab_size": n_vocab,
            "eos_id": tokenizer.eos_token_id,
            "pad_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0,
            "tokenizer": "tokenizer.json", "tokenizer_sha256": fdata._sha256(out / "tokenizer.json"),
            "tokenizer_source": tokenizer_source or dict(fdata.BPE_SOURCE),
            "template": {"kind": kind, "sha256": hashlib.sha256(template.encode()).hexdigest()},
            "source": fdata.describe_source(files), "val_fraction": val_fraction, "split_seed": SPLIT_SEED,
            "documents": count,
            "splits": {s: {"tokens": w.tokens, "documents": w.documents, "shards": w.shards,
                           "mask_shards": masks[s].shards, "examples": f"{s}_examples.json",
                           "answer_tokens": int(sum(_mask_sum(out, sh["file"]) for sh in masks[s].shards))}
                       for s, w in writers.items()},
        }
        ownership.record(out, *[sh["file"] for sp in manifest["splits"].values() for sh in sp["mask_shards"]],
                         *[sp["examples"] for sp in manifest["splits"].values()])
        fdata._write_manifest(out, manifest)
        return manifest
    except BaseException:  # nothing partial stays behind (no manifest: not prepared)
        fdata._abandon(out, (*writers.values(), *masks.values()))
        raise


def _mask_sum(folder: Path, name: str) -> int:
    return int(np.fromfile(folder / name, dtype=np.uint8).sum(dtype=np.int64))


# ----------------------------------------------------------------------------- reading

PREPARED = "allowed: a folder written by fp8lab prepare-data --task sft (prepare it again)"


def _examples(data_dir: Path, manifest: dict[str, Any], split: str, option: str = "--data") -> list[list[int]]:
    name = manifest["splits"][split]["examples"]
    try:
        return json.loads(check_member(data_dir, name, option).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{option}: {name!r} in {data_dir.name!r} is missing or unreadable ({type(exc).__name__}); "
                         f"{PREPARED}") from None


def check_prepared(folder: Path, manifest: dict[str, Any], option: str = "--data") -> int:
    """A prepared sft folder's own files agree with its manifest and its token shards (already checked by fp8lab.data.
    checks.check_prepared_folder): each split's loss-mask shards are there, one byte per token, and its examples list
    one (record, length) pair per example, the lengths adding up to the split's tokens. Checked when the folder is
    opened, so a damaged one is named before a model is built, not by the loader mid-run; returns how many records."""
    def bad(name: Any, what: str) -> ValueError:
        return ValueError(f"{option}: {name!r} in {folder.name!r} {what}; {PREPARED}")

    try:  # what the loader and the run's lines (describe) read
        kind, count = manifest["template"]["kind"], int(manifest["documents"])
        splits = {s: (int(sp["tokens"]), int(sp["documents"]), int(sp["answer_tokens"]), sp["examples"],
                      [(m["file"], int(m["tokens"])) for m in sp["mask_shards"]])
                  for s, sp in ((s, manifest["splits"][s]) for s in ("train", "val"))}
    except (KeyError, TypeError, ValueError) as exc:
        raise bad(fdata.MANIFEST, f"lacks {exc} or has a wrong type there (no sft manifest)") from None
    if kind not in ("chat_template", "plain"):
        raise bad(fdata.MANIFEST, f"has template kind {kind!r}, not chat_template or plain")
    for split, (tokens, documents, _, name, masks) in splits.items():
        for shard, n in masks:
            path = check_member(folder, shard, option)
            size = path.stat().st_size if path.is_file() else None
            if size != n:
                raise bad(shard, "is missing" if size is None else
                          f"holds {size} mask bytes, not the {n} (one per token) its manifest says")
        if sum(n for _, n in masks) != tokens:
            raise bad(fdata.MANIFEST, f"lists {sum(n for _, n in masks)} loss-mask bytes for the {split} split's "
                      f"{tokens} tokens")
        examples = _examples(folder, manifest, split, option)
        if not isinstance(examples, list) or not all(
                isinstance(e, list) and len(e) == 2 and all(is_count(v) for v in e) for e in examples):
            raise bad(name, "is not a list of [record, length] pairs of positive integers")
        if len(examples) != documents or sum(n for _, n in examples) != tokens:
            raise bad(name, f"lists {len(examples)} examples of {sum(n for _, n in examples)} tokens, but the "
                      f"manifest's {split} split has {documents} of {tokens}")
    return count


def check_lengths(data_dir: str | Path, manifest: dict[str, Any], seq_len: int, option: str = "--data") -> None:
    """Every example fits one row of ``seq_len`` tokens (its ``seq_len + 1`` tokens give ``seq_len`` inputs and
    labels), else a ValueError naming the first record that does not: before anything is built."""
    files = manifest.get("source", {}).get("files") or []
    of = f" of {', '.join(map(repr, files[:3]))}" if files else ""
    for record, n in sorted(e for split in ("train", "val") for e in _examples(Path(data_dir), manifest, split,
                                                                                 option)):
        if n > seq_len + 1:
            raise ValueError(f"{option}: record {record}{of} is {n} tokens with its template, longer than one "
                             f"sequence of --seq-len {seq_len} (+1); allowed: examples of at most {seq_len + 1} "
                             "tokens (a longer --seq-len, or shorten or drop that record)")


def describe(data_dir: str | Path, seq_len: int) -> str:
    """The run's line about its instruction data: examples, answer tokens, rows, template and the packing's limit."""
    m = fdata.read_manifest(data_dir)
    tr, va = m["splits"]["train"], m["splits"]["val"]
    return (f"sft: {tr['documents']} training and {va['documents']} held-out examples ({tr['answer_tokens']} and "
            f"{va['answer_tokens']} answer tokens), {m['template']['kind'].replace('_', ' ')}, packed into rows of "
            f"{seq_len} tokens; {PACKING_NOTE}")


class SFTLoader(fdata.TokenLoader):
    """Rows of whole examples packed to ``seq_len`` (module doc), served as ``TokenLoader`` serves windows: global
    sample ``g`` is row ``perm_e[g % rows]`` of epoch ``e``, so the position is all a checkpoint needs. ``(input_ids,
    labels)``: labels are the next token on answer tokens and -100 elsewhere (prompts, padding)."""

    def __init__(self, data_dir: str | Path, split: str, seq_len: int, micro_batch_size: int, *,
                 seed: int = 0, rank: int = 0, world_size: int = 1, shuffle: bool = True):
        self._start(seq_len, micro_batch_size, seed, rank, world_size, shuffle)
        self.tokens = fdata.TokenShards(data_dir, split)
        m = self.tokens.manifest
        check_lengths(data_dir, m, seq_len)
        self.ids = self.tokens.read(0, len(self.tokens))
        self.mask = np.concatenate([np.fromfile(check_member(Path(data_dir), sh["file"]), dtype=np.uint8)
                                    for sh in m["splits"][split]["mask_shards"]] or [np.zeros(0, np.uint8)])
        lengths = [n for _, n in _examples(Path(data_dir), m, split)]
        self.starts = np.cumsum([0] + lengths)
        self.pad_id = int(m.get("pad_id") or 0)
        self.rows = self._pack(lengths)
        self.num_windows = len(self.rows)

    def _pack(self, lengths: list[int]) -> list[list[int]]:
        """Next-fit: examples in a seeded order (file order when not shuffled), each row filled until the next
        example's ``n - 1`` inputs do not fit."""
        order = (np.random.default_rng([self.seed, len(lengths)]).permutation(len(lengths)) if self.shuffle
                 else np.arange(len(lengths)))
        rows: list[list[int]] = []
        used = self.seq_len
        for i in order:
            need = lengths[i] - 1
            if used + need > self.seq_len:
                rows.append([])
                used = 0
            rows[-1].append(int(i))
            used += need
        return rows

    def row(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and labels of packed row ``index`` (``seq_len`` each)."""
        x = np.full(self.seq_len, self.pad_id, dtype=np.int64)
        y = np.full(self.seq_len, IGNORE_INDEX, dtype=np.int64)
        at = 0
        for i in self.rows[index]:
            a, b = int(self.starts[i]), int(self.starts[i + 1])
            n = b - a - 1
            x[at:at + n] = self.ids[a:b - 1]
            y[at:at + n] = np.where(self.mask[a + 1:b] > 0, self.ids[a + 1:b], IGNORE_INDEX)
            at += n
        return x, y

    def next_batch(self):
        import torch

        rows = [self.row(self._window(g)) for g in self.sample_indices()]
        self.position += self.world_size * self.batch
        return (torch.from_numpy(np.stack([x for x, _ in rows])), torch.from_numpy(np.stack([y for _, y in rows])))


# ----------------------------------------------------------------------------- the shipped set

def build_kjv_instructions(limit: int = 240) -> list[dict[str, Any]]:
    """The shipped instruction set (``data/sft/kjv-qa.jsonl``), made deterministically from the shipped corpus: from
    every 3rd chapter, short verses as two kinds of question (which verse follows, how a verse ends), alternately as
    a conversation (every third with a system turn) and as prompt/response."""
    chapters = list(fdata.read_documents(fdata.default_corpus()))
    out: list[dict[str, Any]] = []
    system = "You answer questions about the King James Bible in its own words."
    for c in range(0, len(chapters), 3):
        verses = chapters[c].split("\n")
        for v in range(0, len(verses) - 1, 4):
            a, b = verses[v], verses[v + 1]
            if len(a) > 90 or len(b) > 90 or len(a.split()) < 6:
                continue
            k = len(out)
            if k % 2 == 0:
                prompt, answer = f"Which verse follows this one?\n{a}", b
            else:
                words = a.split()
                prompt, answer = f"How does this verse end?\n{' '.join(words[:len(words) // 2])}", \
                    " ".join(words[len(words) // 2:])
            if k % 4 < 2:
                msgs = ([{"role": "system", "content": system}] if k % 3 == 0 else []) + [
                    {"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
                out.append({"messages": msgs})
            else:
                out.append({"prompt": prompt, "response": answer})
            if len(out) >= limit:
                return out
    return out
