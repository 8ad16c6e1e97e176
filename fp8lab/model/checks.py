"""A user's model folder checked before anything is built: config.json fields, weights, tokenizer files.

``fp8lab.model.user`` reads a folder; this module says whether what it holds can be used, each
problem as one line naming the field or file and what is allowed:

* :func:`check_config_fields`: the config.json fields the model classes read (``num_attention_heads``
  a positive integer, ``tie_word_embeddings`` true or false, ``hidden_act`` an activation transformers
  knows, ...), checked by field name on the raw JSON, whatever the ``model_type`` (a family that
  has the field gets the check);
* :func:`check_weights`: the ``*.safetensors`` headers (read without loading a tensor) hold every
  tensor the model needs, each with the shape the config gives it (a corrupt file, a missing key or
  a mismatched shape is found here, not deep inside ``from_pretrained``);
* :func:`check_tokenizer_files`: the tokenizer files the export copies are regular files inside
  the model folder (a symlink leaving it is refused) and parse (tokenizer.json loads), so a broken
  tokenizer is found at the start, not at export after training;
* :func:`weights_digest`: a SHA-256 over the weight files' bytes, for the launcher's job names.

Error messages name files and fields; they never quote a file's content.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path

from fp8lab.core.paths import is_inside
from fp8lab.records.data_format import tokenizer_problem
from fp8lab.core.validate import (BOOL, POSITIVE_INT, UNIT_HALF_OPEN, UNIT_OPEN, Check, is_count, is_num, one_of,
                                  optional)

# ------------------------------------------------------------------------------------ config.json

_POSITIVE_NUM = Check(lambda v: is_num(v) and v > 0, "a number > 0")
_UNIT_RANGE = Check(lambda v: is_num(v) and 0 <= v <= 1, "a number in [0, 1]")  # transformers' own bound


def _finite_tree(v) -> bool:
    """Numbers (at any depth of lists and objects) are finite and no bools stand in for them."""
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, dict):
        return all(_finite_tree(x) for x in v.values())
    if isinstance(v, list):
        return all(_finite_tree(x) for x in v)
    return True


_ROPE = Check(lambda v: v is None or (isinstance(v, dict) and _finite_tree(v)),
              "null or an object of finite numbers (transformers then checks its fields)")
_ATTN = ("eager", "sdpa")  # what the converted layers run on; flash_attention_2 needs a package fp8lab does not use
_DTYPES = ("float32", "float16", "bfloat16", "float64")
_TOKEN_ID = Check(lambda v: v is None or is_count(v, 0) or (isinstance(v, list) and all(is_count(x, 0) for x in v)),
                  "null, an integer >= 0 or a list of them")


def _activations() -> Check:
    from transformers.activations import ACT2FN

    names = tuple(sorted(ACT2FN))
    return Check(lambda v: isinstance(v, str) and v in names, " | ".join(names))


# field name -> its check; a field that is absent keeps the transformers default (checked there)
CONFIG_FIELDS: dict[str, Check] = {
    **{f: POSITIVE_INT for f in ("hidden_size", "num_hidden_layers", "num_layers", "num_attention_heads", "num_heads",
                                 "vocab_size", "max_position_embeddings")},
    **{f: optional(POSITIVE_INT) for f in ("intermediate_size", "num_key_value_heads", "head_dim", "window_size",
                                           "sliding_window", "max_window_layers")},
    **{f: UNIT_OPEN for f in ("rms_norm_eps", "layer_norm_epsilon")},
    **{f: _POSITIVE_NUM for f in ("rope_theta",)},
    **{f: _UNIT_RANGE for f in ("initializer_range",)},
    **{f: _ROPE for f in ("rope_scaling", "rope_parameters")},
    **{f: optional(one_of(_ATTN)) for f in ("attn_implementation", "_attn_implementation")},
    **{f: optional(one_of(_DTYPES)) for f in ("torch_dtype", "dtype")},
    "quantization_config": Check(lambda v: v is None, "absent (fp8lab trains float weights; quantized checkpoints "
                                                      "are not supported)"),
    **{f: UNIT_HALF_OPEN for f in ("attention_dropout", "embed_dropout", "resid_dropout", "hidden_dropout")},
    **{f: BOOL for f in ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_cache", "use_sliding_window")},
    **{f: _TOKEN_ID for f in ("bos_token_id", "eos_token_id", "pad_token_id")},
}
ACTIVATION_FIELDS = ("hidden_act", "activation_function")


def check_config_fields(d: dict, where: str = "config.json") -> None:
    """Each known field of a config.json dict has a value the model classes can use."""
    checks = {**CONFIG_FIELDS, **{f: _activations() for f in ACTIVATION_FIELDS if f in d}}
    for name, check in checks.items():
        if name in d and not check(d[name]):
            shown = repr(d[name]) if not isinstance(d[name], (dict, list)) else f"a {type(d[name]).__name__}"
            raise ValueError(f"--model: {where} field {name}={shown} is invalid; allowed: {check.allowed}")
    vocab = d.get("vocab_size")
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        ids = d.get(name)
        ids = ids if isinstance(ids, list) else [ids] if ids is not None else []
        if is_count(vocab) and any(i >= vocab for i in ids):
            raise ValueError(f"--model: {where} field {name}={d[name]!r} is outside the vocabulary (vocab_size "
                             f"{vocab}); allowed: ids 0..{vocab - 1}")


# ------------------------------------------------------------------------------------ weights

INDEX = "model.safetensors.index.json"


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files ``from_pretrained`` reads: those the index lists, else every *.safetensors."""
    index = folder / INDEX
    if not index.exists():
        return sorted(folder.glob("*.safetensors"))
    _regular(index)
    try:
        names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"--model: {INDEX} is not a valid safetensors index ({type(exc).__name__}); allowed: "
                         "a JSON object with a weight_map of tensor name -> file") from None
    missing = [n for n in names if not (folder / n).is_file() or Path(n).name != n]
    if missing:
        raise ValueError(f"--model: {INDEX} lists {missing[0]!r}, which is not a file in the model folder")
    return [folder / n for n in names]


FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")  # safetensors' names of the float dtypes a model's weights may have


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the header; every tensor a float dtype."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:  # the header only: no tensor is read
            shapes, dtypes = {}, {}
            for k in fh.keys():
                sl = fh.get_slice(k)
                shapes[k], dtypes[k] = tuple(sl.get_shape()), sl.get_dtype()
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own error types for every kind of damage
        raise ValueError(f"--model: weights file {path.name!r} is not a readable safetensors file "
                         f"({type(exc).__name__}); allowed: files written by save_pretrained / safetensors") from None
    for k, dt in dtypes.items():
        if dt not in FLOAT_DTYPES:
            raise ValueError(f"--model: weights tensor {k!r} in {path.name!r} has dtype {dt}; allowed: "
                             f"{' | '.join(FLOAT_DTYPES)} (a model's float weights)")
    return shapes


def _check_finite(path: Path) -> None:
    """Every weight is a finite number (one tensor at a time; NaN or Inf would train NaN losses)."""
    import torch
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        for k in fh.keys():
            t = fh.get_tensor(k)
            if t.numel() and not bool(torch.isfinite(t).all()):
                bad = int((~torch.isfinite(t)).sum())
                raise ValueError(f"--model: weights tensor {k!r} in {path.name!r} holds {bad} NaN or Inf value(s); "
                                 "allowed: finite weights")


def _regular(path: Path) -> None:
    """A weights file is a regular file (a FIFO or device would block or never end), never opened otherwise."""
    import stat as _stat

    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ValueError(f"--model: weights file {path.name!r} cannot be read ({exc.strerror})") from None
    if not _stat.S_ISREG(mode):
        raise ValueError(f"--model: weights file {path.name!r} is not a regular file (a FIFO, device or socket); "
                         "allowed: files written by save_pretrained")


def _expected_shapes(hf_cfg) -> tuple[dict[str, tuple[int, ...]], str, set[str]]:
    """(state-dict name -> shape of the model the config describes, its base-model prefix, tied names)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = {"lm_head.weight"} if getattr(hf_cfg, "tie_word_embeddings", False) else set()
    return shapes, model.base_model_prefix, tied


def check_weights(folder: Path, hf_cfg) -> None:
    """The folder's safetensors hold every tensor of the model ``hf_cfg`` describes, shaped as it says."""
    files = weight_files(folder)
    pickled = sorted(p.name for p in folder.glob("pytorch_model*.bin"))
    if pickled and not files:
        raise ValueError(f"--model: weights file {pickled[0]!r} is a pickle (PyTorch .bin), which fp8lab never loads "
                         "(unpickling can run code); allowed: *.safetensors weights (save_pretrained writes them; "
                         "convert with model.save_pretrained(dir, safe_serialization=True))")
    if not files:
        return
    found: dict[str, tuple[int, ...]] = {}
    for f in files:
        _regular(f)
        found.update(_header_shapes(f))
    want, prefix, tied = _expected_shapes(hf_cfg)
    # a base-model checkpoint (LlamaModel) names its tensors without the causal-LM wrapper's prefix
    named = {k if k in want else f"{prefix}.{k}": (k, shape) for k, shape in found.items()}
    for key, shape in want.items():
        if key not in named:
            if key in tied:
                continue
            raise ValueError(f"--model: the weights lack tensor {key!r} (shape {list(shape)}) that config.json's "
                             f"model needs ({len(files)} safetensors file(s), {len(found)} tensors); allowed: weights "
                             "saved from a model with this config.json")
        if named[key][1] != shape:
            raise ValueError(f"--model: weights tensor {named[key][0]!r} has shape {list(named[key][1])} but "
                             f"config.json gives {list(shape)}; allowed: weights saved from a model with this "
                             "config.json")
    for f in files:
        _check_finite(f)


# ------------------------------------------------------------------------------------ tokenizer files

def check_tokenizer_files(folder: Path, root: Path, names: tuple[str, ...]) -> None:
    """Each tokenizer file present is a file inside ``root`` (the model folder, or an hf: repository's cache
    folder) and parses: JSON files as JSON, tokenizer.json as a tokenizer."""
    for name in names:
        p = folder / name
        if not (p.exists() or p.is_symlink()):
            continue
        if not is_inside(p, root):
            raise ValueError(f"--model: tokenizer file {name!r} leads outside the model folder (a symlink); allowed: "
                             "files inside the model folder (copy the file in instead of linking it)")
        if not p.is_file():
            raise ValueError(f"--model: tokenizer file {name!r} is not a regular file")
        if name.endswith(".json"):
            try:
                json.loads(p.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise ValueError(f"--model: tokenizer file {name!r} is not valid JSON (line {exc.lineno}); allowed: "
                                 "the files save_pretrained writes, or remove it") from None
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"--model: tokenizer file {name!r} cannot be read ({type(exc).__name__})") from None
        if name.endswith(".jinja"):
            try:
                p.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"--model: chat template {name!r} cannot be read as UTF-8 text "
                                 f"({type(exc).__name__}); allowed: the file save_pretrained writes, or remove it"
                                 ) from None
        if name == "tokenizer.json":
            why = tokenizer_problem(p)
            if why:
                raise ValueError(f"--model: tokenizer file 'tokenizer.json' does not load as a tokenizer ({why}); "
                                 "allowed: a tokenizer.json written by the tokenizers library, or remove it")
        if name == "merges.txt" and not _merges_ok(p):
            raise ValueError("--model: tokenizer file 'merges.txt' is not a BPE merges list (UTF-8 lines of two "
                             "space-separated pieces); allowed: the file save_pretrained writes, or remove it")


def _merges_ok(path: Path) -> bool:
    """merges.txt as tokenizers writes it: UTF-8 text, a '#version' line at most, then 'a b' pairs."""
    try:
        lines = path.read_bytes().decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return False
    return all(len(line.split(" ")) == 2 for line in lines if line and not line.startswith("#version"))


# ------------------------------------------------------------------------------------ identity

WEIGHTS = ("*.safetensors", "pytorch_model*.bin")  # a folder's weight files (from_pretrained loads them)
WEIGHT_GLOBS = (*WEIGHTS, "*.safetensors.index.json", "pytorch_model*.bin.index.json")  # and their shard indexes


def has_weights(folder: Path) -> bool:
    """The folder holds weights (loaded with ``from_pretrained``; without them: random init from its config)."""
    return any(any(folder.glob(g)) for g in WEIGHTS)

_CHUNK = 8 << 20


@functools.lru_cache(maxsize=64)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


def weights_digest(folder: Path) -> str | None:
    """SHA-256 over each weight file's name and SHA-256 of its bytes; None without weight files.

    All the bytes, not the headers: two fine-tunes of one model have the same headers and sizes and
    differ only in the tensors. Hashing runs at about 1-2 GB/s (a 7B model in bf16: ~10 s), once per
    file version per process (cached by path, size and modification time)."""
    files = sorted({p for g in WEIGHT_GLOBS for p in folder.glob(g) if p.is_file()})
    if not files:
        return None
    h = hashlib.sha256()
    for p in files:
        st = p.stat()
        h.update(f"{p.name}\0{_file_sha256(str(p.resolve()), st.st_size, st.st_mtime_ns)}\n".encode())
    return h.hexdigest()


def check_folder(folder: Path, root: Path, hf_cfg, tokenizer_names: tuple[str, ...]) -> None:
    """Weights and tokenizer files of a model folder (its config.json was checked when read)."""
    check_weights(folder, hf_cfg)
    check_tokenizer_files(folder, root, tokenizer_names)


def file_state(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """(name, size, mtime) of every file in ``folder``: what a cached check of it depends on."""
    out = []
    for p in sorted(folder.iterdir()):
        try:
            st = p.stat()
        except OSError:  # a dangling symlink: checked (and refused) by name
            out.append((p.name, -1, -1))
            continue
        out.append((p.name, st.st_size, st.st_mtime_ns))
    return tuple(out)

