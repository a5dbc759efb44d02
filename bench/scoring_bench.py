"""The cost of scoring per device-slot on the paper's setting, per core, beside the encoder's FLOP floor.

Scoring is paid per device per slot, whatever the events: every slot, each device's frame (its window through
the sequence encoder, its evidence and statuses), then each recent owner's candidates through the pair head and
the ranking. Side by side in one process, on the paper's setting (500 devices, 10,000 tasks, 100 slots of the
simulator) with BM's default widths (S = 32):

* ``encoder alone``: the BiMamba encoder (``Stages.long_term``) on full windows of S slots, the steady state of
  a long run (the first S slots of a log have shorter windows, whose padding the fused CPU pass skips);
* ``scoring, encoder``: :func:`model.scoring.score_log` over every slot with a model whose head reads Y (slot
  GNN, BiMamba, evidence, head, ranking and the wire records);
* ``scoring, head``: the same with the model training keeps on this setting (epoch -1: the head reads no Y, so
  no slot GNN and no encoder run);
* ``scoring, head, N one-core workers at once``: a single-threaded process pinned to each of the N cores, all
  scoring the log at the same time (per core: the rate of all of them divided by N), as a deployment with one
  worker per core runs while every core works.

Each case runs twice: on every core the process has (torch's default threads; per core = the rate divided by
them), and on one core (the process pinned to one CPU, one torch thread): what a deployment that runs one
single-threaded worker per core gets from each (Beam's portable workers and Flink's task slots scale so). The
small per-slot operations of scoring gain little from a second thread, so the two per-core figures differ.
The floor: the encoder's multiply-adds per device (in_proj, conv, x and dt projections, the scan's state update
with its exp counted as one operation, gating, the folded out_proj + mix), at the rate this machine's float32
GEMM reaches (measured in the same run, on all cores and on one), as seconds per device: no implementation on
these cores goes faster.

Run: ``python -m bench.scoring_bench [--slots 100] [--devices 500]``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow.parquet as pq
import torch

from bench.fault_harness import untrained_checkpoint
from bench.report import emit
from model.bimamba import MambaConfig
from model.checkpoint import load
from model.config import RankingConfig
from model.scoring import score_log
from model.stages import TorchStages, Windows
from simulator.config import SimConfig
from simulator.engine import Simulator
from simulator.parquet_sink import ParquetSink

ENCODER_DEVICES = 4096  # devices of the encoder-alone case


def encoder_flops(config: MambaConfig, window: int) -> int:
    """Floating-point operations of the BiMamba encoder per device at full windows (a multiply-add is 2; a
    scan state update exp(delta A) h + delta B x, then C h, is 6 with its exp counted as one)."""
    d, di, n, k, r = config.d_model, config.d_inner, config.d_state, config.d_conv, config.rank
    per_direction = 2 * di * (k + r + (r + 2 * n)) + 6 * di * n + 6 * di  # conv, dt, x_proj; scan; D skip + gate
    per_layer = 2 * d * 4 * di + 2 * per_direction + 2 * 2 * di * d + 2 * d  # in_proj both; two inner; folded out
    return int(window * config.n_layers * per_layer)


def gemm_flops_per_s(size: int = 1024, repeats: int = 5) -> float:
    """This machine's float32 GEMM rate on the cores torch uses (best of ``repeats``)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    best = min(_seconds(lambda: a @ b) for _ in range(repeats))
    return 2 * size**3 / best


@contextmanager
def on_cores(one: bool) -> Iterator[int]:
    """Run the block on every core the process has (``one`` False) or pinned to one CPU with one torch thread;
    yields the cores the block's per-core figures divide by."""
    if not one:
        yield torch.get_num_threads()
        return
    cpus, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {min(cpus)})
    torch.set_num_threads(1)
    try:
        yield 1
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, cpus)


def _seconds(work) -> float:
    started = time.perf_counter()
    work()
    return time.perf_counter() - started


def encoder_alone(stages: TorchStages, devices: int) -> float:
    """Seconds of the sequence encoder over ``devices`` full windows (best of 3)."""
    rng = np.random.default_rng(0)
    window, width = stages.config.window, stages.config.gnn.out_dim
    sequences = rng.normal(size=(devices, window, width)).astype(np.float32)
    lengths = np.full(devices, window, np.int64)
    telemetry = rng.random((devices, window, 2)).astype(np.float32)
    stages.long_term(Windows.dense(sequences[:256], lengths[:256], telemetry[:256]))
    windows = Windows.dense(sequences, lengths, telemetry)
    return min(_seconds(lambda: stages.long_term(windows)) for _ in range(3))


def scoring(stages: TorchStages, events, status, version: str) -> tuple[float, dict[str, float], int]:
    """(seconds, seconds per stage, slots) of scoring every slot of the log offline."""
    seconds: dict[str, float] = {}
    started = time.perf_counter()
    slots = sum(1 for _ in score_log(stages, events, status, RankingConfig(), stages.config.system, version, seconds))
    return time.perf_counter() - started, seconds, slots


def pinned_worker(checkpoint: str, log: str, cpu: int, start: Any, results: Any) -> None:
    """A single-threaded process on core ``cpu``: load the model and log, wait for every worker, score the log; put
    (cpu, seconds, slots) on ``results``."""
    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    model, index, _ = load(Path(checkpoint))
    stages = TorchStages(model, index)
    events, status = pq.read_table(Path(log) / "events.parquet"), pq.read_table(Path(log) / "status.parquet")
    start.wait()
    seconds, _, slots = scoring(stages, events, status, "every core")
    results.put((cpu, seconds, slots))


def every_core_at_once(checkpoint: Path, log: Path) -> tuple[float, int, int]:
    """(seconds until the last worker is done, slots scored by all of them, workers) of one
    :func:`pinned_worker` per core the process has, all scoring at once: what a deployment with a single-threaded
    worker per core gets per core while every core works (they share caches and memory bandwidth)."""
    context = multiprocessing.get_context("spawn")  # no fork of a process whose torch threads already run
    cpus = sorted(os.sched_getaffinity(0))
    start, results = context.Barrier(len(cpus) + 1), context.Queue()
    workers = [context.Process(target=pinned_worker, args=(str(checkpoint), str(log), cpu, start, results))
               for cpu in cpus]
    for worker in workers:
        worker.start()
    start.wait()
    done = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
        if worker.exitcode:
            raise RuntimeError(f"a pinned scoring worker exited {worker.exitcode}")
    return max(seconds for _, seconds, _ in done), sum(slots for _, _, slots in done), len(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--slots", type=int, default=100)
    args = parser.parse_args()
    sim = SimConfig(devices=args.devices, slots=args.slots, tasks=20 * args.slots * args.devices // 100)
    rows, rates = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        Simulator(sim).run([ParquetSink(work / "log")])
        events, status = pq.read_table(work / "log" / "events.parquet"), pq.read_table(work / "log" / "status.parquet")
        for kind in ("encoder", "head"):
            checkpoint = untrained_checkpoint(work / kind, sim, window=32, small=False, reads_y=kind == "encoder")
            model, index, _ = load(checkpoint)
            stages = TorchStages(model, index)
            for one in (False, True):
                with on_cores(one) as cores:
                    where = "one core" if one else f"{cores} threads"
                    if kind == "encoder":
                        seconds = encoder_alone(stages, ENCODER_DEVICES)
                        rows.append(_row(f"encoder alone (full windows), {where}", ENCODER_DEVICES, seconds, cores))
                        rates[where] = (gemm_flops_per_s(), cores)
                    total, stage_seconds, slots = scoring(stages, events, status, kind)
                    rows.append({**_row(f"scoring, {kind}, {where}", args.devices * slots, total, cores),
                                 "uses_encoder": stages.uses_encoder,
                                 **{f"{k}_s": round(v, 3) for k, v in stage_seconds.items()}})
        seconds, slots, workers = every_core_at_once(checkpoint, work / "log")  # the head's, made last
        rows.append(_row(f"scoring, head, {workers} one-core workers at once", args.devices * slots, seconds, workers))
        config = model.config
    flops = encoder_flops(config.mamba, config.window)
    for where, (rate, cores) in rates.items():
        floor_s = flops / rate
        rows.append({"case": f"floor: encoder FLOPs at this machine's GEMM rate, {where}", "device_slots": 1,
                     "seconds": floor_s, "device_slots_per_s": round(1 / floor_s),
                     "per_core": round(1 / floor_s / cores), "gemm_gflop_per_s": round(rate / 1e9, 1)})
    emit("scoring_bench", rows, {"threads": torch.get_num_threads(), "devices": args.devices, "slots": args.slots,
                                 "window": config.window, "encoder_mflop_per_device": round(flops / 1e6, 2)})


def _row(case: str, device_slots: int, seconds: float, cores: int) -> dict:
    return {"case": case, "device_slots": device_slots, "seconds": round(seconds, 3),
            "device_slots_per_s": round(device_slots / seconds), "per_core": round(device_slots / seconds / cores)}


if __name__ == "__main__":
    main()
