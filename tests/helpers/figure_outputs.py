"""The figures an executed notebook shows, as fp8lab.views.plots.show recorded them: each must be readable
(fp8lab.views.figure_checks found nothing) and written as a PNG file into the notebook's working folder."""
from __future__ import annotations

import base64
from pathlib import Path

import nbformat


def shown_figures(executed: Path) -> list[tuple[dict, bytes]]:
    """(what fp8lab.views.plots.show recorded, the PNG) for every image output of an executed notebook."""
    nb = nbformat.read(str(executed), as_version=4)
    return [(o.get("metadata", {}).get("fp8lab"), base64.b64decode(o["data"]["image/png"]))
            for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]


def assert_figures_readable_and_saved(executed: Path, folder: Path) -> list[str]:
    """Every figure went through fp8lab.views.plots.show, broke no readability rule, and lies in ``folder`` as the PNG
    the notebook shows; returns the files' names."""
    names = []
    for meta, png in shown_figures(executed):
        assert meta is not None, "a figure shown without fp8lab.views.plots.show: no readability check, no file"
        assert meta["problems"] == [], (meta["file"], meta["problems"])
        assert (folder / meta["file"]).read_bytes() == png, meta["file"]
        names.append(meta["file"])
    assert len(set(names)) == len(names), f"two figures written to one file: {names}"
    return names


def longest_cell_output(executed: Path) -> int:
    """The most lines one code cell shows as text: its printed lines plus each result's plain-text form."""
    nb = nbformat.read(str(executed), as_version=4)
    most = 0
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        n = 0
        for o in c.outputs:
            text = o.get("text", "") if o.get("output_type") == "stream" else o.get("data", {}).get("text/plain", "")
            n += len(text.rstrip("\n").splitlines()) if "image/png" not in o.get("data", {}) else 0
        most = max(most, n)
    return most
