"""Long text out of a notebook cell: the whole text into a file of the notebook's working folder, its first lines
in the cell, and where the rest is. A cell a person reads in seconds prints at most ``MAX_CELL_LINES`` lines."""
from __future__ import annotations

from pathlib import Path

MAX_CELL_LINES = 25


class TextFile:
    """A callable that takes lines (e.g. ``launch(..., out=TextFile("requests.txt"))``) and writes them to ``path``,
    (re)started empty; ``echo``: also print the lines that start with one of these prefixes."""

    def __init__(self, path: str | Path, echo: tuple[str, ...] = ()) -> None:
        self.path, self.echo, self.lines = Path(path), echo, 0
        self.path.write_text("")

    def __call__(self, text: str) -> None:
        with self.path.open("a") as f:
            f.write(text + "\n")
        self.lines += text.count("\n") + 1
        for line in text.splitlines():
            if self.echo and line.startswith(self.echo):
                print(line)


def show_head(text: str, path: str | Path, lines: int = 15) -> None:
    """Write ``text`` to ``path`` and print its first ``lines`` lines, then how many more are in the file."""
    path = Path(path)
    path.write_text(text.rstrip("\n") + "\n")
    all_lines = text.rstrip("\n").splitlines()
    print("\n".join(all_lines[:lines]))
    if len(all_lines) > lines:
        print(f"... {len(all_lines) - lines} more lines in {path.name}")
