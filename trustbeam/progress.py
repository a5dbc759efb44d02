"""What a long offline command shows while it works: elapsed time per phase, and a bar over its slots."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterable, Iterator, TypeVar

from tqdm import tqdm

from model.timing import timed

T = TypeVar("T")


class Phases:
    """Times the phases of a command: one stderr line as each ends (``trustbeam score: model 1.2 s``), and the
    figures (seconds) for the command's JSON summary."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        before = self.seconds.get(name, 0.0)
        with timed(self.seconds, name):
            yield
        print(f"trustbeam {self.command}: {name} {self.seconds[name] - before:.1f} s", file=sys.stderr, flush=True)


def bar(items: Iterable[T], total: int, unit: str, shown: bool | None = None) -> Iterable[T]:
    """A progress bar over ``items`` on stderr: shown on a terminal (or when ``shown``), silent in logs."""
    return tqdm(items, total=total, unit=unit, file=sys.stderr, leave=False,
                disable=not (sys.stderr.isatty() if shown is None else shown))
