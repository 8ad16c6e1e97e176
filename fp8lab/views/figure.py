"""What every figure of fp8lab shares: saving (PNG + SVG), PNG bytes, showing in a notebook, the panel grid and its
limits, the empty figure that says no data was measured, the model order, one legend below all panels."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fp8lab.analysis import model_size_b

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


def to_png(fig: Figure, dpi: int = 110) -> bytes:
    """The figure as PNG bytes (for HTML reports and notebook display)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def show(fig: Figure) -> None:
    """Display a figure as a PNG in a notebook, whatever the matplotlib backend (Agg included).

    The output's metadata carries :func:`figure_stats` (bars per panel, legend entries, pixels), so a
    test of the executed notebook can check that each figure stays readable."""
    from IPython.display import Image, display

    png = to_png(fig)
    display(Image(data=png, format="png"), metadata={"fp8lab": figure_stats(fig, png=png)})


def _new(ncols: int = 1, nrows: int = 1, width: float = 5.0, height: float = 3.8, **kw) -> tuple[Figure, np.ndarray]:
    # Figure() directly (not pyplot) keeps figures out of pyplot's global registry; notebooks display it.
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


MAX_BARS = 12  # bars or rows a panel shows at most; tables carry the rest
MAX_COLS = 2  # panels side by side at most, so a figure stays within a screen's width
MAX_HEADLINE_PANELS = 4  # the headline figure's models (2 x 2): more would not fit a screen's height
_HATCHES = ["", "//", "..", "xx", "\\\\", "++"]  # a second cue beside colour, one per bar kind


def _grid(n: int, width: float = 5.0, height: float = 3.8, **kw) -> tuple[Figure, list]:
    """``n`` panels in rows of at most ``MAX_COLS``; the unused cells hidden."""
    ncols = max(1, min(MAX_COLS, n))
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
