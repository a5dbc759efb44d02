"""bench/scoring_bench.py: the encoder's FLOP count by hand, and the benchmark at toy size."""

from __future__ import annotations

import json
import os
import sys

import torch

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
    cpus, threads = os.sched_getaffinity(0), torch.get_num_threads()
    main()
    assert os.sched_getaffinity(0) == cpus and torch.get_num_threads() == threads  # the one-core runs gave them back
    report = json.loads(capsys.readouterr().out.split("\n\n")[0])
    cases = {row["case"]: row for row in report["rows"]}
    threads = report["threads"]
    scoring = [f"scoring, {kind}, {where}" for kind in ("encoder", "head")
               for where in (f"{threads} threads", "one core")]
    workers = len(os.sched_getaffinity(0))
    together_case = f"scoring, head, {workers} one-core workers at once"
    assert [c for c in cases if c.startswith("scoring")] == [*scoring, together_case]
    assert all(row["device_slots"] == 60 and row["per_core"] > 0 for c in scoring for row in [cases[c]])
    together = cases[together_case]
    assert together["device_slots"] == 60 * workers  # every worker scored the whole log
    assert abs(together["per_core"] - together["device_slots_per_s"] / workers) <= 1  # the rate shared by the cores
    one = cases["scoring, head, one core"]
    assert one["per_core"] == one["device_slots_per_s"]  # pinned: the process's rate is the core's
    assert not one["uses_encoder"] and cases["scoring, encoder, one core"]["uses_encoder"]  # the head's runs none
    floors = [row for c, row in cases.items() if c.startswith("floor")]
    assert len(floors) == 2 and all(row["gemm_gflop_per_s"] > 0 for row in floors)
    assert report["encoder_mflop_per_device"] > 1
