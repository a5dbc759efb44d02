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


def outage(work: Path, port: int, pause_s: float = 3.0, seed: int = 6) -> dict[str, Any]:
    """``--follow`` cycles through a broker SIGKILL and restart (memory broker: the logs come back empty)."""
    from beam_pipeline.options import JobConfig
    from beam_pipeline.run import Backoff, run
    from deploy.local.broker import LocalBroker
    from trustbeam.kafka import ensure_topics

    os.environ["TRUSTBEAM_STATE_DIR"] = str(work / "outage-state")
    sim, events, status = small_run(seed, slots=12, tasks=540)
    checkpoint = untrained_checkpoint(work / "outage-model", sim)
    broker = LocalBroker(port=port, state_dir=work / "outage-broker")
    broker.start()
    topics = fresh_topics(broker.settings)
    slot_of = sim.clock.slot_of(events["event_time_ms"].to_numpy())
    half = sim.slots // 2
    publish(broker.settings, topics, events.filter(slot_of < half), status)
    config = JobConfig(str(checkpoint), shards=3, lateness_slots=0, topics=topics)
    reports, failure = [], []
    stop = threading.Event()

    def follow() -> None:
        try:
            for report in run(broker.settings, config, "outage", follow=True, poll_s=0.5,
                              backoff=Backoff(initial_s=0.5, max_s=4.0)):
                reports.append((time.monotonic(), report))
                if stop.is_set():
                    return
        except Exception as error:  # noqa: BLE001 - the harness reports it
            failure.append(error)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    _wait(lambda: reports or failure, 300)
    before = {s for _, r in reports for s in r.published_slots}
    os.kill(broker.pid(), signal.SIGKILL)
    down_at = time.monotonic()
    time.sleep(pause_s)
    broker.start()
    ensure_topics(broker.settings, topics.partitions())
    restarted_at = time.monotonic()
    publish(broker.settings, topics, events.filter(slot_of >= half), status)
    expected_after = set(range(half, sim.slots - 1))  # the last slot waits for a later event (lateness 0)
    _wait(lambda: failure or expected_after <= {s for t, r in reports if t > restarted_at for s in r.published_slots},
          300)
    stop.set()
    thread.join(timeout=120)
    broker.stop()
    after = {s for t, r in reports if t > restarted_at for s in r.published_slots}
    return {"outage_s": round(restarted_at - down_at, 1), "crashed": bool(failure),
            "error": str(failure[0])[:200] if failure else "", "slots_before": len(before),
            "slots_after_recovery": len(after & expected_after), "slots_expected_after": len(expected_after),
            "republished_before_outage_slots": len(after & before), "cycles": len(reports)}


def _wait(condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met within {timeout_s} s")
        time.sleep(0.2)


def hostile_messages(valid: dict, seed: int = 0) -> dict[str, bytes]:
    """One bad message of each kind, built from a valid event's fields (``valid``, without schema_version)."""
    rng = random.Random(seed)

    def wire(**changes: Any) -> bytes:
        return json.dumps({"schema_version": 1, **valid, **changes}, separators=(",", ":")).encode()

    good = wire(event_id=f"{valid['event_id']}-ok")
    far_future = int(time.time() * 1000) + 10 * 365 * 86_400_000
    return {
        "random_bytes": bytes(rng.getrandbits(8) for _ in range(64)),
        "truncated": good[: len(good) // 2],
        "oversized": wire(event_id="x" * (1 << 20)),
        "wrong_type": wire(event_id="h-type", task_size_bits="big"),
        "nan": wire(event_id="h-nan").replace(b'"trust_threshold":', b'"trust_threshold":NaN,"_":').replace(
            b',"_":' + str(valid["trust_threshold"]).encode(), b""),
        "infinity": wire(event_id="h-inf", density_cycles_per_bit=1.0).replace(
            b'"density_cycles_per_bit":1.0', b'"density_cycles_per_bit":Infinity'),
        "negative_size": wire(event_id="h-neg", task_size_bits=-5.0),
        "owner_is_collaborator": wire(event_id="h-self", collaborator=valid["owner"]),
        "unknown_schema_version": wire(event_id="h-v9", schema_version=9),
        "far_future": wire(event_id="h-future", event_time_ms=far_future),
        "before_origin": wire(event_id="h-past", event_time_ms=5),
        "unknown_device": wire(event_id="h-stranger", collaborator="nobody"),
        "control_characters": wire(event_id="h-ctl", owner="dev\u0000one"),
        "duplicate": wire(),
    }


def hostile(settings, work: Path, seed: int = 5) -> dict[str, Any]:
    """A valid run plus one message of every bad kind in one cycle: where each went, and the counters."""
    from beam_pipeline.options import JobConfig
    from beam_pipeline.run import Ledger, run_cycle
    from trustbeam.kafka import make_producer, read_to_end

    sim, events, status = small_run(seed)
    checkpoint = untrained_checkpoint(work / f"hostile-model-{seed}", sim)
    topics = fresh_topics(settings)
    publish(settings, topics, events, status)
    valid = events.slice(0, 1).drop_columns(["slot"]).to_pylist()[0]
    bad = hostile_messages(valid, seed)
    producer = make_producer(settings, max_request_size=4 << 20)
    for value in bad.values():
        producer.send(topics.events, key=b"hostile", value=value)
    producer.flush()
    producer.close()
    config = JobConfig(str(checkpoint), shards=3, topics=topics)
    _, report = run_cycle(settings, config, Ledger(), final=True, snapshot_dir=work)
    letters = [(bytes(r.value), dict(r.headers)) for r in read_to_end(settings, topics.dead_letter)]
    c = report.counters

    def reason(value: bytes) -> str:  # a cut-down letter matches its original's prefix and size
        for body, headers in letters:
            if body == value or (b"truncated_from" in {k.encode() for k in headers} and value.startswith(body)
                                 and int(headers["truncated_from"]) == len(value)):
                return headers["reason"].decode()
        return ""

    landed = {kind: reason(value) for kind, value in bad.items()}
    got, repeats = published_keys(settings, topics)
    return {"kinds": len(bad), "dead_lettered": sum(bool(v) for k, v in landed.items() if k != "duplicate"),
            "reasons": landed, "duplicates_dropped": c.get("events_duplicate", 0),
            "read": c.get("events_read", 0),
            "accounted": sum(c.get(f"events_{k}", 0) for k in ("valid", "invalid", "unknown_device", "late",
                                                                "future")),
            "valid_events": events.num_rows,
            "outputs_equal_clean_run": same_values(got, offline_keys(checkpoint, topics, events, status)),
            "duplicates_published": repeats}
