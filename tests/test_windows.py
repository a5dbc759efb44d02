"""The sequence encoder's compact inputs (model.stages.Windows): batches equal the dense windows they stand for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.checkpoint import load
from model.stages import TorchStages, Windows
from tests.pipeline_fixtures import write_checkpoint

S, D = 6, 4


def compact(rng: np.random.Generator, n: int, filled: int) -> tuple[Windows, np.ndarray, np.ndarray]:
    """Windows over ``filled`` < S slots read from a table (row 0 idle, as the scorer builds them), and the dense
    (n, S, d) sequences and (n, S, 2) telemetry they stand for, padded by hand."""
    table = rng.standard_normal((1 + 3 * n, D)).astype(np.float32)
    rows = rng.integers(0, len(table), (n, filled))
    telemetry = rng.random((n, filled, 2)).astype(np.float32)
    pad = [filled - 1] * (S - filled)
    dense_sequences = table[rows][:, list(range(filled)) + pad]
    dense_telemetry = telemetry[:, list(range(filled)) + pad]
    return Windows(table, rows, np.full(n, filled, np.int64), telemetry, S), dense_sequences, dense_telemetry


@pytest.mark.parametrize("batch", [1, 4, 7, 100])
@pytest.mark.parametrize("filled", [1, 3, S])
def test_batches_equal_the_dense_windows_padded_by_their_last_slot(batch: int, filled: int) -> None:
    rng = np.random.default_rng(batch * 10 + filled)
    windows, sequences, telemetry = compact(rng, 10, filled)
    buffers = windows.buffers(batch)
    assert len(buffers[0]) == min(batch, 10)  # no more rows than devices
    for begin in range(0, 10, batch):  # the last batch is short where batch does not divide 10
        part = slice(begin, min(begin + batch, 10))
        got_sequences, got_lengths, got_telemetry = windows.batch(part, buffers)
        np.testing.assert_array_equal(got_sequences, sequences[part])
        np.testing.assert_array_equal(got_telemetry, telemetry[part])
        assert got_lengths.tolist() == [filled] * (part.stop - part.start)


def test_dense_windows_round_trip() -> None:
    rng = np.random.default_rng(0)
    sequences, telemetry = rng.standard_normal((5, S, D)), rng.random((5, S, 2))
    lengths = rng.integers(1, S + 1, 5)
    windows = Windows.dense(sequences, lengths, telemetry)
    got = windows.batch(slice(1, 4), windows.buffers(3))
    np.testing.assert_array_equal(got[0], sequences[1:4].astype(np.float32))
    np.testing.assert_array_equal(got[1], lengths[1:4])
    np.testing.assert_array_equal(got[2], telemetry[1:4].astype(np.float32))


def test_the_encoder_reads_compact_windows_as_their_dense_twins(tmp_path) -> None:
    model, index, _ = load(write_checkpoint(tmp_path / "model"))
    rng = np.random.default_rng(1)
    n, window, d = 37, model.config.window, model.config.gnn.out_dim
    table = rng.standard_normal((50, d)).astype(np.float32)
    rows = rng.integers(0, 50, (n, 2))
    telemetry = rng.random((n, 2, 2)).astype(np.float32)
    windows = Windows(table, rows, np.full(n, 2, np.int64), telemetry, window)
    sequences, lengths, reported = windows.batch(slice(0, n), windows.buffers(n))
    with torch.no_grad():  # one call on the whole dense input: no buffer reused
        want = model.encode(*(torch.from_numpy(a) for a in (sequences, lengths, reported))).numpy()
    got = TorchStages(model, index, devices_per_call=8).long_term(windows)  # several calls, a short last one
    np.testing.assert_allclose(got, want, atol=1e-6, rtol=0)
