"""Execute a committed notebook as JupyterLab does: from a copy of the notebooks folder, the kernel
started in that folder (not in the runner's outputs/<name>/), with papermill for the parameters."""
from __future__ import annotations

import shutil
from pathlib import Path

from fp8lab.notebooks import NOTEBOOK_DIR, default_kernel, read_glued


def run_from_notebooks_folder(root: Path, name: str, params: dict | None = None) -> dict:
    """Run ``notebooks/<name>.ipynb`` copied to ``root/notebooks/`` with the kernel's working folder
    there; returns the glued values (the executed copy is written outside the notebooks folder)."""
    import papermill as pm

    folder = root / "notebooks"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(NOTEBOOK_DIR / f"{name}.ipynb", folder / f"{name}.ipynb")
    executed = root / f"executed-{name}.ipynb"
    pm.execute_notebook(str(folder / f"{name}.ipynb"), str(executed), parameters=params or {},
                        kernel_name=default_kernel(), cwd=str(folder), progress_bar=False)
    return read_glued(executed)
