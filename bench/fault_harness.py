"""The streaming job under faults, hostile input and load, on the real local broker; prints a summary.

* ``restart``: a simulated run on Kafka; ``trustbeam run --until-end`` in a subprocess is SIGKILLed at a
  kill point (a random delay into the cycle, or the moment its first output record appears, i.e. mid
  publication, before its ledger is saved), then restarted until it completes. The output topics must
  equal an uninterrupted offline scoring: no slot lost, no record published twice.
* ``outage``: ``--follow`` cycles in-process; the broker is SIGKILLed after the first cycle and a fresh
  one started on the same port after a pause. Tansu keeps no data across a restart: the job detects the
  shorter logs, re-reads them from the start, keeps what it already published, and publishes the slots
  of the events sent after the restart. Counted: outages survived, slots published after recovery.
* ``hostile``: each kind of bad message (random bytes, truncated, over-sized, wrong types, NaN/inf,
  negative sizes, owner == collaborator, unknown schema version, far future, before the origin, unknown
  device, control characters in ids, duplicates) goes to the events topic beside a valid run; every bad
  one must land in dead-letter with its reason and the counters must add up.
* ``load``: 5,000 devices (10x the paper's), statuses and events over many slots, ``--follow`` cycles while
  a publisher keeps sending; peak RSS and the pickled size of the shard state, against devices x S.

Run: ``python -m bench.fault_harness [--seeds 2] [--load-slots 40] [--soak-minutes 10]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.report import emit

HOSTILE_KINDS = ("random_bytes", "truncated", "oversized", "wrong_type", "nan", "infinity", "negative_size",
                 "owner_is_collaborator", "unknown_schema_version", "far_future", "before_origin",
                 "unknown_device", "control_characters", "duplicate")


def small_run(seed: int = 5, devices: int = 30, slots: int = 8, tasks: int = 360):
    from simulator.config import SimConfig
    from simulator.engine import MemorySink, Simulator

    sim = SimConfig(devices=devices, tasks=tasks, slots=slots, seed=seed)
    memory = MemorySink()
    Simulator(sim).run([memory])
    return sim, memory["events"], memory["status"]


def untrained_checkpoint(directory: Path, sim, window: int = 6) -> Path:
    """A seeded, untrained BM over the run's devices (parity and plumbing need no training)."""
    import torch

    from model.bimamba import MambaConfig
    from model.bm import BM, BMConfig
    from model.checkpoint import save
    from model.gnn import GNNConfig
    from model.graphs import DeviceIndex
    from model.node2vec import Node2VecConfig
    from simulator.world import device_ids

    torch.manual_seed(0)
    config = BMConfig(gnn=GNNConfig(node_dim=8, psi_dim=4, time_dim=4, widths=(8, 16, 8)),
                      mamba=MambaConfig(d_model=8, d_state=4, n_layers=1), node2vec=Node2VecConfig(dim=8),
                      window=window, levels=5, head_hidden=8, clock=sim.clock)
    features = np.random.default_rng(0).normal(size=(sim.devices, 8)).astype(np.float32)
    save(BM(config, features), DeviceIndex(tuple(device_ids(sim.devices).to_pylist())), directory)
    return directory


def fresh_topics(settings):
    from trustbeam.kafka import Topics, ensure_topics

    tag = uuid.uuid4().hex[:8]
    topics = Topics(*(f"{name}-{tag}" for name in ("events", "status", "scores", "rankings", "dead")))
    ensure_topics(settings, topics.partitions())
    return topics


def publish(settings, topics, events, status) -> None:
    from simulator.publish import KafkaPublisher

    publisher = KafkaPublisher(settings, topics)
    publisher.write("status", status)
    publisher.write("events", events)
    publisher.close()


def topic_args(topics) -> list[str]:
    return [f"--{name}_topic={getattr(topics, name)}" for name in ("events", "status", "scores", "rankings",
                                                                  "dead_letter")]


def published_keys(settings, topics) -> tuple[dict, int]:
    """{(kind, slot, owner, collaborator): record json} of the output topics, and how many keys repeat."""
    from trustbeam.kafka import read_to_end

    keys, repeats = {}, 0
    for kind, topic in (("score", topics.scores), ("ranking", topics.rankings)):
        for record in read_to_end(settings, topic):
            body = json.loads(record.value)
            key = (kind, body["slot"], body["owner"], body.get("collaborator", ""))
            repeats += key in keys and not body["is_update"]
            keys[key] = body
    return keys, repeats


def offline_keys(checkpoint: Path, topics, events, status) -> dict:
    from beam_pipeline.options import JobConfig
    from model.scoring import score_log

    config = JobConfig(str(checkpoint), shards=3, topics=topics)
    stages, index, version = config.stages()
    out = {}
    for result in score_log(stages, index, events, status, config.ranking, config.params, version):
        for kind, records in (("score", result.scores), ("ranking", result.rankings)):
            for r in records:
                out[(kind, r.slot, r.owner, getattr(r, "collaborator", ""))] = r.to_dict()
    return out


def same_values(got: dict, want: dict) -> bool:
    """Same keys, T and T_beh (scores) or candidate order (rankings) within 1e-5."""
    if set(got) != set(want):
        return False
    for key, w in want.items():
        g = got[key]
        if key[0] == "score":
            if abs(g["trust"] - w["trust"]) > 1e-5 or abs(g["t_beh"] - w["t_beh"]) > 1e-5:
                return False
        elif [c["collaborator"] for c in g["candidates"]] != [c["collaborator"] for c in w["candidates"]]:
            return False
    return True


def kill_restart(settings, work: Path, kill: str, seed: int = 5) -> dict[str, Any]:
    """One restart trial: kill ``kill`` ("first-output" or "delay:<s>"), restart until done, compare."""
    sim, events, status = small_run(seed)
    checkpoint = untrained_checkpoint(work / f"model-{seed}", sim)
    topics = fresh_topics(settings)
    publish(settings, topics, events, status)
    env = {**os.environ, "TRUSTBEAM_STATE_DIR": str(work / f"state-{uuid.uuid4().hex[:6]}")}
    command = [sys.executable, "-m", "trustbeam.cli", "run", "--until-end", "--bootstrap", settings.bootstrap,
               "--group", "harness", f"--checkpoint={checkpoint}", "--shards=3", *topic_args(topics)]
    kills, attempts, started = 0, 0, time.monotonic()
    while True:
        attempts += 1
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if attempts == 1:
            if kill == "first-output":
                _wait_for_output(settings, topics, process)
            else:
                try:
                    process.wait(timeout=float(kill.split(":")[1]))
                except subprocess.TimeoutExpired:
                    pass
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                kills += 1
            process.wait()
            continue
        _, err = process.communicate(timeout=600)
        if process.returncode != 0:
            raise RuntimeError(f"restarted run failed ({process.returncode}): {err.decode()[-2000:]}")
        break
    got, repeats = published_keys(settings, topics)
    want = offline_keys(checkpoint, topics, events, status)
    slots = {k[1] for k in want}
    return {"kill": kill, "seed": seed, "killed": kills, "attempts": attempts,
            "slots_expected": len(slots), "slots_lost": len(slots - {k[1] for k in got}),
            "records_missing": len(set(want) - set(got)), "duplicates_published": repeats,
            "equal_to_uninterrupted": same_values(got, want), "seconds": round(time.monotonic() - started, 1)}


def _wait_for_output(settings, topics, process: subprocess.Popen, timeout_s: float = 300) -> None:
    """Return as soon as any record is on the rankings or scores topic (the cycle is publishing)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**settings.client_args(), enable_auto_commit=False)
    try:
        parts = [TopicPartition(t, p) for t in (topics.scores, topics.rankings)
                 for p in consumer.partitions_for_topic(t) or ()]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and process.poll() is None:
            if any(consumer.poll(timeout_ms=50, max_records=1).values()):
                return
    finally:
        consumer.close()
