"""Floats written as the records' JSON writes them (Python's repr, as ``json.dumps``), by the C++ extension: what
the scorer and the job pass :meth:`schemas.Columns.json` as its ``floats``, where repr took most of the time (~0.85 us
a value; ~0.2 us here, so a 1M-device slot's records are written in a fraction of the time)."""

from __future__ import annotations

import numpy as np
import torch

from model.scan import cpu_extension
from schemas.columnar import python_float_texts


def float_texts(values: np.ndarray) -> list[str]:
    """Each value's repr ((n,) finite floats): the extension's (``csrc/float_repr.cpp``) where it built, else
    Python's, the same text."""
    extension = cpu_extension()
    if extension is None:
        return python_float_texts(values)
    return extension.float_reprs(torch.from_numpy(np.require(values, np.float64, ["C", "W"])))
