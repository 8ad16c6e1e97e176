"""Paragraphs a person reads, and the ones too long to read: Markdown (README, docs, notebook cells and the
Markdown a notebook displays) and the HTML report's text.

The rule is what a reader sees on the rendered page, so Markdown is parsed by a CommonMark parser
(markdown-it-py, with GitHub's tables), not by lines:

- a paragraph is a block of text between blank lines, its wrapped lines joined (a Markdown source may hold it
  on one long line or on many short ones: the same paragraph);
- a list item is one paragraph however it is written: its first line, its continuation lines and the
  paragraphs indented under it after a blank line (a bullet of 900 characters in three paragraphs is still one
  900-character bullet); a nested list's items are paragraphs of their own, not part of their parent;
- the length is the visible text: a link counts by its text, never its URL; inline code by its content;
  images, HTML comments and inline tags count nothing;
- not prose, so not counted: headings, code (fenced or indented), images, and tables: a table cell is read
  as a cell, so tables are left out entirely (a long cell is not reported).

A reader of the source sees another unit, and the rule holds for it too (:func:`line_blocks`): a block of
consecutive non-blank lines is one paragraph to someone reading the file, so a tight list (no blank line between
its items) is one block, however short each item. Code, tables, headings and HTML comments (the generated blocks'
markers) separate blocks and count nothing; the length is the visible text, as above. A long list is written
loose (a blank line between items), so each item is a block of its own.

HTML (the report) follows the same rule: each ``<p>``, ``<li>``, heading, ``<summary>`` or ``<figcaption>``
and the loose text of a ``<div>``, ``<details>`` or the body is a paragraph; a ``<li>`` takes in the ``<p>``s
inside it; a nested list's items are their own; tables (``<table>``), scripts and styles are left out."""
from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

from markdown_it import MarkdownIt

MAX_PARAGRAPH = 600  # characters: the project's rule for prose
_MD = MarkdownIt("commonmark").enable("table")


def _visible(inline) -> str:
    """An inline token's text as rendered: link text without its URL, code without backticks, no images or tags."""
    parts = []
    for c in inline.children or []:
        if c.type in ("text", "code_inline"):
            parts.append(c.content)
        elif c.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return " ".join("".join(parts).split())


def markdown_paragraphs(md: str) -> list[str]:
    """The paragraphs of a Markdown text, by the module's rule: each paragraph outside a list, each list item
    whole (its nested lists' items apart), in reading order of their ends."""
    out: list[str] = []
    items: list[list[str]] = []  # the text of each list item still open, innermost last
    tokens = _MD.parse(md)
    in_table = 0
    for i, t in enumerate(tokens):
        if t.type == "table_open":
            in_table += 1
        elif t.type == "table_close":
            in_table -= 1
        elif t.type == "list_item_open":
            items.append([])
        elif t.type == "list_item_close":
            text = " ".join(items.pop())
            if text:
                out.append(text)
        elif t.type == "inline" and not in_table and tokens[i - 1].type == "paragraph_open":
            text = _visible(t)
            if not text:
                continue
            if items:
                items[-1].append(text)
            else:
                out.append(text)
        elif t.type == "html_block" and not in_table:
            out += html_paragraphs(t.content)
    return out


_NOT_PROSE = {"fence", "code_block", "table_open", "heading_open", "hr"}  # tokens whose lines hold no prose


def _is_comment(html: str) -> bool:
    text = html.strip()
    return text.startswith("<!--") and text.endswith("-->")


def line_blocks(md: str) -> list[str]:
    """The visible text of each block of consecutive non-blank lines of prose in a Markdown text, as a reader of
    the source sees paragraphs: a tight list is one block. Lines of code, tables, headings, rules and HTML comments
    are not prose and end a block; the text is what the CommonMark parse renders (link text, not URLs)."""
    tokens = _MD.parse(md)
    not_prose: set[int] = set()
    for t in tokens:
        if t.map and (t.type in _NOT_PROSE or (t.type == "html_block" and _is_comment(t.content))):
            not_prose.update(range(*t.map))
    block_of: dict[int, int] = {}  # line -> its block's number
    n, previous = -1, False
    for i, line in enumerate(md.splitlines()):
        prose = bool(line.strip()) and i not in not_prose
        if prose and not previous:
            n += 1
        if prose:
            block_of[i] = n
        previous = prose
    texts: list[list[str]] = [[] for _ in range(n + 1)]
    for i, t in enumerate(tokens):
        if not t.map or t.map[0] not in block_of:
            continue
        if t.type == "inline" and tokens[i - 1].type == "paragraph_open":
            texts[block_of[t.map[0]]].append(_visible(t))
        elif t.type == "html_block":
            texts[block_of[t.map[0]]] += html_paragraphs(t.content)
    return [" ".join(w for w in words if w) for words in texts if any(words)]


_BLOCKS = {"p", "li", "dd", "dt", "blockquote", "figcaption", "summary", "div", "details", "body", "section",
           "h1", "h2", "h3", "h4", "h5", "h6"}
_SKIP = {"table", "script", "style"}


class _Text(HTMLParser):
    def __init__(self):
        super().__init__()
        self.blocks: list[str] = []
        self._open: list[tuple[str, list[str]]] = []  # block elements open, each with its own text
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        if tag in _SKIP:
            self._skip += 1
        elif tag in _BLOCKS and not (tag == "p" and self._open and self._open[-1][0] == "li"):
            self._open.append((tag, []))  # a <p> inside a <li> is part of the item

    def handle_endtag(self, tag):
        if tag in _SKIP:
            self._skip = max(0, self._skip - 1)
        elif tag in _BLOCKS and any(t == tag for t, _ in self._open):
            while self._open:  # close up to the matching element (HTML lets some end tags be left out)
                t, text = self._open.pop()
                words = " ".join("".join(text).split())
                if words:
                    self.blocks.append(words)
                if t == tag:
                    break

    def handle_data(self, data):
        if not self._skip and self._open:
            self._open[-1][1].append(data)

    def close(self):
        super().close()
        while self._open:
            self.handle_endtag(self._open[0][0])


def html_paragraphs(page: str) -> list[str]:
    parser = _Text()
    parser.feed(page)
    parser.close()
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


def markdown_too_long(md: str, where: str) -> list[str]:
    """Every paragraph of ``md`` over the limit, by either reading: the rendered page's paragraphs and list items
    (:func:`markdown_paragraphs`) and the source's blocks of consecutive lines (:func:`line_blocks`)."""
    return (too_long(markdown_paragraphs(md), f"{where} (paragraph)")
            + too_long(line_blocks(md), f"{where} (block of lines)"))


def assert_notebook_prose_short(path: str | Path) -> None:
    long = markdown_too_long(notebook_markdown(path), Path(path).name)
    assert not long, "\n".join(long)
