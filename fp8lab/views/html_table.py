"""A table as the report's HTML: what ``DataFrame.to_html(index=False, na_rep="-", border=0)`` writes, each value
through :func:`fmt`, written here because pandas takes seconds for the thousands of rows of a large results folder."""
from __future__ import annotations

import pandas as pd


def fmt(v: object) -> str:
    """A table cell's text: floats to 4 significant digits (thousands grouped), NaN as '-'."""
    if isinstance(v, float):
        if v != v:  # NaN
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    return str(v)


_ESCAPE = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})  # what pandas' to_html escapes


def _cell(v: object) -> str:
    return "-" if v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float) and v != v) else fmt(v)


def table(df: pd.DataFrame, columns: list[str] | None = None) -> str:
    """``df``'s columns as the HTML ``DataFrame.to_html(index=False, na_rep="-", border=0)`` writes, each value
    through :func:`fmt`: written here, since pandas takes seconds for the thousands of rows of a large results
    folder."""
    if not len(df):
        return '<p class="muted">(none)</p>'
    d = df[[c for c in (columns or df.columns) if c in df]]
    head = "".join(f"      <th>{str(c).translate(_ESCAPE)}</th>\n" for c in d.columns)
    values = [d.iloc[:, i].tolist() for i in range(d.shape[1])]
    rows = zip(*values) if values else [()] * len(d)
    body = "".join("    <tr>\n" + "".join(f"      <td>{_cell(v).translate(_ESCAPE)}</td>\n" for v in row)
                   + "    </tr>\n"
                   for row in rows)
    return ('<div class="wide"><table class="dataframe">\n  <thead>\n    <tr style="text-align: right;">\n' + head
            + "    </tr>\n  </thead>\n  <tbody>\n" + body + "  </tbody>\n</table></div>")
