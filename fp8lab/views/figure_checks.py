"""Is a figure readable at a glance? The rules every figure of the notebooks and the report is held to.

:func:`figure_problems` draws a figure and returns one line per broken rule (an empty list: readable):

- screen-shaped: at most ``MAX_SIDE_PX`` pixels a side and an aspect of at most ``MAX_ASPECT`` : 1, as
  :func:`fp8lab.views.plots.to_png` renders it;
- at most ``MAX_LEGEND_ENTRIES`` legend entries in the whole figure and ``MAX_BARS`` bars a panel;
- no two text artists (tick labels, value labels, titles, legend texts) whose bounding boxes overlap;
- no two series drawn identically: two lines of one panel with the same colour, line style and marker
  (the reader cannot tell them apart), or the same data in the same line style and marker (one hides the other).
"""
from __future__ import annotations

import itertools

import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text

MAX_SIDE_PX = 2000
MAX_ASPECT = 3.0
MAX_LEGEND_ENTRIES = 8
MAX_BARS = 12
OVERLAP_PX = 2.0  # text boxes may touch by this much (glyph padding) before they count as overlapping


def _renderer(fig: Figure):
    if not hasattr(fig.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _texts(fig: Figure) -> list[Text]:
    """Every visible, non-empty text artist that is drawn (tick labels beyond an axis' limits are not)."""
    out = []
    for t in fig.findobj(Text):
        if not t.get_visible() or not t.get_text().strip() or t.get_alpha() == 0:
            continue
        if t.axes is not None and not t.axes.get_visible():
            continue
        out.append(t)
    return out


def _drawn_ticklabels(fig: Figure) -> set[int]:
    """ids of the tick labels matplotlib draws (those of ticks inside the view limits)."""
    drawn = set()
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        for axis in (ax.xaxis, ax.yaxis):
            for tick in axis._update_ticks():  # the ticks the axis draws now
                drawn.update(id(lab) for lab in (tick.label1, tick.label2) if lab.get_visible())
    return drawn


def _is_ticklabel(t: Text, fig: Figure) -> bool:
    return any(t in (tick.label1, tick.label2) for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)
               for tick in axis.get_major_ticks() + axis.get_minor_ticks())


def overlapping_labels(fig: Figure, renderer=None) -> list[tuple[str, str]]:
    """Pairs of drawn text artists whose bounding boxes overlap by more than ``OVERLAP_PX`` each way."""
    renderer = renderer or _renderer(fig)
    drawn = _drawn_ticklabels(fig)
    boxes = []
    for t in _texts(fig):
        if _is_ticklabel(t, fig) and id(t) not in drawn:
            continue
        bb = t.get_window_extent(renderer)
        if bb.width > 0 and bb.height > 0:
            boxes.append((t, bb))
    pairs = []
    for (a, ba), (b, bb) in itertools.combinations(boxes, 2):
        w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
        h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
        if w > OVERLAP_PX and h > OVERLAP_PX:
            pairs.append((a.get_text(), b.get_text()))
    return pairs


def _style(line: Line2D) -> tuple:
    return (tuple(np.round(to_rgba(line.get_color(), line.get_alpha()), 3)), str(line.get_linestyle()),
            str(line.get_marker()))


def _data(line: Line2D) -> tuple[np.ndarray, np.ndarray]:
    x, y = line.get_xdata(orig=False), line.get_ydata(orig=False)
    return np.asarray(x, dtype=float), np.asarray(y, dtype=float)


def identical_series(fig: Figure) -> list[str]:
    """Lines of one panel a reader cannot tell apart: the same look (colour, line style, marker) on two labelled
    series, or the same data in the same line style and marker (the one drawn later hides the other)."""
    out = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        lines = [ln for ln in ax.get_lines() if ln.get_visible() and len(ln.get_xdata()) > 1]
        for a, b in itertools.combinations(lines, 2):
            la, lb = a.get_label(), b.get_label()
            labelled = not la.startswith("_") and not lb.startswith("_")
            if labelled and _style(a) == _style(b):
                out.append(f"'{la}' and '{lb}' are drawn alike (colour, line style, marker)")
                continue
            (xa, ya), (xb, yb) = _data(a), _data(b)
            same = xa.shape == xb.shape and np.allclose(xa, xb, equal_nan=True) and \
                np.allclose(ya, yb, rtol=1e-9, atol=0, equal_nan=True)
            if same and (str(a.get_linestyle()), str(a.get_marker())) == (str(b.get_linestyle()), str(b.get_marker())):
                out.append(f"'{la}' and '{lb}' have the same data and line style: one hides the other")
    return out


def figure_problems(fig: Figure, dpi: int = 110) -> list[str]:
    """One line per readability rule ``fig`` breaks (the module's docstring lists them); [] when none."""
    stats = figure_stats(fig, dpi=dpi)
    problems = []
    w, h = stats["width_px"], stats["height_px"]
    if max(w, h) > MAX_SIDE_PX:
        problems.append(f"{w}x{h} px: more than {MAX_SIDE_PX} px a side")
    if max(w, h) > MAX_ASPECT * min(w, h):
        problems.append(f"{w}x{h} px: aspect over {MAX_ASPECT:g}:1")
    if stats["legend_entries"] > MAX_LEGEND_ENTRIES:
        problems.append(f"{stats['legend_entries']} legend entries (at most {MAX_LEGEND_ENTRIES})")
    if max(stats["bars_per_panel"], default=0) > MAX_BARS:
        problems.append(f"{max(stats['bars_per_panel'])} bars in one panel (at most {MAX_BARS})")
    renderer = _renderer(fig)
    problems += [f"labels overlap: {a!r} and {b!r}" for a, b in overlapping_labels(fig, renderer)]
    problems += identical_series(fig)
    return problems


def to_png(fig: Figure, dpi: int = 110) -> bytes:
    """The figure as PNG bytes (for HTML reports and notebook display)."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    return buf.getvalue()


def _is_histogram(bars: BarContainer) -> bool:
    """A histogram's bars (``ax.hist``) touch one another: a distribution, read as one shape, not bar by bar."""
    p = bars.patches
    if len(p) < 2:
        return False
    x0 = np.array([r.get_x() for r in p])
    x1 = x0 + np.array([r.get_width() for r in p])
    return bool(np.allclose(x1[:-1], x0[1:], rtol=1e-6, atol=1e-12 * max(1.0, float(np.abs(x1).max()))))


def figure_stats(fig: Figure, dpi: int = 110, png: bytes | None = None) -> dict:
    """What a reader faces in a figure: bars per panel (a stacked bar once, a histogram's bins not), legend entries, and
    its size in pixels at ``dpi`` (as :func:`to_png` renders it, or of ``png``, the figure already rendered at ``dpi``).
    Tests read these from executed notebooks."""
    import struct

    png = png if png is not None else to_png(fig, dpi)
    width, height = struct.unpack(">II", png[16:24])  # the PNG header's IHDR chunk
    bars = []
    for ax in fig.axes:
        if ax.get_visible():
            slots = set()  # a stacked bar's segments share their slot: one bar
            for c in ax.containers:
                if isinstance(c, BarContainer) and not _is_histogram(c):
                    horizontal = getattr(c, "orientation", "vertical") == "horizontal"
                    slots.update((horizontal, round(r.get_y() if horizontal else r.get_x(), 6),
                                  round(r.get_height() if horizontal else r.get_width(), 6)) for r in c.patches)
            bars.append(len(slots))
    legend = sum(len(leg.get_texts()) for leg in fig.legends)
    legend += sum(len(ax.get_legend().get_texts()) for ax in fig.axes if ax.get_legend() is not None)
    return {"bars_per_panel": bars, "legend_entries": legend, "width_px": int(width), "height_px": int(height),
            "dpi": dpi, "title": fig.get_suptitle()}
