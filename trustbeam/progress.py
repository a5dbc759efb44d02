"""What a long offline command shows while it works: elapsed time per phase, and a bar over its slots."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Iterable, Iterator, TypeVar

from tqdm import tqdm

T = TypeVar("T")


class Phases:
    """Times the phases of a command: one stderr line as each ends (``trustbeam score: model 1.2 s``), and the
    figures (seconds, rounded to 0.01) for the command's JSON summary."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        elapsed = time.perf_counter() - started
        self.seconds[name] = round(self.seconds.get(name, 0.0) + elapsed, 2)
        print(f"trustbeam {self.command}: {name} {elapsed:.1f} s", file=sys.stderr, flush=True)


def bar(items: Iterable[T], total: int, unit: str, shown: bool | None = None) -> Iterable[T]:
    """A progress bar over ``items`` on stderr: shown on a terminal (or when ``shown``), silent in logs."""
    return tqdm(items, total=total, unit=unit, file=sys.stderr, leave=False,
                disable=not (sys.stderr.isatty() if shown is None else shown))
