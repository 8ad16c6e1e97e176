"""Paragraphs a person reads, and the ones too long to read: Markdown (README, docs, notebook cells and the
Markdown a notebook displays) and the HTML report's text. A paragraph is a run of text lines between blank
lines, a list item's own text, or an HTML ``<p>`` / ``<li>``; headings, tables, code and images are not prose."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

MAX_PARAGRAPH = 600  # characters: the project's rule for prose
_ITEM = re.compile(r"^\s*([-*+]|\d+\.)\s")


def markdown_paragraphs(md: str) -> list[str]:
    out, cur, fence = [], [], False

    def flush():
        if cur:
            out.append(" ".join(s.strip() for s in cur))
            cur.clear()

    for line in md.splitlines():
        s = line.strip()
        if s.startswith("```"):
            flush()
            fence = not fence
            continue
        if fence or not s or s.startswith(("#", "|", "<!--", "![")) or line.startswith("    ") and not cur:
            flush()
            continue
        if _ITEM.match(line):
            flush()
        cur.append(s)
    flush()
    return out


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.blocks, self._cur, self._depth = [], [], 0

    def handle_starttag(self, tag, attrs):
        if tag in ("p", "li"):
            self._depth += 1
            self._cur = []

    def handle_endtag(self, tag):
        if tag in ("p", "li") and self._depth:
            self._depth -= 1
            self.blocks.append(" ".join("".join(self._cur).split()))

    def handle_data(self, data):
        if self._depth:
            self._cur.append(data)


def html_paragraphs(page: str) -> list[str]:
    parser = _Text()
    parser.feed(page)
    return parser.blocks


def notebook_markdown(path: str | Path) -> str:
    """A notebook's Markdown cells and the Markdown its cells displayed (an executed copy's outputs)."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    parts = []
    for c in nb["cells"]:
        if c["cell_type"] == "markdown":
            parts.append("".join(c["source"]))
        for o in c.get("outputs", []):
            if "text/markdown" in o.get("data", {}):
                parts.append("".join(o["data"]["text/markdown"]))
    return "\n\n".join(parts)


def too_long(paragraphs: list[str], where: str) -> list[str]:
    return [f"{where}: {len(p)} characters: {p[:90]}..." for p in paragraphs if len(p) > MAX_PARAGRAPH]


def assert_notebook_prose_short(path: str | Path) -> None:
    long = too_long(markdown_paragraphs(notebook_markdown(path)), Path(path).name)
    assert not long, "\n".join(long)
