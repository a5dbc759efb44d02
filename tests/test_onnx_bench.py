"""bench/onnx_bench.py at toy size: both runtimes run all three stages (a head that reads Y needs them all)."""

from __future__ import annotations

from bench.onnx_bench import latency_rows


def test_both_runtimes_score_every_stage(tmp_path) -> None:
    rows = latency_rows(40, tmp_path, repeats=1)
    assert [r["backend"] for r in rows] == ["torch", "onnxruntime"]
    for row in rows:
        assert row["devices"] == 40 and row["devices_per_s"] > 0
        assert min(row["gnn_s"], row["sequence_s"], row["head_s"]) >= 0
