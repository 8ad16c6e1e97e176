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
    """Importing the planner opens no result file and no evidence: the first plan reads the packaged evidence."""
    probe = ("import builtins, io, pathlib; opened = []\n"
             "real = io.open\n"
             "def spy(f, *a, **k):\n"
             "    opened.append(str(f)); return real(f, *a, **k)\n"
             "io.open = builtins.open = spy\n"
             "import fp8lab, fp8lab.plan.runplan, fp8lab.plan.config, fp8lab.launch\n"
             "print([f for f in opened if f.endswith('.json')])\n")
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


def test_report_docs_writes_the_evidence(tmp_path):
    from fp8lab.views import report

    docs = report.render_docs()
    assert docs[evidence.DOC] == evidence.render(RESULTS_DIR)
    assert Path(evidence.DOC).parts[:2] == ("fp8lab", "plan")
