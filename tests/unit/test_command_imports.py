"""Each command imports only what it uses (issue 47): the SageMaker SDK only where a request is built or sent,
no plotting on the plan path, `fp8lab env` without importing what it only reports, `--help` without the
library. Checked in a fresh process each (what a user's command loads), not by timing."""
from __future__ import annotations

import subprocess
import sys

import pytest

from fp8lab.core.paths import REPO_ROOT


def _loaded_after(argv: list[str]) -> set[str]:
    code = ("import contextlib, io, sys\n"
            "from fp8lab.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n    rc = main({argv!r})\n"
            "assert rc == 0, rc\n"
            "print(' '.join(sorted(m for m in sys.modules)))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return set(proc.stdout.split())


def _top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


@pytest.mark.parametrize("argv, absent", [
    (["launch", "plan", "--models", "llama-7b", "--instance-counts", "1", "2"], {"sagemaker", "matplotlib", "torch"}),
    (["env"], {"transformers", "sagemaker", "pandas", "matplotlib"}),
    (["--help"], {"torch", "pandas", "sagemaker", "transformers", "matplotlib"}),
])
def test_a_command_loads_only_what_it_uses(argv, absent):
    loaded = _top(_loaded_after(argv))
    assert not loaded & absent, f"fp8lab {' '.join(argv)} imported {sorted(loaded & absent)}"


def test_help_loads_no_sub_command():
    loaded = _loaded_after(["--help"])
    assert not {m for m in loaded if m.startswith("fp8lab.") and m != "fp8lab.cli"}, sorted(loaded)
