"""The notebook runner's kernels train on one torch thread unless told otherwise (fp8lab.notebooks.run)."""
from __future__ import annotations

import json
import os

import pytest

from fp8lab import notebooks


def _notebook(folder, source: str):
    nb = {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {"tags": ["parameters"]},
                     "outputs": [], "source": "x = 1"},
                    {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": source}],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    path = folder / "01_threads.ipynb"
    path.write_text(json.dumps(nb))
    return path


@pytest.mark.parametrize("value", [0, -1, True, 1.5, "2"])
def test_a_bad_thread_count_is_refused_before_anything_runs(tmp_path, value):
    with pytest.raises(ValueError, match=r"kernel_threads=.* is invalid; allowed: a positive integer, or None"):
        notebooks.run(directory=tmp_path, output_dir=tmp_path / "out", kernel_threads=value)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # starts a kernel
def test_the_kernel_sees_one_thread_and_the_caller_keeps_its_own(tmp_path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    _notebook(folder, "import os\nassert os.environ['OMP_NUM_THREADS'] == '1', os.environ.get('OMP_NUM_THREADS')")
    before = os.environ.get("OMP_NUM_THREADS")
    results = notebooks.run(directory=folder, output_dir=tmp_path / "out", progress=False)
    assert [r.ok for r in results] == [True]
    assert os.environ.get("OMP_NUM_THREADS") == before
