"""Records' JSON written by a C++ extension of its own (``csrc/json_records.cpp``): what the scorer and the job pass
:meth:`schemas.Columns.json` and :meth:`~schemas.Columns.json_lines` as their ``render``. The same bytes as
:func:`schemas.columnar.python_render`, where Python's repr of the floats and its formatting of each record took most of
the time."""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from model.scan import load_extension
from schemas.columnar import TextColumn, python_render

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).parent / "csrc" / "json_records.cpp"


@lru_cache(maxsize=1)
def json_extension() -> Any | None:
    """The compiled renderer (built once per machine into torch's extension cache, like :func:`model.scan.cpu_extension`
    but with no torch header and no ``-march``: seconds to build, the same code on every CPU), or None."""
    try:
        return load_extension("trustbeam_json_records", [_SOURCE], ["-O3"])
    except Exception as error:  # compiler missing or failing: Python's renderer, the same bytes, slower
        log.warning("the records' JSON extension is unavailable, rendering in Python: %s", error)
        return None


def render_records(pieces: list[str], columns: list[TextColumn], count: int) -> tuple[bytes, np.ndarray]:
    """:func:`schemas.columnar.python_render`'s contract and result: by the extension where it built, else by it."""
    extension = json_extension()
    if extension is None:
        return python_render(pieces, columns, count)
    arrays = [column if isinstance(column, list) else
              np.require(column, np.float64 if column.dtype.kind == "f" else np.int64, ["C"]) for column in columns]
    return extension.render_records(pieces, arrays, count)
