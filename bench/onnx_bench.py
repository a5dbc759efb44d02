"""Scoring latency, PyTorch against onnxruntime, side by side in one process.

For n devices in {1k, 10k, 100k} and S = 64 (BM's default widths otherwise), per backend:

* ``gnn``: one slot graph with every device active and 4n edges -> slot embeddings
* ``sequence``: the BiMamba encoder over (n, S, 32) full-length histories -> Y
* ``head``: T_beh for 10 candidates per device (10n pairs)
* ``total``: the three, i.e. one slot scored for every device

Median of ``--repeats`` (1 at 100k) wall times; both backends get the same inputs and threads
(torch.get_num_threads()). The model is untrained (seeded): latency does not depend on the
weights. Run: ``python -m bench.onnx_bench [--devices 1000 10000 100000]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from bench.fault_harness import read_y
from bench.report import emit
from exporters.onnx import OnnxStages, export_onnx
from exporters.onnx.runtime import providers
from model.bm import BM, BMConfig
from model.checkpoint import save
from model.graphs import DeviceIndex, SlotGraph
from model.stages import TorchStages, Windows

WINDOW, CANDIDATES = 64, 10


def _timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def latency_rows(devices: int, work: Path, repeats: int) -> list[dict]:
    """One row per backend for ``devices`` devices (module docstring)."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    config = replace(BMConfig(), window=WINDOW)
    model = BM(config, rng.normal(size=(devices, config.node2vec.dim)).astype(np.float32))
    read_y(model)  # else the exported model needs neither the GNN nor the encoder, and skips them
    checkpoint = work / f"model-{devices}"
    save(model, DeviceIndex(tuple(f"d{k:07d}" for k in range(devices))), checkpoint)
    started = time.perf_counter()
    manifest = export_onnx(checkpoint)
    export_s = time.perf_counter() - started
    backends = {"torch": TorchStages(model, DeviceIndex(tuple(f"d{k:07d}" for k in range(devices)))),
                "onnxruntime": OnnxStages(checkpoint / "onnx", expect_content_hash=manifest["source_content_hash"])}
    edges = 4 * devices
    graph = SlotGraph(0, rng.integers(0, devices, edges), rng.integers(0, devices, edges), rng.random(edges),
                      rng.random(edges))
    rows = np.arange(devices)  # every device's own node2vec row
    sequences = rng.normal(size=(devices, WINDOW, config.gnn.out_dim)).astype(np.float32)
    lengths = np.full(devices, WINDOW, dtype=np.int64)
    telemetry = np.stack([rng.random((devices, WINDOW)), np.ones((devices, WINDOW))], -1).astype(np.float32)
    owners = np.repeat(np.arange(devices), CANDIDATES)
    others = rng.integers(0, devices, devices * CANDIDATES)
    pairs = len(owners)
    physics = np.stack([rng.uniform(1, 300, pairs), rng.uniform(2e9, 6e9, pairs), rng.uniform(2e9, 6e9, pairs),
                        rng.uniform(0.2, 2.5, pairs), 2 ** rng.uniform(17, 23, pairs)], axis=1).astype(np.float32)
    evidence = rng.random((pairs, config.evidence.features)).astype(np.float32)
    results = []
    for name, stages in backends.items():
        stages.slot_embeddings(graph, rows)  # warm-up (and the C++ scan's first load)
        stages.long_term(Windows.dense(sequences[:64], lengths[:64], telemetry[:64]))
        out = {}
        windows = Windows.dense(sequences, lengths, telemetry)

        def sequence() -> None:
            out["y"] = stages.long_term(windows)

        figures = {"gnn_s": _timed(lambda: stages.slot_embeddings(graph, rows), repeats),
                   "sequence_s": _timed(sequence, repeats),
                   "head_s": _timed(lambda: stages.t_beh(out["y"][owners], out["y"][others], physics, evidence),
                                    repeats)}
        total = sum(figures.values())
        results.append({"devices": devices, "backend": name, **{k: round(v, 3) for k, v in figures.items()},
                        "total_s": round(total, 3), "devices_per_s": int(devices / total),
                        "onnx_export_s": round(export_s, 1) if name == "onnxruntime" else ""})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--devices", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for devices in args.devices:
            rows += latency_rows(devices, Path(work), 1 if devices >= 100_000 else args.repeats)
    import onnxruntime

    emit("onnx_bench", rows, {"window": WINDOW, "candidates_per_device": CANDIDATES,
                              "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "torch": torch.__version__,
                              "onnxruntime": onnxruntime.__version__, "providers": providers(),
                              "machine": platform.machine()})


if __name__ == "__main__":
    main()
