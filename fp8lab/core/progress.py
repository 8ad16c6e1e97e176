"""Progress for work that may take over two seconds: reading many runs, summarising them,
drawing a report's figures, building dry-run requests. A bar (tqdm: a widget in a notebook, a line on
stderr in a terminal) that appears only once the work has taken :data:`DELAY_S`, so quick calls print
nothing; off where nobody watches (stderr not a terminal and no notebook kernel), so logs and piped
output stay clean. The trainer's per-step bar follows the same rule (:func:`watched`)."""
from __future__ import annotations

import sys
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")
DELAY_S = 2.0  # a bar shows once the work has taken this long


def watched() -> bool:
    """True where someone sees a bar: stderr is a terminal, or this runs in a notebook kernel."""
    return sys.stderr.isatty() or "ipykernel" in sys.modules


def progress(items: Iterable[T], desc: str, *, total: int | None = None, unit: str = "it") -> Iterator[T]:
    """``items``, with a bar named ``desc`` where :func:`watched` and once it takes over :data:`DELAY_S`."""
    if not watched():
        return iter(items)
    from tqdm.auto import tqdm

    return iter(tqdm(items, desc=desc, total=total, unit=unit, delay=DELAY_S, leave=False, dynamic_ncols=True))


class Counter:
    """A bar for work counted as it happens (figures drawn, requests built), without knowing the total;
    ``with Counter("drawing figures", "fig") as c: ... c.tick()``."""

    def __init__(self, desc: str, unit: str = "it", total: int | None = None):
        self.desc, self.unit, self.total, self.bar = desc, unit, total, None

    def __enter__(self) -> "Counter":
        if watched():
            from tqdm.auto import tqdm

            self.bar = tqdm(desc=self.desc, unit=self.unit, total=self.total, delay=DELAY_S, leave=False,
                            dynamic_ncols=True)
        return self

    def tick(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()
