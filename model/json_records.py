"""Records' JSON written by the C++ extension (``csrc/json_records.cpp``): what the scorer and the job pass
:meth:`schemas.Columns.json` and :meth:`~schemas.Columns.json_lines` as their ``render``. The same bytes as
:func:`schemas.columnar.python_render`, where Python's repr of the floats and its formatting of each record took most of
the time."""

from __future__ import annotations

import numpy as np

from model.scan import cpu_extension
from schemas.columnar import TextColumn, python_render


def render_records(pieces: list[str], columns: list[TextColumn], count: int) -> tuple[bytes, np.ndarray]:
    """:func:`schemas.columnar.python_render`'s contract and result: by the extension where it built, else by it."""
    extension = cpu_extension()
    if extension is None:
        return python_render(pieces, columns, count)
    arrays = [column if isinstance(column, list) else
              np.require(column, np.float64 if column.dtype.kind == "f" else np.int64, ["C"]) for column in columns]
    return extension.render_records(pieces, arrays, count)
