"""The records' floats written by the C++ extension: Python's repr of every value, so the same JSON bytes."""

from __future__ import annotations

import numpy as np
import pytest

from model.json_floats import float_texts
from model.scan import cpu_extension
from schemas import CollaboratorRanking, Columns, Nested, RankedCandidate, TrustScore, to_json
from schemas.columnar import python_float_texts

# each of repr's layouts and its edges: positional from 1e-4 up to 1e16 (exclusive), else an exponent of 2+ digits
EDGES = [0.0, -0.0, 1.0, -1.0, 100.0, 0.1, 0.1 + 0.2, 1e-4, 9.999999999999999e-05, 1e-05, 1.5e-07, 123.456,
         1e15, 9999999999999998.0, 1e16, 1.5e16, 1e22, 1e100, 1.7976931348623157e308, 5e-324, 2.2250738585072014e-308,
         -3.5e-05, 12345678.9, 0.5, 2.0 ** 53, 2.0 ** 53 + 2, 1 / 3, 2 / 3]


def _values(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "edges":
        return np.array(EDGES)
    if kind == "uniform":  # trust, T_beh, VoC: mostly in [0, 1], some tiny
        return np.r_[rng.random(n), rng.random(n // 10) * 1e-6]
    bits = rng.integers(0, 2 ** 64 - 1, n, dtype=np.uint64, endpoint=True).view(np.float64)  # every exponent
    return bits[np.isfinite(bits)]


@pytest.mark.skipif(cpu_extension() is None, reason="the C++ extension did not build")
@pytest.mark.parametrize("kind, n", [("edges", 0), ("uniform", 1), ("uniform", 1000), ("uniform", 200_000),
                                     ("bits", 1000), ("bits", 200_000)])
def test_the_extension_writes_each_float_as_pythons_repr(kind: str, n: int) -> None:
    values = _values(kind, n, seed=n)
    texts = float_texts(values)
    assert texts == [repr(v) for v in values.tolist()]
    assert all(type(text) is str and float(text) == v for text, v in zip(texts[:1000], values[:1000].tolist()))


@pytest.mark.skipif(cpu_extension() is None, reason="the C++ extension did not build")
def test_float32_strided_and_read_only_columns_are_written_as_their_values_are() -> None:
    values = np.random.default_rng(3).random(1001)
    float32 = values.astype(np.float32)
    assert float_texts(float32) == list(map(repr, float32.tolist()))  # the float32 value, as a Python float
    assert float_texts(values[::3]) == list(map(repr, values[::3].tolist()))
    read_only = values.copy()
    read_only.flags.writeable = False
    assert float_texts(read_only) == list(map(repr, values.tolist()))
    assert float_texts(np.zeros(0)) == []


def test_records_encode_the_same_bytes_with_either_writer_of_floats() -> None:
    rng = np.random.default_rng(7)
    n, items = 50, 120
    scores = Columns.of(TrustScore, n, owner=np.array([f"o-{i % 7}" for i in range(n)], object),
                        collaborator=np.array([f"c-{i}" for i in range(n)], object), slot=3, slot_start_ms=0,
                        slot_end_ms=60_000, t_beh=np.r_[rng.random(n - 3), [0.0, 1e-7, 1.0]], t_res=rng.random(n),
                        trust=rng.random(n).astype(np.float32), model_version="bm", is_update=False, revision=0,
                        task_size_bits=np.where(np.arange(n) % 4 == 0, None, 8e6).astype(object))
    lengths = np.bincount(rng.integers(0, n, items), minlength=n)
    candidates = Columns.of(RankedCandidate, items, collaborator=np.array([f"c-{k}" for k in range(items)], object),
                            trust=np.ones(items), voc=np.concatenate([np.sort(rng.random(k))[::-1] for k in lengths]))
    rankings = Columns.of(CollaboratorRanking, n, owner=np.array([f"o-{i}" for i in range(n)], object), slot=3,
                          slot_start_ms=0, slot_end_ms=60_000, threshold=rng.random(n) * 0.5, model_version="bm",
                          is_update=False, revision=0, candidates=Nested.of(candidates, lengths))
    for records in (scores, rankings):
        expected = [to_json(record) for record in records]
        assert records.json() == expected
        assert records.json(floats=float_texts) == expected
        assert records.json_lines(float_texts) == records.json_lines(python_float_texts)
