"""The two test tiers: the README's test command runs the fast one (``-m "not slow"``), ``.ci/run`` runs that
command and then the slow tier, and every test that tests/conftest.py's ``SLOW`` names exists (a renamed test
would otherwise drop into the fast tier unnoticed)."""
from __future__ import annotations

import ast
import re

import conftest  # tests/conftest.py: pytest put its folder on sys.path
from fp8lab.core.paths import REPO_ROOT

TESTS = REPO_ROOT / "tests"


def _readme_test_command() -> str:
    (cmd,) = re.findall(r"^bash scripts/setup\.sh && \.venv/bin/python -m pytest.*$", (REPO_ROOT / "README.md").read_text(), re.M)
    return cmd


def test_readme_runs_the_fast_tier_and_ci_runs_it_then_the_slow_tier():
    cmd = _readme_test_command()
    assert cmd.endswith('-m "not slow"'), cmd
    lines = [l.strip() for l in (REPO_ROOT / ".ci" / "run").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert cmd in lines, "the README's test command is what CI runs"
    assert lines[lines.index(cmd) + 1:] == [".venv/bin/python -m pytest -m slow"]
    assert "set -euo pipefail" in lines  # a failing fast tier stops CI; both tiers must pass


def test_every_test_the_slow_list_names_exists():
    assert conftest.SLOW, "no slow tier declared"
    for file, names in conftest.SLOW.items():
        found = sorted(TESTS.rglob(file))
        assert len(found) == 1, f"{file}: {found}"
        if names == conftest.ALL:
            continue
        tree = ast.parse(found[0].read_text())
        defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
        bare = {n.split("[")[0] for n in names}
        assert bare <= defined, f"{file}: no test named {sorted(bare - defined)}"
