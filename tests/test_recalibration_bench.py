"""bench/recalibration_bench.py: which edges the job publishes a forecast for, by hand; the benchmark at toy size."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np

from bench.fault_harness import untrained_checkpoint
from bench.recalibration_bench import main, scored_owners
from simulator.config import SimConfig
from simulator.engine import Simulator
from simulator.parquet_sink import ParquetSink


def test_an_edge_is_published_when_its_owner_had_a_task_in_the_slots_before() -> None:
    graphs = [SimpleNamespace(src=np.array([0, 1])), None, SimpleNamespace(src=np.array([2, 0, 3])),
              SimpleNamespace(src=np.array([3, 1, 2]))]
    history = SimpleNamespace(graphs=graphs)
    # slot 2: owner 0 had a task in slot 0 (two slots back), not in slot 1 (empty); slot 3: owners 2 and 3 in slot 2
    assert scored_owners(history, [2, 3], owner_slots=1).tolist() == [False, False, False, True, False, True]
    assert scored_owners(history, [2, 3], owner_slots=2).tolist() == [False, True, False, True, False, True]


def test_the_benchmark_prints_every_method_at_toy_size(tmp_path, monkeypatch, capsys) -> None:
    sim = SimConfig(devices=12, slots=10, tasks=300)
    Simulator(sim).run([ParquetSink(tmp_path / "log")])
    checkpoint = untrained_checkpoint(tmp_path / "model", sim)
    monkeypatch.setattr(sys, "argv", ["recalibration_bench", "--events", str(tmp_path / "log" / "events.parquet"),
                                      "--checkpoint", str(checkpoint), "--test-fraction", "0.5", "--guard", "0"])
    main()
    report = json.loads(capsys.readouterr().out.split("\n\n")[0])
    rows = {row["method"]: row for row in report["rows"]}
    assert list(rows) == ["mean", "channel_beta", "bm", "bm_online", "bm_job"]
    assert 0 < report["published_edges"] < report["test_edges"]
    assert all(0 <= row[f"{m}_{e}"] <= 1 for row in rows.values() for m in ("rmse", "mae", "ece")
               for e in ("all", "published"))
    # with no guard every residual shifts, and the job's refit on fewer edges shifts otherwise
    assert len({rows[m]["rmse_all"] for m in ("bm", "bm_online", "bm_job")}) == 3
