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
    """The most lines one code cell shows a person: its printed lines, a table's rows as the notebook renders it
    (HTML), other results' plain-text lines; figures aside."""
    nb = nbformat.read(str(executed), as_version=4)
    most = 0
    for c in nb.cells:
        if c.cell_type != "code":
            continue
        n = 0
        for o in c.outputs:
            data = o.get("data", {})
            if o.get("output_type") == "stream":
                n += len(o.get("text", "").rstrip("\n").splitlines())
            elif "text/html" in data:
                n += data["text/html"].count("<tr")
            elif "image/png" not in data and "text/markdown" not in data:
                n += len(data.get("text/plain", "").rstrip("\n").splitlines())
            elif "text/markdown" in data:  # its lines of text: a blank line between loose bullets is spacing
                n += sum(1 for line in "".join(data["text/markdown"]).splitlines() if line.strip())
        most = max(most, n)
    return most
