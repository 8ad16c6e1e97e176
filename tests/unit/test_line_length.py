"""A line length is set (pyproject.toml's [tool.ruff] line-length) and applied to fp8lab/. The lines still over it
are counted here and may only go down: PENDING is their number until the one reformatting pass brings it to 0."""
from __future__ import annotations

import tomllib

from fp8lab.core.paths import REPO_ROOT

PENDING = 0  # lines of fp8lab/ over the limit


def long_lines(limit: int) -> list[str]:
    out = []
    for path in sorted((REPO_ROOT / "fp8lab").rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if len(line) > limit:
                out.append(f"{path.relative_to(REPO_ROOT)}:{n} ({len(line)})")
    return out


def test_no_more_lines_over_the_limit_than_pending():
    limit = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["line-length"]
    assert limit == 120
    found = long_lines(limit)
    assert len(found) <= PENDING, (f"{len(found)} lines over {limit} characters (at most {PENDING}); wrap the new ones: "
                                   + ", ".join(found[:20]))
