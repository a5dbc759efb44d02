"""Capacity figures for deploy/README.md, measured here, and the sizing arithmetic they feed.

Measured (one process, torch backend, S = 32, BM's default widths, the simulator's paper setting of
500 devices in 1 km^2, range 300 m):

* ``state_bytes_per_device``: a shard's pickled :class:`model.scoring.DeviceHistory` after S slots
  (what ShardState keeps in Beam state), divided by its devices; also the bound when every device is
  active in every slot.
* ``sequence_ms_per_device``: BiMamba long-term embedding of one device at a slot close.
* ``pair_us``: T_beh + T_res + T + VoC + ranking, per (owner, candidate) pair, from ``score_slot``.
* ``ingest_events_per_core_s``: the batched Kafka path (parse, validate, dedup, slot close with
  T_col, slot graph and GNN) from ``bench/pipeline_bench.py``'s 1M-event run (17,771 events/s on
  2 cores), passed with ``--ingest``; re-measure with that benchmark.

Then, for 10k, 100k and 1M devices at the paper's density of work (0.2 tasks per device per slot, so
an owner has the measured ~110 candidates in range) and at ``--events-per-device`` 10 (millions of events per slot at
100k devices): events/s, cores for ingest, core-seconds of scoring per slot, the parallelism that closes
a slot within ``--close-budget`` seconds, state per device and in total, and shards (``--shards`` =
parallelism x 4, so each worker core holds a few shards and rebalances evenly). The parallelism is the
larger of 1.5 x the ingest cores (headroom for catch-up after a restart) and the scoring core-seconds
over the budget, in whole 2-slot TaskManagers. A slot's rankings appear that scoring time after the
watermark passes the slot's end (plus the allowed lateness when updates are wanted first-time-right).

Run: ``python -m bench.capacity_bench``.
"""

from __future__ import annotations

import argparse
import math
import pickle
import time

import numpy as np

from bench.report import emit

SLOT_S, WINDOW = 60.0, 32


def measure() -> dict:
    import torch

    from model.bm import BM, BMConfig
    from model.config import RankingConfig, SystemParams
    from model.graphs import DeviceIndex
    from model.scoring import DeviceHistory, score_slot, slot_part, status_arrays
    from model.stages import TorchStages
    from simulator.config import SimConfig
    from simulator.engine import MemorySink, Simulator

    torch.manual_seed(0)
    sim = SimConfig(devices=500, tasks=100 * 40, slots=40, seed=2)
    memory = MemorySink()
    Simulator(sim).run([memory])
    events, status = memory["events"], memory["status"]
    index = DeviceIndex(tuple(Simulator(sim).world.ids.to_pylist()))
    config = BMConfig(clock=sim.clock, window=WINDOW)
    stages = TorchStages(BM(config, np.random.default_rng(0).normal(size=(500, 128)).astype(np.float32)), index)
    history = DeviceHistory(config.evidence, config.clock)
    history.add_status(*status_arrays(status))
    slot_of = sim.clock.slot_of(events["event_time_ms"].to_numpy())
    for slot in range(sim.slots):
        history.add_part(slot_part(stages, events.filter(slot_of == slot), slot))
    last = sim.slots - 1
    history.prune(last - WINDOW + 1, int(sim.clock.start_ms(last)))
    state = len(pickle.dumps(history, protocol=pickle.HIGHEST_PROTOCOL)) / len(index)
    evidence_bytes = 8 * len(config.evidence.lams) * 6 * 2 + 24  # a device's evidence as collaborator and owner
    bound = WINDOW * (config.gnn.out_dim * 4 + 8 + 8) + 8 * 8 + 16 + evidence_bytes  # active in every slot
    ranking = RankingConfig(owner_slots=1)
    started = time.perf_counter()
    frame = history.frame(stages, last, ranking)
    sequence_s = time.perf_counter() - started
    started = time.perf_counter()
    result = score_slot(stages, frame, last, ranking, SystemParams(), "bench")
    score_s = time.perf_counter() - started
    owners = int(frame.recent_owner.sum())
    xy = frame.status[:, 3:5]
    distance = np.hypot(*(xy[frame.recent_owner][:, None, :] - xy[None, :, :]).transpose(2, 0, 1))
    pairs = int(((distance <= ranking.range_m) & (distance > 0)).sum())  # the pairs score_slot rated
    return {"state_bytes_per_device": round(state), "state_bound_bytes_per_device": bound,
            "sequence_ms_per_device": round(1000 * sequence_s / len(index), 3),
            "pair_us": round(1e6 * score_s / max(pairs, 1), 2), "owners_scored": owners,
            "candidates_per_owner": round(pairs / max(owners, 1), 1),
            "records": len(result.scores) + len(result.rankings), "threads": torch.get_num_threads()}


def plan(devices: int, events_per_device: float, m: dict, ingest_per_core: float, budget_s: float) -> dict:
    events_s = devices * events_per_device / SLOT_S
    ingest_cores = events_s / ingest_per_core
    owners = devices * min(1.0, events_per_device)
    pairs = owners * m["candidates_per_owner"]
    scoring_core_s = (devices * m["sequence_ms_per_device"] / 1000 + pairs * m["pair_us"] / 1e6) \
        * m["threads"]  # measured with `threads` cores: core-seconds
    parallelism = max(2, math.ceil(max(ingest_cores * 1.5, scoring_core_s / budget_s)))
    parallelism = 2 * math.ceil(parallelism / 2)  # whole 2-slot TaskManagers
    return {"devices": devices, "events_per_device_slot": events_per_device, "events_per_s": round(events_s),
            "ingest_cores": round(ingest_cores, 2), "scoring_core_s_per_slot": round(scoring_core_s, 1),
            "parallelism": parallelism, "shards": 4 * parallelism,
            "scoring_s_at_parallelism": round(scoring_core_s / parallelism, 1),
            "state_gib": round(devices * m["state_bound_bytes_per_device"] / 2**30, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ingest", type=float, default=17_771 / 2, help="ingest events/s per core")
    parser.add_argument("--events-per-device", type=float, default=10.0)
    parser.add_argument("--close-budget", type=float, default=15.0, help="seconds to score a closed slot")
    args = parser.parse_args()
    measured = measure()
    rows = [plan(n, rate, measured, args.ingest, args.close_budget)
            for rate in (0.2, args.events_per_device) for n in (10_000, 100_000, 1_000_000)]
    emit("capacity_bench", rows, {"measured": measured, "ingest_events_per_core_s": args.ingest,
                                  "slot_s": SLOT_S, "window": WINDOW,
                                  "close_budget_s": args.close_budget})


if __name__ == "__main__":
    main()
