"""Where the repository's shipped files are, independent of the working directory.

Notebooks run with their cwd under ``outputs/``; the library finds ``data/`` from here.
"""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# FP8LAB_DATA_DIR lets an installed copy (or a SageMaker job) point at another data folder.
DATA_DIR = Path(os.environ.get("FP8LAB_DATA_DIR", REPO_ROOT / "data"))
RESULTS_DIR = DATA_DIR / "results"
