"""Wall time by stage: the one timer of the scorer's stages and the commands' phases."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def timed(seconds: dict[str, float], stage: str) -> Iterator[None]:
    """Add the block's wall time to ``seconds[stage]``."""
    started = time.perf_counter()
    try:
        yield
    finally:
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - started
