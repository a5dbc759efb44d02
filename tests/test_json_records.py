"""Records' JSON written by the C++ extension: the text Python writes, byte for byte (numbers by their repr)."""

from __future__ import annotations

import numpy as np
import pytest

from model.json_records import json_extension, render_records
from schemas import CollaboratorRanking, Columns, Nested, RankedCandidate, TrustScore, to_json
from schemas.base import INT64_MAX, INT64_MIN
from schemas.columnar import python_render

needs_extension = pytest.mark.skipif(json_extension() is None, reason="the C++ extension did not build")

# each of repr's layouts and its edges: positional from 1e-4 up to 1e16 (exclusive), else an exponent of 2+ digits
EDGES = [0.0, -0.0, 1.0, -1.0, 100.0, 0.1, 0.1 + 0.2, 1e-4, 9.999999999999999e-05, 1e-05, 1.5e-07, 123.456,
         1e15, 9999999999999998.0, 1e16, 1.5e16, 1e22, 1e100, 1.7976931348623157e308, 5e-324, 2.2250738585072014e-308,
         -3.5e-05, 12345678.9, 0.5, 2.0 ** 53, 2.0 ** 53 + 2, 1 / 3, 2 / 3]
TEXTS = ["dev-1", "", "dév-0", "per%sent", "100%%", "emoji-\U0001F600", '"quoted"', "a b"]


def _floats(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "edges":
        return rng.permutation(np.resize(np.array(EDGES), n))
    if kind == "uniform":  # trust, T_beh, VoC: mostly in [0, 1], some tiny
        return np.where(rng.random(n) < 0.1, rng.random(n) * 1e-6, rng.random(n))
    bits = rng.integers(0, 2 ** 64 - 1, 2 * n, dtype=np.uint64, endpoint=True).view(np.float64)  # every exponent
    return bits[np.isfinite(bits)][:n]


@needs_extension
@pytest.mark.parametrize("kind", ["edges", "uniform", "bits"])
@pytest.mark.parametrize("n", [0, 1, 7, 20_000])
def test_the_extension_writes_what_python_writes(kind: str, n: int) -> None:
    rng = np.random.default_rng(n)
    ints = rng.choice(np.array([0, -1, 7, INT64_MIN, INT64_MAX, 10 ** 12], np.int64), n)
    texts = [TEXTS[k] for k in rng.integers(0, len(TEXTS), n)]
    pieces = ['{"schema_version":2,"a":', ',"id":"', '","b":', ',"c%":', ',"d":', ',"é":', "}\n"]
    columns = [_floats(kind, n, rng), texts, ints, _floats(kind, n, rng), texts, rng.random(n)]
    data, ends = render_records(pieces, columns, n)
    expected, expected_ends = python_render(pieces, columns, n)
    assert data == expected and np.array_equal(ends, expected_ends) and ends.dtype == np.int64
    if n:
        first = data[:ends[0]].decode()
        assert first == "".join(p + (v if isinstance(v, str) else repr(v)) for p, v in
                                zip(pieces, [c[0] if isinstance(c, list) else c[0].item() for c in columns] + [""]))


@needs_extension
def test_float32_strided_and_read_only_columns_are_written_as_their_values_and_fixed_records_alone() -> None:
    values = np.random.default_rng(3).random(1001)
    read_only = values.copy()
    read_only.flags.writeable = False
    pieces = ["[", ",", ",", "]"]
    columns = [values.astype(np.float32), values[::3][:334], read_only[:334]]
    columns = [c[:334] for c in columns]
    assert render_records(pieces, columns, 334)[0] == python_render(pieces, columns, 334)[0]
    assert render_records(["{}"], [], 3)[0] == b"{}{}{}" == python_render(["{}"], [], 3)[0]
    with pytest.raises(TypeError):
        render_records(["[", "]"], [["a", 5]], 2)  # a text column holds only str


@pytest.mark.parametrize("render", [python_render, render_records], ids=["python", "extension"])
def test_records_encode_as_to_json_does_by_either_renderer(render) -> None:
    rng = np.random.default_rng(7)
    n, items = 50, 120
    scores = Columns.of(TrustScore, n, owner=np.array([TEXTS[i % 8] or "x" for i in range(n)], object),
                        collaborator=np.array([f"c-{i}" for i in range(n)], object), slot=3, slot_start_ms=0,
                        slot_end_ms=60_000, t_beh=np.r_[rng.random(n - 3), [0.0, 1e-7, 1.0]], t_res=rng.random(n),
                        trust=rng.random(n).astype(np.float32), model_version="bm-%s", is_update=False,
                        revision=np.arange(n), task_size_bits=np.where(np.arange(n) % 4 == 0, None, 8e6).astype(object))
    lengths = np.bincount(rng.integers(0, n // 2, items), minlength=n)  # the last half of the rankings empty
    candidates = Columns.of(RankedCandidate, items, collaborator=np.array([f"c-{k}" for k in range(items)], object),
                            trust=np.ones(items), voc=np.concatenate([np.sort(rng.random(k))[::-1] for k in lengths]))
    rankings = Columns.of(CollaboratorRanking, n, owner=np.array([f"o-é{i}" for i in range(n)], object), slot=3,
                          slot_start_ms=0, slot_end_ms=60_000, threshold=rng.random(n) * 0.5, model_version="bm",
                          is_update=False, revision=0, candidates=Nested.of(candidates, lengths))
    for records in (scores, rankings):
        expected = [to_json(record) for record in records]
        assert records.json(render=render) == expected
        assert records.json_lines(render) == b"".join(line + b"\n" for line in expected)
        assert records.json(versioned=False, render=render) == records.json(versioned=False)
