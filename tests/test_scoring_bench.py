"""bench/scoring_bench.py: the encoder's FLOP count by hand, and the benchmark at toy size."""

from __future__ import annotations

import json
import sys

from bench.scoring_bench import encoder_flops, main
from model.bimamba import MambaConfig


def test_encoder_flops_by_hand() -> None:
    # d 2, d_inner 4, N 1, d_conv 1, rank 1, one layer, window 1: J = rank + 2N = 3
    # per direction: 2*4*(1 + 1 + 3) = 40 (conv, dt, x_proj) + 6*4*1 = 24 (scan) + 6*4 = 24 (D skip, gate) = 88
    # per layer: in_proj 2*2*4*4 = 64, two directions 176, folded out 2*2*4*2 = 32, residual 2*2 = 4: 276
    config = MambaConfig(d_model=2, d_state=1, expand=2, d_conv=1, dt_rank=1, n_layers=1)
    assert encoder_flops(config, window=1) == 276
    assert encoder_flops(config, window=3) == 3 * 276
    assert encoder_flops(MambaConfig(n_layers=2), 32) == 2 * encoder_flops(MambaConfig(n_layers=1), 32)


def test_the_benchmark_prints_every_case_at_toy_size(monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["scoring_bench", "--devices", "20", "--slots", "3"])
    main()
    report = json.loads(capsys.readouterr().out.split("\n\n")[0])
    cases = {row["case"]: row for row in report["rows"]}
    assert [c for c in cases if c.startswith("scoring")] == ["scoring, encoder", "scoring, head"]
    assert all(row["device_slots"] == 60 and row["per_core"] > 0 for c, row in cases.items() if c.startswith("scoring"))
    assert cases["scoring, head"]["frame_s"] < cases["scoring, encoder"]["frame_s"]  # no encoder runs
    assert report["encoder_mflop_per_device"] > 1 and report["gemm_gflop_per_s"] > 0
