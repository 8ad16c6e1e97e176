"""What every figure of fp8lab shares: saving (PNG + SVG), PNG bytes, showing in a notebook, the panel grid and its
limits, the empty figure that says no data was measured, the model order, one legend below all panels."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import matplotlib.container
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fp8lab.analysis import model_size_b
from fp8lab.views.figure_checks import figure_problems, figure_stats, to_png  # noqa: F401 (figure_stats: re-exported)

NO_DATA = "no measured runs yet"


def save_figure(fig: Figure, path: str | Path) -> list[Path]:
    """Write ``path``.png and ``path``.svg (any suffix on ``path`` is replaced)."""
    stem = Path(path).with_suffix("")
    stem.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for ext in (".png", ".svg"):
        fig.savefig(stem.with_suffix(ext), dpi=120, bbox_inches="tight")
        out.append(stem.with_suffix(ext))
    return out


def figure_name(fig: Figure) -> str:
    """A file name for ``fig``: its title (else its first panel's), lower case, words joined by '-'."""
    title = fig.get_suptitle() or next((ax.get_title() for ax in fig.axes if ax.get_title()), "") or "figure"
    words = re.findall(r"[a-z0-9]+", title.split("\n")[0].lower())
    return "-".join(words)[:60].strip("-") or "figure"


def show(fig: Figure, name: str | None = None, folder: str | Path = ".") -> None:
    """Display a figure as a PNG in a notebook, whatever the matplotlib backend (Agg included), and write the same
    PNG to ``folder``/``name``.png (a notebook's working folder: ``outputs/<notebook>/`` under ``fp8lab notebooks
    run``; ``name`` defaults to :func:`figure_name`). A pyplot figure is closed, so that the notebook's inline
    backend does not draw it a second time.

    The output's metadata carries :func:`figure_stats` (bars per panel, legend entries, pixels) and the
    readability problems :func:`fp8lab.views.figure_checks.figure_problems` finds, so a test of the executed notebook
    can check that each figure stays readable."""
    from IPython.display import Image, display

    png = to_png(fig)
    path = Path(folder) / f"{name or figure_name(fig)}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    meta = {**figure_stats(fig, png=png), "problems": figure_problems(fig), "file": path.name}
    display(Image(data=png, format="png"), metadata={"fp8lab": meta})
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close(fig)


def _new(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.8, **kw) -> tuple[Figure, np.ndarray]:
    # Figure() directly (not pyplot) keeps figures out of pyplot's global registry; notebooks display it.
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


MAX_BARS = 12  # bars or rows a panel shows at most; tables carry the rest
MAX_COLS = 2  # panels side by side at most, so a figure stays within a screen's width
MAX_COLS_SMALL = 3  # ... for small panels (a handful of bars each), so that ten models stay within a screen's height
MAX_LEGEND_KINDS = 8  # kinds of run one loss panel's legend names at most
MAX_HEADLINE_PANELS = 4  # the headline figure's models (2 x 2): more would not fit a screen's height
_HATCHES = ["", "//", "..", "xx", "\\\\", "++"]  # a second cue beside colour, one per bar kind


def _grid(n: int, width: float = 5.0, height: float = 3.8, max_cols: int = MAX_COLS, **kw) -> tuple[Figure, list]:
    """``n`` panels in rows of at most ``max_cols``; the unused cells hidden."""
    ncols = max(1, min(max_cols, n))
    fig, axes = _new(ncols=ncols, nrows=-(-max(n, 1) // ncols), width=width, height=height, **kw)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _empty(title: str, message: str = NO_DATA) -> Figure:
    fig, axes = _new()
    ax = axes[0, 0]
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="0.4")
    ax.set_title(title)
    ax.set_xticks([])
    ax.set_yticks([])
    return fig


def _finish(fig: Figure, save: str | Path | None) -> Figure:
    if save is not None:
        save_figure(fig, save)
    return fig


def _models(frame: pd.DataFrame) -> list[str]:
    """Model names ordered by parameter count parsed from the name, then alphabetically."""
    names = [m for m in frame["model"].dropna().unique()]
    return sorted(names, key=lambda m: (np.nan_to_num(model_size_b(m), nan=np.inf), str(m)))


def _shared_legend(fig: Figure, axes: np.ndarray) -> None:
    """One legend below all panels (each label once), so it never hides a bar."""
    seen: dict[str, object] = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    if seen:
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", ncols=min(4, len(seen)), fontsize=8)


def _tick_name(name: str, width: int = 11) -> str:
    """A model name on two lines where it is long (at its first '-' past the start), so neighbours never collide."""
    if len(name) <= width or "-" not in name[1:]:
        return name
    head, tail = name.split("-", 1)
    return f"{head}-\n{tail}"
