"""Bring your own model: a local Hugging Face folder or ``hf:<repo id>`` wherever a model name goes.

``--model`` (trainer, ``trainpair``, notebooks 02/03, ``JobSpec``) takes one of three things:

* a named shape of ``fp8lab.model.models.MODEL_CONFIGS`` (``llama-tiny``, ``llama-7b``, ...);
* a local folder holding a transformers ``config.json`` and optionally weights (``*.safetensors``,
  loaded with ``from_pretrained``; without them the model is initialised at random from the config);
* ``hf:<repo id>``: downloaded from the Hugging Face Hub into its cache, then used as a folder. It
  needs the network: offline (``HF_HUB_OFFLINE=1`` or no route to the Hub) it fails at once with
  one line that says so, unless the repository is already in the local cache.

Supported architectures (``model_type``, ``fp8lab.model.families``): ``llama`` (Llama 2 and 3.x: GQA, any
RoPE variant transformers implements, tied or untied embeddings, ``head_dim`` other than
hidden/heads, attention/MLP biases), ``mistral`` (with or without ``sliding_window``), ``qwen2``
(Q/K/V biases, tied embeddings, per-layer sliding windows) and ``gpt_neo``. Anything else (Gemma,
Phi, mixtures of experts, ...) is refused from its config.json with what makes it different and the
list; so is a config with ``auto_map`` (custom modelling code, never executed) and a folder whose
weights do not fit its config (missing tensors or other shapes). What the fused conversion cannot
represent exactly is refused by the trainer before anything is built, naming ``--fuse False`` as the
alternative (``fp8lab.fp8.fused_problem``). Sharded checkpoints (``model.safetensors.index.json``)
load as ``from_pretrained`` loads them.

Checked when the folder is first read, before anything is built (``fp8lab.model.checks``): the
config.json fields, the safetensors headers against the config's shapes, the tokenizer files
(inside the folder, parseable); one line per problem, naming the field or file.

The config is turned into fp8lab's ``ModelConfig`` (``fp8lab.model.models.config_from_hf``), so FLOPs/MFU,
the layout resolver's memory model and checkpoint fingerprints treat a folder like a named shape;
named-model overrides (``--model-override``) are refused for folders: edit the config instead.

Tokenizer: a folder with tokenizer files tokenizes the run's text with its own tokenizer
(``fp8lab.data.model_tokenizer``: transformers' AutoTokenizer, local files only), so token ids mean what
they meant to the pretrained checkpoint; a folder without them uses fp8lab's byte-level BPE tokenizer
(``fp8lab.data.tokens``). The tokenizer's ids must fit the model's vocab_size (checked). The export
copies the folder's own tokenizer files along when it had them (so the folder keeps its format),
else the data tokenizer; the run's ``config.json`` lists them under ``model_source``.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import shutil
import socket
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from fp8lab.model import families, checks as model_checks
from fp8lab.model.config import MODEL_CONFIGS, config_from_hf, init_from_config, validate_config
from fp8lab.core import paths as fpaths

HF_PREFIX = "hf:"
SUPPORTED = {k: f"{f.hf_class} ({f.label})" for k, f in families.SUPPORTED.items()}
# files of a tokenizer that save_pretrained/from_pretrained read; copied to the exported folder
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json")
# where save_pretrained keeps the chat template beside them (recent transformers no longer inside
# tokenizer_config.json): copied, hashed and fetched with them, but a template alone is no tokenizer
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
TOKENIZER_FOLDER_FILES = TOKENIZER_FILES + CHAT_TEMPLATE_FILES
HUB_PATTERNS = ["config.json", "*.safetensors", "*.safetensors.index.json", *TOKENIZER_FOLDER_FILES]
CONNECT_TIMEOUT_S = 3.0


def is_user_model(spec: Any) -> bool:
    """True for ``hf:<repo>`` or a string that names an existing folder; a named shape never is, even
    where a folder of that name happens to exist in the working directory."""
    return (isinstance(spec, str) and spec not in MODEL_CONFIGS
            and (spec.startswith(HF_PREFIX) or Path(spec).is_dir()))


def _hub_reachable() -> str | None:
    """None when the Hub answers a TCP connect within a few seconds, else why not."""
    host = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        return f"cannot reach {host} ({exc.__class__.__name__}: {exc})"
    return None


_HUB_FOLDERS: dict[str, Path] = {}  # hf: specs this process has resolved (describe, checks and build each look one up)


def _hub_folder(spec: str) -> Path:
    """The local snapshot of ``hf:<repo id>``: the cache when it has one, else a download; once per process."""
    known = _HUB_FOLDERS.get(spec)
    if known is not None and (known / "config.json").is_file():
        return known
    _HUB_FOLDERS[spec] = folder = _find_hub_folder(spec)
    return folder


def _find_hub_folder(spec: str) -> Path:
    repo = spec[len(HF_PREFIX):].strip()
    if not repo or repo.count("/") > 1 or any(ch.isspace() for ch in repo):
        raise ValueError(f"--model={spec!r} is invalid; allowed: hf:<repo id>, e.g. hf:EleutherAI/gpt-neo-125m")
    from huggingface_hub import snapshot_download

    try:  # already downloaded: no network needed
        return Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except Exception:  # noqa: BLE001 - any miss means "not cached"
        pass
    hint = (f"download it where the Hub is reachable (huggingface-cli download {repo} --local-dir DIR) "
            f"and pass --model DIR")
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    why = "HF_HUB_OFFLINE is set" if offline else _hub_reachable()
    if why:
        raise ValueError(f"--model={spec!r} needs network access to the Hugging Face Hub, but {why}; {hint}")
    try:
        return Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # noqa: BLE001 - one line, not the hub client's traceback
        raise ValueError(f"--model={spec!r}: download from the Hugging Face Hub failed "
                         f"({exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                         f"{hint}") from None


def folder_of(spec: str) -> Path:
    """The local folder for a user model spec (downloads ``hf:`` repos when the Hub is reachable)."""
    folder = _hub_folder(spec) if spec.startswith(HF_PREFIX) else Path(spec)
    if not (folder / "config.json").is_file():
        raise ValueError(f"--model={spec!r}: no config.json in {folder.name or spec!r}; a model folder needs a "
                         f"transformers config.json (and optionally *.safetensors weights)")
    return folder


def _read_config_file(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--model: cannot read {path.name} ({exc.__class__.__name__}: {exc})") from None
    if not isinstance(d, dict):
        raise ValueError(f"--model: {path.name} must hold a JSON object")
    return d


def check_config_dict(d: dict, where: str = "config.json"):
    """The transformers config for a config.json dict, or a ValueError listing what is supported."""
    mt = d.get("model_type")
    if not isinstance(mt, str) or mt not in SUPPORTED:
        raise ValueError(families.unsupported_reason(mt, where))
    if d.get("auto_map"):
        raise ValueError(f"--model: {where} has auto_map (custom modelling code: {', '.join(sorted(d['auto_map']))}); "
                         f"fp8lab never runs a folder's code and supports the transformers classes only: "
                         f"{families.supported_list()}")
    model_checks.check_config_fields(d, where)  # field by field, before transformers reads them
    from transformers import AutoConfig

    from fp8lab.model import rope  # torch: a folder's config is read without it

    body = {k: v for k, v in d.items() if k != "model_type"}
    try:
        with _transformers_complaints() as complaints:
            hf = AutoConfig.for_model(mt, **body)
    except Exception as exc:  # noqa: BLE001 - TypeError, KeyError, huggingface_hub's StrictDataclass*ValidationError
        said = " ".join(str(exc).split())[:300]
        raise ValueError(f"--model: {where} is not a valid {mt} config ({type(exc).__name__}: {said}); allowed: "
                         "the values transformers accepts") from None
    if families.SUPPORTED[mt].layout == "llama" and rope.rope_type(hf) not in rope.known_types():
        raise ValueError(f"--model: {where}: {rope.rope_problem(hf)}")
    if complaints:
        raise ValueError(f"--model: {where} is not a valid {mt} config (transformers: {complaints[0][:300]}); "
                         "allowed: the values transformers accepts")
    validate_config(config_from_hf(hf), f"--model ({where})")
    return hf


@contextlib.contextmanager
def _transformers_complaints():
    """The warnings transformers logs while it validates a config that say a value is invalid ("... must
    be ...": RoPE factors, orders, lengths); collected, so fp8lab refuses what transformers only logs."""
    import logging

    log = logging.getLogger("transformers.modeling_rope_utils")
    found: list[str] = []
    others: list[logging.LogRecord] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            if record.levelno >= logging.WARNING and (" must " in msg or "Missing validation function" in msg):
                found.append(" ".join(msg.split()))
            else:
                others.append(record)

    handler, level, propagate = _Collect(), log.level, log.propagate
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False  # a refusal is one line, not the log's lines as well
    try:
        yield found
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
        if not found:  # a config that passes: transformers' other notes reach its log as before
            for record in others:
                log.handle(record)


@functools.lru_cache(maxsize=32)
def _load(folder: str, mtime_ns: int) -> tuple[Any, str]:
    raw = (Path(folder) / "config.json").read_bytes()
    d = _read_config_file(Path(folder) / "config.json")
    return check_config_dict(d), hashlib.sha256(raw).hexdigest()


@functools.lru_cache(maxsize=32)
def _check_folder(folder: str, root: str, mtime_ns: int, files: tuple) -> None:
    """Weights and tokenizer files (fp8lab.model.checks), once per version of the folder's files."""
    model_checks.check_folder(Path(folder), Path(root), _load(folder, mtime_ns)[0], TOKENIZER_FOLDER_FILES)


def _root(spec: str, folder: Path) -> Path:
    """What the folder's files may link into: the folder, or for hf: the repository's cache folder
    (its snapshot files are symlinks to ../../blobs)."""
    return folder.resolve().parents[1] if spec.startswith(HF_PREFIX) else folder


def _loaded(spec: str) -> tuple[Any, str]:
    """(validated transformers config, SHA-256 of config.json) of a user model, read once per file version;
    its weights and tokenizer files are checked after the config, once per version of the folder."""
    folder = folder_of(spec)
    key = (str(folder.resolve()), (folder / "config.json").stat().st_mtime_ns)
    loaded = _load(*key)
    _check_folder(key[0], str(_root(spec, folder)), key[1], model_checks.file_state(folder))
    return loaded


def hf_config(spec: str):
    """The transformers config of a user model (validated; nothing is built)."""
    return _loaded(spec)[0]


def model_config(spec: str):
    return config_from_hf(hf_config(spec))


def config_sha256(spec: str) -> str:
    """SHA-256 of the user model's config.json (read once per file version, as ``hf_config``)."""
    return _loaded(spec)[1]


def weights_digest(spec: str) -> str | None:
    """SHA-256 over the user model's weight files (None without weights): what job names hash besides the config."""
    return model_checks.weights_digest(folder_of(spec))


def describe(spec: str) -> dict[str, Any]:
    """Provenance for the run's config.json: where the model came from, its config hash, its weights
    (the trainer adds the parameter counts: counting is ``fp8lab.model.models``')."""
    if spec in MODEL_CONFIGS:
        return {"source": "named", "name": spec}
    folder = folder_of(spec)
    cfg = hf_config(spec)
    return {
        "source": "hf" if spec.startswith(HF_PREFIX) else "folder",
        "name": spec if spec.startswith(HF_PREFIX) else folder.name,
        "model_type": cfg.model_type,
        "config_sha256": config_sha256(spec),
        "weights": "loaded (from_pretrained)" if model_checks.has_weights(folder) else "random init from config.json",
        # exported with the model when present; they tokenize the run's text unless --data is prepared already
        "tokenizer_files": [n for n in TOKENIZER_FOLDER_FILES if (folder / n).is_file()],
    }


def identity(spec: str) -> str:
    """What a checkpoint fingerprint records for the model: the name, or the config's hash (a folder
    may move, e.g. into a SageMaker channel, and stay the same model)."""
    if not is_user_model(spec):
        return spec
    return f"config.json sha256 {config_sha256(spec)[:16]}"


def build(spec: str, *, device: Any = None, dtype: Any = None, seed: int | None = 0):
    """The user's model as its HF class: ``from_pretrained`` when the folder has weights, else random
    init from its config (seeded like ``fp8lab.model.models.build_model``)."""
    import torch

    folder = folder_of(spec)
    cfg = hf_config(spec)
    cls = families.hf_class(cfg.model_type)
    dev = torch.device(device) if device is not None else torch.device("cpu")
    if model_checks.has_weights(folder) and dev.type != "meta":
        from transformers.utils import logging as hf_logging

        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            model = cls.from_pretrained(str(folder), dtype=dtype or torch.float32)
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        model = model.to(dev)
    else:
        model = init_from_config(cls, cfg, dev, dtype, seed)
    model.fp8lab_name = spec if spec.startswith(HF_PREFIX) else folder.name
    return model.eval() if dev.type == "meta" else model



def copy_tokenizer(spec: str, model_dir: Path) -> list[str]:
    """Copy the user's tokenizer files into ``model_dir``; returns the names copied (none: [])."""
    if not is_user_model(spec):
        return []
    folder = folder_of(spec)
    if not any((folder / n).is_file() for n in TOKENIZER_FILES):
        return []  # a template alone is no tokenizer: the export ships the data's instead
    copied = []
    # checked at the start (model_checks); a link leaving the folder is never copied
    for name in TOKENIZER_FOLDER_FILES:
        if (folder / name).is_file() and fpaths.is_inside(folder / name, _root(spec, folder)):
            shutil.copyfile(folder / name, model_dir / name)
            copied.append(name)
    return copied


def tokenizer_differs(spec: str, data_tokenizer: Path) -> bool:
    """The user's folder ``spec`` has a tokenizer (tokenizer.json, else vocab.json) that maps tokens to other ids than
    ``data_tokenizer`` (the tokenizer.json the run's data were tokenized with). Training then learns the data's ids,
    so the folder's tokenizer would decode the exported model's outputs as garbage."""
    if not is_user_model(spec):
        return False
    folder = folder_of(spec)
    from tokenizers import Tokenizer  # a dependency of transformers: loads where a user's folder is exported

    try:
        if (folder / "tokenizer.json").is_file():
            theirs = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab()
        elif (folder / "vocab.json").is_file():
            theirs = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        else:
            return False
        return theirs != Tokenizer.from_file(str(data_tokenizer)).get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer that does not read cannot be the data's
        return True
