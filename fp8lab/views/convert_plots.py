"""The figure of notebook 02: how far each decoder block's output of a converted model is from HF's and fp32's.

Series that are exactly zero (a CPU run in float32: the conversion is exact) are named in the title
instead of drawn on an arbitrary floor, and series equal to one already drawn share its line and label.
"""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure


def error_per_layer_figure(on, off, title: str, recipe_kind: str) -> Figure:
    """Relative difference of each block's output: FP8 on against HF, and with FP8 off the conversion against HF
    and both models against an fp32 forward; ``on``/``off`` are :func:`fp8lab.fp8.convert.check_equivalence` results
    (``per_layer=True, fp32_reference=True``)."""
    series = [(f"FP8 on ({recipe_kind}), vs HF", [d.rel_diff for d in on.per_layer], ("o", "-")),
              ("FP8 off, vs HF", [d.rel_diff for d in off.per_layer], ("s", "--")),
              ("HF vs fp32", [d.reference_rel_diff for d in off.fp32.per_layer], ("^", ":")),
              ("FP8 off, vs fp32", [d.converted_rel_diff for d in off.fp32.per_layer], ("v", "-."))]
    fig = Figure(figsize=(7.5, 3.8), layout="constrained")
    ax = fig.subplots()
    drawn: list[tuple[list[str], np.ndarray, tuple]] = []
    zero = []
    for label, values, style in series:
        v = np.asarray(values, dtype=float)
        if not np.any(v):
            zero.append(label)
            continue
        same = next((d for d in drawn if d[1].shape == v.shape and np.allclose(d[1], v, rtol=1e-6, atol=0)), None)
        if same is not None:
            same[0].append(label)
        else:
            drawn.append(([label], v, style))
    for labels, v, (marker, ls) in drawn:
        shown = np.where(v > 0, v, np.nan)  # a block at exactly 0 is a gap in its line (log axis)
        ax.plot(range(len(v)), shown, marker=marker, ls=ls, label=" = ".join(labels))
    ax.set_yscale("log")
    ax.set_xlabel("decoder block")
    ax.set_xticks(range(len(on.per_layer)))  # blocks are whole numbers
    ax.set_ylabel("relative difference\nof block output")
    note = f"\nexactly 0 in every block, not drawn: {'; '.join(zero)}" if zero else ""
    ax.set_title(title + note, fontsize=9)
    if drawn:
        ax.legend(fontsize=8)
    return fig
