"""One slot of a large fleet scored by ``trustbeam score`` on CPU: time per stage and peak memory vs fleet size.

Per size N (default 10k, 30k, 100k devices) a synthetic fleet at the paper's density (500 devices per
km^2, so an owner has the paper's ~140 devices within the 300 m range) and the paper's work (0.2 tasks per
device per slot, each to a random device among the owner's 8 nearest) is written to Parquet, with one
status per device, over ``--slots`` slots; a fresh ``trustbeam score`` process (its own peak RSS) scores it
with an untrained model of BM's default widths (S = 32) that knows 500 of the devices: every other one is
a device the model never saw (cold row plus its own evidence), as in a fleet that grew after training.
Each size is scored twice: by a model whose head reads Y (``encoder``: the slot GNN and BiMamba run) and by
one that reads none (``head``: the warmed-up head training keeps when no end-to-end epoch helps; no GNN, no
BiMamba, one slot of statuses kept). Printed: seconds per stage (statuses, slot part = T_col + graph + GNN, frame = BiMamba + evidence,
pairs = candidates by k-d tree + head + ranking, write = the records' JSON Lines), total, peak RSS, pairs scored, and the growth of time
and memory per device from the smallest size to the largest (~1 when linear).

Run: ``python -m bench.fleet_bench [--sizes 10000 30000 100000] [--slots 2] [--device cpu|cuda|auto]
[--pieces 1]`` (``--pieces``: ``trustbeam score --score_pieces``, the pieces of a slot scored on threads).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.spatial import cKDTree

from bench.fault_harness import untrained_checkpoint
from bench.report import emit
from model.config import DEVICES
from schemas import events_file_schema
from simulator.config import SimConfig
from simulator.world import device_ids

DENSITY_PER_M2 = 500 / 1e6
TASKS_PER_DEVICE_SLOT = 0.2


def fleet(devices: int, slots: int, seed: int = 0) -> tuple[SimConfig, pa.Table, pa.Table]:
    """(the run's config, events, status) of a synthetic fleet (see the module docstring)."""
    rng = np.random.default_rng(seed)
    sim = SimConfig(devices=devices, slots=slots, tasks=1, area_m=float(np.sqrt(devices / DENSITY_PER_M2)))
    ids = device_ids(devices)
    xy = rng.uniform(0, sim.area_m, (devices, 2))
    start = int(sim.clock.start_ms(0))
    status = pa.table({"device": ids, "time_ms": pa.array(np.full(devices, start), pa.int64()),
                       "cpu_hz": rng.choice([1e9, 2e9, 4e9, 6e9], devices), "tx_w": np.full(devices, sim.tx_w),
                       "rx_w": np.full(devices, sim.rx_w), "x_m": xy[:, 0], "y_m": xy[:, 1],
                       "willingness": rng.uniform(0.5, 1, devices), "comm_ok": rng.random(devices) < 0.95,
                       "comp_ok": rng.random(devices) < 0.95})
    _, nearest = cKDTree(xy).query(xy, k=9)  # itself, then its 8 nearest
    tasks = int(devices * TASKS_PER_DEVICE_SLOT)
    owner = np.concatenate([rng.choice(devices, tasks, replace=False) for _ in range(slots)])
    slot = np.repeat(np.arange(slots), tasks)
    collaborator = nearest[owner, rng.integers(1, 9, len(owner))]
    tr = rng.random(len(owner)) < 0.8
    n = len(owner)
    events = pa.table({
        "event_id": [f"e{i}" for i in range(n)],
        "event_time_ms": pa.array(start + slot * sim.clock.slot_ms + rng.integers(0, sim.clock.slot_ms, n), pa.int64()),
        "owner": ids.take(owner), "collaborator": ids.take(collaborator),
        "task_size_bits": np.full(n, 4e7), "density_cycles_per_bit": rng.uniform(500, 3000, n),
        "trust_threshold": rng.uniform(0.3, 0.9, n), "tr_success": tr, "com_success": tr & (rng.random(n) < 0.8),
        "reliability": pa.nulls(n, pa.float64()), "t_total_s": rng.uniform(5, 60, n),
        "e_total_j": rng.uniform(1, 10, n), "t_local_s": rng.uniform(5, 60, n), "e_local_j": rng.uniform(1, 20, n),
        "voc": rng.uniform(0, 1, n), "reporter": pa.nulls(n, pa.string()),  # null: a neutral monitor reported
        "slot": pa.array(slot, pa.int64())})
    return sim, events.cast(events_file_schema(sim.clock.metadata())), status


def write_fleet(devices: int, slots: int, work: Path) -> int:
    """:func:`fleet` as ``events-N.parquet`` and ``status-N.parquet`` under ``work``; its number of events."""
    _, events, status = fleet(devices, slots)
    pq.write_table(events, work / f"events-{devices}.parquet")
    pq.write_table(status, work / f"status-{devices}.parquet")
    return events.num_rows


def measure(devices: int, slots: int, work: Path, checkpoint: Path, device: str = "auto", model: str = "",
            pieces: int = 1, events: int | None = None) -> dict:
    """One ``trustbeam score`` process over the fleet of ``devices`` (written first unless ``events``, its number of
    events, says it is there), its slots in ``pieces`` pieces (``--score_pieces``: scored on that many threads)."""
    events = write_fleet(devices, slots, work) if events is None else events
    command = [sys.executable, "-m", "trustbeam.cli", "score", "--events", str(work / f"events-{devices}.parquet"),
               "--status", str(work / f"status-{devices}.parquet"), "--out", str(work / f"out-{devices}"),
               f"--checkpoint={checkpoint}", f"--device={device}", f"--score_pieces={pieces}"]
    started = time.perf_counter()
    with open(work / "stdout", "wb") as out, open(work / "stderr", "wb") as err:
        process = subprocess.Popen(command, stdout=out, stderr=err)
        _, status_code, usage = os.wait4(process.pid, 0)  # the child's own peak RSS
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status_code) != 0:
        raise RuntimeError(f"trustbeam score failed at {devices} devices: {(work / 'stderr').read_text()[-2000:]}")
    summary = json.loads((work / "stdout").read_text())
    return {"devices": devices, "model": model, "device": device, "pieces": pieces, "events": events,
            "slots": summary["slots"], "trust_scores": summary["trust_scores"],
            **{f"{k}_s": v for k, v in summary["seconds_by_stage"].items()},
            **{f"{k}_phase_s": v for k, v in summary["seconds_by_phase"].items()},
            "total_s": round(seconds, 1), "peak_rss_mb": int(usage.ru_maxrss / 1024)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 100_000])
    parser.add_argument("--slots", type=int, default=2, help="slots of events (each scored)")
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="trustbeam score --device")
    parser.add_argument("--pieces", type=int, default=1, help="trustbeam score --score_pieces (threads)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        checkpoints = {model: untrained_checkpoint(work / model, SimConfig(devices=500), window=32, small=False,
                                                   reads_y=model == "encoder") for model in ("encoder", "head")}
        rows = []
        for n in sorted(args.sizes):
            events = write_fleet(n, args.slots, work)
            rows += [measure(n, args.slots, work, checkpoint, args.device, model, args.pieces, events)
                     for model, checkpoint in checkpoints.items()]
    encoder = [r for r in rows if r["model"] == "encoder"]
    first, last = encoder[0], encoder[-1]
    scale = last["devices"] / first["devices"]
    emit("fleet_bench", rows, {"time_growth_per_device": round(last["total_s"] / first["total_s"] / scale, 2),
                               "memory_growth_per_device": round(last["peak_rss_mb"] / first["peak_rss_mb"] / scale, 2),
                               "cores": os.cpu_count(),
                               "device_slots_per_s": {f'{r["devices"]} {r["model"]}': round(
                                   r["devices"] * r["slots"] / r["total_s"]) for r in rows}})


if __name__ == "__main__":
    main()
