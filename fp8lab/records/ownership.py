"""fp8lab writes, replaces and deletes only what it wrote itself.

Each folder fp8lab writes into is one of four kinds, each with the names fp8lab puts there:

* ``run`` (``--output-dir``): config.json, metrics.jsonl, summary.json, loss.png, profile.json, the
  run lock, and the default ``checkpoints/``, ``model/`` and ``data/`` folders;
* ``tokens`` (the token cache ``<output-dir>/data``, ``fp8lab prepare-data OUT_DIR``): manifest.json,
  tokenizer.json, ``train_NNNNN.bin`` / ``val_NNNNN.bin``;
* ``checkpoints`` (``--checkpoint-dir``): ``step_NNNNNNNN/`` folders;
* ``model`` (``--model-dir``): the Hugging Face export.

A folder fp8lab creates or adopts gets a marker, :data:`MARKER` (``{"written_by": "fp8lab", "kind": ...}``),
except a checkpoint folder, whose ``step_NNNNNNNN/`` names (each with fp8lab's manifest) say whose they are.
A folder without the marker is fp8lab's only when it is empty, or holds nothing but fp8lab's names
of its kind (an fp8lab folder from before the marker: a token folder with its fp8lab manifest, a run
folder whose config.json is fp8lab's, a model folder at its default place in a run folder); anything
else is the user's, and fp8lab refuses to write there, asking for a new folder. It never deletes a
file it did not write.

:func:`check_run_folders` (the trainer's set-up, before any folder is created) also refuses folders
that overlap where one run would clobber another's files: two write folders that are the same, a
write folder inside one whose contents fp8lab replaces (checkpoints, model, tokens), a write folder
in or around the ``--data``/``--model`` the run reads, and the repository checkout's own folders.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from fp8lab.records.data_format import tokenized_here
from fp8lab.core.paths import DATA_DIR, REPO_ROOT

MARKER = ".fp8lab-owner.json"
LOCK = ".fp8lab-lock"  # fp8lab.records.runlock
_TMP = r"|.+\.tmp"
NAMES = {
    "run": re.compile(r"(config\.json|metrics\.jsonl|summary\.json|loss\.png|profile\.json|checkpoints|model|data"
                      + "|" + re.escape(LOCK) + _TMP + ")"),
    "tokens": re.compile(r"(manifest\.json|tokenizer\.json|(train|val)_\d{5}\.bin" + _TMP + ")"),
    "checkpoints": re.compile(r"step_\d{8}(\.tmp)?"),
    "model": re.compile(r"(config\.json|generation_config\.json|model(-\d{5}-of-\d{5})?\.safetensors|"
                        r"model\.safetensors\.index\.json|tokenizer(_config)?\.json|special_tokens_map\.json|"
                        r"tokenizer\.model|vocab\.json|merges\.txt|added_tokens\.json|chat_template\.jinja" + _TMP + ")"),
}
# the checkout's own parts (when fp8lab runs from a clone): never a place for run outputs
CHECKOUT_PARTS = ("fp8lab", "data", "tests", "notebooks", "docs", "benchmarks", "scripts", ".git", ".venv")


def marker_kind(folder: Path) -> str | None:
    """The kind fp8lab marked ``folder`` with, or None (no marker, or not fp8lab's)."""
    try:
        m = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return m.get("kind") if isinstance(m, dict) and m.get("written_by") == "fp8lab" else None


def foreign(folder: str | Path, kind: str, default_place: bool = False) -> list[str]:
    """Entries of ``folder`` fp8lab did not write as a folder of ``kind`` (empty: fp8lab may write there).

    ``default_place``: the folder is at its default place in an fp8lab run folder (``model/``)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    names = sorted(p.name for p in folder.iterdir() if p.name != MARKER)
    mark = marker_kind(folder)
    if mark is not None and mark != kind:
        return [f"{MARKER} (an fp8lab {mark} folder, not a {kind} folder)"]
    if mark is None and names and not _legacy_ok(folder, kind, default_place):
        return names
    return [n for n in names if not NAMES[kind].fullmatch(n)]


def _legacy_ok(folder: Path, kind: str, default_place: bool) -> bool:
    """An unmarked, non-empty folder that an earlier fp8lab wrote (see the module doc)."""
    if kind == "tokens":
        return _json(folder / "manifest.json").get("format") == "fp8lab-tokens"
    if kind == "run":
        return not (folder / "config.json").exists() or _fp8lab_config(folder)
    if kind == "model":
        return default_place
    return True  # checkpoints: step_NNNNNNNN folders are fp8lab's names


def _fp8lab_config(folder: Path) -> bool:
    """``folder`` holds a run's config.json as fp8lab writes it (its ``command`` is an fp8lab one)."""
    return str(_json(folder / "config.json").get("command", "")).startswith("fp8lab ")


def _json(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def refuse_foreign(option: str, folder: str | Path, kind: str, default_place: bool = False) -> None:
    """ValueError naming ``option`` when ``folder`` holds files fp8lab did not write."""
    bad = foreign(folder, kind, default_place)
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ValueError(f"{option}={str(folder)!r} holds files fp8lab did not write ({shown}); fp8lab never "
                         f"overwrites or deletes them; allowed: a new or empty folder, or one fp8lab wrote")


def claim(folder: str | Path, kind: str) -> Path:
    """Create ``folder`` if needed and mark it as fp8lab's (after :func:`refuse_foreign` said it may)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if marker_kind(folder) is None:
        tmp = folder / (MARKER + ".tmp")
        tmp.write_text(json.dumps({"written_by": "fp8lab", "kind": kind}) + "\n")
        tmp.replace(folder / MARKER)
    return folder


def remove_own(folder: str | Path, kind: str) -> None:
    """Delete fp8lab's own entries of ``folder`` (its names of ``kind``), nothing else."""
    import shutil

    folder = Path(folder)
    if not folder.is_dir():
        return
    for p in folder.iterdir():
        if NAMES[kind].fullmatch(p.name):
            shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


# ------------------------------------------------------------------------------------ a run's folders

def _inside(a: Path, b: Path) -> bool:
    """``a`` is ``b`` or inside it."""
    return a == b or b in a.parents


def _checkout_parts() -> list[Path]:
    parts = [REPO_ROOT / n for n in CHECKOUT_PARTS] if (REPO_ROOT / "pyproject.toml").is_file() else []
    return [p.resolve() for p in parts + [DATA_DIR] if p.exists()]


def check_run_folders(c, paths, source: str | None, *, model_folder: str | None) -> None:
    """Refuse (ValueError, one line naming the options) folders of a run that overlap, reach into the
    checkout, or hold files fp8lab did not write (see the module doc). Writes nothing. ``model_folder``:
    ``--model`` where it names a local folder of the user's (``fp8lab.model.user``), else None."""
    tokenized = tokenized_here(source)
    writes = [("--output-dir", paths.output_dir, "run")]
    if c.checkpoint_every >= 0 or c.resume:
        writes.append(("--checkpoint-dir", paths.checkpoint_dir, "checkpoints"))
    if c.save_model:
        writes.append(("--model-dir", paths.model_dir, "model"))
    if tokenized:
        writes.append(("--output-dir (its token cache data/)", paths.data_cache, "tokens"))
    reads = [("--data", source)] if source is not None and not str(source).startswith("hf:") else []
    if model_folder is not None:
        reads.append(("--model", model_folder))
    resolved = [(o, Path(p).resolve(), k) for o, p, k in writes]
    _check_overlaps(resolved, [(o, Path(p).resolve()) for o, p in reads])
    out = resolved[0][1]
    run_folder = marker_kind(out) == "run" or _fp8lab_config(out)  # its model/ then is fp8lab's export
    for option, folder, kind in resolved:
        refuse_foreign(option, folder, kind, default_place=run_folder and folder == out / "model")


def _check_overlaps(writes: list[tuple[str, Path, str]], reads: list[tuple[str, Path]]) -> None:
    for i, (oa, a, ka) in enumerate(writes):
        for ob, b, kb in writes[i + 1:]:
            if a == b:
                raise ValueError(f"{oa} and {ob} are the same folder ({a.name!r}); fp8lab would write one's files "
                                 f"over the other's; allowed: separate folders (the defaults are inside --output-dir)")
        for ob, b, kb in writes:
            if kb != "run" and a != b and _inside(a, b):
                raise ValueError(f"{oa} is inside {ob} ({b.name!r}), whose contents fp8lab replaces; allowed: "
                                 f"{oa} outside {ob}")
        for ob, b in reads:
            if _inside(a, b) or (ka != "run" and _inside(b, a)):
                where = "inside" if _inside(a, b) else "around"
                raise ValueError(f"{oa} is {where} {ob} ({b.name!r}): fp8lab would write where the run reads; "
                                 f"allowed: an {oa.split()[0]} apart from {ob}, e.g. a new folder")
        _check_checkout(oa, a)


def _check_checkout(option: str, folder: Path) -> None:
    parts = _checkout_parts()
    hit = [p.name + "/" for p in parts if _inside(folder, p)] or (["its root"] if parts and folder == REPO_ROOT.resolve() else [])
    if hit:
        raise ValueError(f"{option} is in the fp8lab checkout ({hit[0]}); fp8lab never writes there; allowed: a "
                         "folder outside it, or under runs/ or outputs/")
