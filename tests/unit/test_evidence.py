"""The evidence the plan's ``auto`` rules follow: package data tied to data/results/, read lazily into a frozen
value that ``plan_run`` receives; nothing read at import; the package's file list matches the tree."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from fp8lab.core.hardware import Machine
from fp8lab.core.paths import REPO_ROOT, RESULTS_DIR, SHIPPED_FILES
from fp8lab.plan import evidence
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.runplan import plan_run


def test_the_packaged_evidence_is_what_the_committed_results_say():
    committed = (REPO_ROOT / evidence.DOC).read_text(encoding="utf-8")
    assert committed == evidence.render(RESULTS_DIR), \
        f"{evidence.DOC} is stale: run `fp8lab report --docs` and commit the result"
    ev = evidence.load()
    assert ev == evidence.Evidence.from_dict(evidence.from_results(RESULTS_DIR))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ev.fp8_all_gather = False  # type: ignore[misc]


def test_the_plan_is_a_function_of_what_it_is_given():
    """The same config and machine plan differently only through the evidence passed; the default is the packaged."""
    h100 = Machine.planned("H100 80GB", 1, fp8=True, te_release="2.20.2")
    c = TrainConfig(model="llama-7b", precision="fp8", seq_len=8192, model_overrides={"num_layers": 4})
    measured = plan_run(c, h100)
    assert measured == plan_run(c, h100, evidence.load())
    assert measured.fp8_attention is evidence.load().fp8_attention_loss is True
    nothing = plan_run(c, h100, evidence.Evidence())
    assert not nothing.fp8_attention and "not committed yet" in nothing.reasons["fp8_attention"]
    p5 = Machine.planned("H100 80GB", 8, fp8=True, te_release="2.20.2")
    fsdp = TrainConfig(model="llama-1b", precision="fp8", backend="torchao", recipe="current", parallel="fsdp")
    assert plan_run(fsdp, p5).fp8_all_gather is True
    assert plan_run(fsdp, p5, evidence.Evidence()).fp8_all_gather is False


def test_nothing_is_read_at_import():
    """Importing fp8lab's commands opens none of its files (no result file, no evidence, no pins): the first plan
    reads the packaged evidence."""
    probe = ("import builtins, io, pathlib; opened = []\n"
             "real = io.open\n"
             "def spy(f, *a, **k):\n"
             "    opened.append(str(f)); return real(f, *a, **k)\n"
             "io.open = builtins.open = spy\n"
             "import fp8lab, fp8lab.plan.runplan, fp8lab.plan.config, fp8lab.launch, fp8lab.train.entry, fp8lab.cli\n"
             f"print([f for f in opened if f.startswith({str(REPO_ROOT)!r}) or f.endswith('.json')])\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_the_package_list_is_the_tree_and_ships_the_data_and_evidence():
    """pyproject.toml lists the packages (a folder added to fp8lab/ must be added there) and ships the evidence
    and the default corpus and tokenizers as package data."""
    meta = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tree = sorted(".".join(p.parent.relative_to(REPO_ROOT).parts) for p in (REPO_ROOT / "fp8lab").rglob("__init__.py"))
    assert sorted(set(meta["packages"]) - {"fp8lab.shipped"}) == tree
    assert meta["package-dir"]["fp8lab.shipped"] == "data"
    assert meta["package-data"]["fp8lab.plan"] == [evidence.FILE]
    assert meta["package-data"]["fp8lab.shipped"] == list(SHIPPED_FILES)
    assert all((REPO_ROOT / "data" / f).is_file() for f in SHIPPED_FILES)


# the configs whose plans differed between the wheel and the checkout when the evidence was read from data/results
WHEEL_CASES = {
    "llama-7b-4-layers-fp8-8192-h100": (dict(model="llama-7b", precision="fp8", seq_len=8192,
                                             model_overrides={"num_layers": 4}), ("H100 80GB", 1)),
    "llama-1b-fp8-torchao-fsdp-8": (dict(model="llama-1b", precision="fp8", backend="torchao", recipe="current",
                                         parallel="fsdp"), ("H100 80GB", 8)),
    "llama-1b-fp8-te-h200": (dict(model="llama-1b", precision="fp8"), ("H200 141GB", 1)),
}
_WHEEL_PROBE = """
import dataclasses, json, sys
from fp8lab.core.hardware import Machine
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.runplan import plan_run
cases = json.loads(sys.argv[1])
out = {}
for name, (kw, (gpu, n)) in cases.items():
    p = plan_run(TrainConfig(**kw), Machine.planned(gpu, n, True, te_release="2.20.2"))
    out[name] = {**p.decisions(), "reasons": p.all_reasons()}
print(json.dumps(out, sort_keys=True, default=str))
"""


def test_a_fresh_wheel_plans_as_the_checkout(tmp_path):
    """`pip install .` (not editable) into a fresh venv outside the checkout: the same RunPlan, reasons included,
    for the configs that once planned differently; the default tokenizer and corpus are found inside the package;
    stage_source works with FP8LAB_DATA_DIR elsewhere."""
    import json
    import os
    import shutil

    wheels, venv, elsewhere = tmp_path / "wheels", tmp_path / "venv", tmp_path / "data-elsewhere"
    elsewhere.mkdir()
    leftovers = [p for p in (REPO_ROOT / "build", REPO_ROOT / "fp8lab.egg-info") if not p.exists()]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels),
                    str(REPO_ROOT)], check=True, capture_output=True, timeout=300, cwd=tmp_path)
    for leftover in leftovers:  # setuptools builds in the source tree: what it added there goes
        shutil.rmtree(leftover, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index", "-q",
                    *map(str, wheels.glob("*.whl"))], check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "FP8LAB_DATA_DIR")}
    cases = json.dumps(WHEEL_CASES)
    there = subprocess.run([py, "-I", "-c", _WHEEL_PROBE, cases], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=300)
    assert there.returncode == 0, there.stderr
    here = subprocess.run([sys.executable, "-c", _WHEEL_PROBE, cases], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=300, check=True)
    assert json.loads(there.stdout) == json.loads(here.stdout)
    assert json.loads(there.stdout)["llama-7b-4-layers-fp8-8192-h100"]["fp8_attention"] is True
    assert json.loads(there.stdout)["llama-1b-fp8-torchao-fsdp-8"]["fp8_all_gather"] is True
    data = ("import fp8lab, json, sys; from fp8lab.core.paths import shipped_path; "
            "from fp8lab.records.data_format import default_corpus; from fp8lab.launch.requests import stage_source; "
            "code = stage_source(sys.argv[1]); "
            "print(json.dumps([fp8lab.__file__, str(shipped_path('tokenizer.json')), str(default_corpus()[0]), "
            "sorted(str(p.relative_to(code)) for p in (code / 'fp8lab' / 'shipped').rglob('*') if p.is_file())]))")
    run = subprocess.run([py, "-I", "-c", data, str(tmp_path / "code")], cwd=tmp_path,
                         env={**env, "FP8LAB_DATA_DIR": str(elsewhere)}, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    package, tokenizer, corpus, staged = json.loads(run.stdout.strip().splitlines()[-1])
    site = str(Path(package).parent)
    assert str(venv) in package and tokenizer.startswith(site) and corpus.startswith(site)
    assert staged == sorted(f"fp8lab/shipped/{f}" for f in SHIPPED_FILES)
