"""bench/gpu_bench.py at toy size: every backend gets a row, measured or saying why not, and the measured agree."""

from __future__ import annotations

from bench.gpu_bench import BACKENDS, encoder_rows


def test_every_backend_gets_a_row_and_the_measured_ones_agree(tmp_path) -> None:
    rows = encoder_rows([8], [64], cpu_devices=64, repeats=1, work=tmp_path)
    assert [r["backend"] for r in rows] == list(BACKENDS)
    measured = [r for r in rows if "skipped" not in r]
    assert {"torch cpu", "onnxruntime cpu"} <= {r["backend"] for r in measured}
    for row in measured:
        assert row["devices"] == 64 and row["devices_per_s"] > 0 and row["max_abs_diff"] < 1e-4
    assert all(r["skipped"] for r in rows if "skipped" in r)  # a reason, never a silent gap
