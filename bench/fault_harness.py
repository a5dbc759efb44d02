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
* ``disorder``: the ordinary disorder of production streams, each scenario reporting events published,
  processed, dead-lettered (by reason), lost (must be 0) and output records duplicated (must be 0):
  the broker replaced under the job (the input topics deleted and created again, a new run published);
  a producer whose clock runs hours ahead, in ``--follow`` cycles on a live clock; record timestamps
  stepping back across polls; two followers on one ledger (the second must be refused); the broker
  frozen (SIGSTOP) for 12 s mid-cycle. Compacted and transactional topics: Tansu 0.6 supports
  neither, so the scenario reports that; the reader's handling of offset gaps is covered by
  ``tests/test_source.py``.

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

from bench.report import emit, peak_rss_kb

HOSTILE_KINDS = ("random_bytes", "truncated", "oversized", "wrong_type", "nan", "infinity", "negative_size",
                 "owner_is_collaborator", "unknown_schema_version", "far_future", "before_origin",
                 "control_characters", "duplicate")


def small_run(seed: int = 5, devices: int = 30, slots: int = 8, tasks: int = 360):
    from simulator.config import SimConfig
    from simulator.engine import MemorySink, Simulator

    sim = SimConfig(devices=devices, tasks=tasks, slots=slots, seed=seed)
    memory = MemorySink()
    Simulator(sim).run([memory])
    return sim, memory["events"], memory["status"]


def untrained_checkpoint(directory: Path, sim, window: int = 6, small: bool = True, reads_y: bool = True) -> Path:
    """A seeded, untrained BM over the run's devices (parity and plumbing need no training); ``small``
    shrinks the widths for speed, else BM's defaults (the paper's). ``reads_y``: the head's Y weights, which
    start at zero, get small random values, so scoring runs the slot GNN and the sequence encoder; else the
    model is like a head kept from the warm-up, which needs neither."""
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
                      window=window, levels=5, head_hidden=8, clock=sim.clock) if small else \
        BMConfig(window=window, clock=sim.clock)
    features = np.random.default_rng(0).normal(size=(sim.devices, config.node2vec.dim)).astype(np.float32)
    model = BM(config, features)
    if reads_y:
        read_y(model)
    save(model, DeviceIndex(tuple(device_ids(sim.devices).to_pylist())), directory)
    return directory


def read_y(model) -> None:
    """Give BM's head small random weights on Y (they start at zero, as in a head kept from the warm-up), so that
    scoring the model runs the slot GNN and the sequence encoder."""
    import torch

    with torch.no_grad():
        for member in model.head.members:
            member.behaviour[0].weight[:, : model.head.y_width].normal_(0.0, 0.01)


def fresh_topics(settings):
    from exporters.kafka_client import Topics, ensure_topics

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
    """{(kind, slot, owner, collaborator): record json} of the output topics (the newest generation's), and how
    many publications repeat: the same job generation, record, model version and revision sent twice."""
    from beam_pipeline.pipeline import JOB_HEADER
    from exporters.kafka_client import read_to_end

    keys, seen, repeats = {}, set(), 0
    for kind, topic in (("score", topics.scores), ("ranking", topics.rankings)):
        for record in read_to_end(settings, topic):
            body = json.loads(record.value)
            key = (kind, body["slot"], body["owner"], body.get("collaborator", ""))
            publication = (dict(record.headers or []).get(JOB_HEADER), *key, body["model_version"],
                           body.get("revision"))
            repeats += publication in seen
            seen.add(publication)
            keys[key] = body
    return keys, repeats


def offline_keys(checkpoint: Path, topics, events, status) -> dict:
    from beam_pipeline.options import JobConfig
    from model.recalibration import OnlineShift
    from model.scoring import score_log

    config = JobConfig(str(checkpoint), shards=3, topics=topics)
    stages, version = config.stages()
    out = {}
    for result in score_log(stages, events, status, config.ranking, config.params, version,
                            online=OnlineShift.start(config.recalibration)):
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
    from exporters.kafka_client import ensure_topics

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
            impatient = replace(broker.settings, delivery_timeout_s=5.0)  # a publish the outage caught fails in 5 s
            for report in run(impatient, config, "outage", follow=True, poll_s=0.5,
                              backoff=Backoff(initial_s=0.5, max_s=4.0), stop=stop):  # stop: ends an idle wait too
                reports.append((time.monotonic(), report))
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
            "republished_before_outage_slots": len(after & before), "cycles": len(reports),
            "retries": sum(r.retries for _, r in reports), "log_replaced": any(r.log_replaced for _, r in reports)}


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
        "control_characters": wire(event_id="h-ctl", owner="dev\u0000one"),
        "foreign_reporter": wire(event_id="h-reporter", reporter=valid["collaborator"]),
        "duplicate": wire(),
    }


def hostile(settings, work: Path, seed: int = 5) -> dict[str, Any]:
    """A valid run plus one message of every bad kind in one cycle: where each went, and the counters."""
    from beam_pipeline.options import JobConfig
    from beam_pipeline.run import Ledger, run_cycle
    from exporters.kafka_client import make_producer, read_to_end

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
            "letters_without_pointer": sum(not all(k in h for k in ("source_topic", "source_partition",
                                                                    "source_offset")) for _, h in letters),
            "read": c.get("events_read", 0),
            "accounted": sum(c.get(f"events_{k}", 0) for k in ("valid", "invalid", "late", "future")),
            "valid_events": events.num_rows,
            "outputs_equal_clean_run": same_values(got, offline_keys(checkpoint, topics, events, status)),
            "duplicates_published": repeats}


def load(settings, work: Path, devices: int = 5000, slots: int = 40, tasks_per_device_slot: float = 0.2,
         pace_s: float = 15.0, seed: int = 7) -> dict[str, Any]:
    """``trustbeam run --follow`` (its own process) while the simulator publishes slot after slot."""
    import pickle

    from beam_pipeline.options import JobConfig
    from model.scoring import DeviceHistory, slot_part, status_arrays
    from simulator.config import SimConfig
    from simulator.engine import MemorySink, Simulator
    from simulator.publish import KafkaPublisher

    sim = SimConfig(devices=devices, tasks=int(devices * tasks_per_device_slot * slots), slots=slots,
                    status_every=10, seed=seed)
    memory = MemorySink()
    Simulator(sim).run([memory])
    events, status = memory["events"], memory["status"]
    checkpoint = untrained_checkpoint(work / f"load-model-{devices}", sim, window=32, small=False)
    topics = fresh_topics(settings)
    env = {**os.environ, "TRUSTBEAM_STATE_DIR": str(work / f"load-state-{uuid.uuid4().hex[:6]}")}
    command = [sys.executable, "-m", "trustbeam.cli", "run", "--follow", "--poll-seconds", "1", "--bootstrap",
               settings.bootstrap, "--group", "load", f"--checkpoint={checkpoint}", "--shards=4",
               *topic_args(topics)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    reports: list[dict] = []
    reader = threading.Thread(target=lambda: reports.extend(json.loads(line) for line in process.stdout
                                                            if line.startswith("{")), daemon=True)
    reader.start()
    publisher = KafkaPublisher(settings, topics)
    slot_of = sim.clock.slot_of(events["event_time_ms"].to_numpy())
    status_slot = sim.clock.slot_of(status["time_ms"].to_numpy())
    started, peak_kb = time.monotonic(), 0
    for slot in range(slots):
        publisher.write("status", status.filter(status_slot == slot))
        publisher.write("events", events.filter(slot_of == slot))
        publisher.sink.flush()
        peak_kb = max(peak_kb, peak_rss_kb(process.pid))
        time.sleep(max(0.0, started + (slot + 1) * pace_s - time.monotonic()))
    publisher.close()
    expected = set(range(slots - 2))  # the last slots wait for events past the allowed lateness
    _wait(lambda: expected <= {s for r in reports for s in r["published_slots"]} or process.poll() is not None,
          max(900, 30 * slots))
    peak_kb = max(peak_kb, peak_rss_kb(process.pid))
    process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
    seconds = time.monotonic() - started
    _, repeats = published_keys(settings, topics)
    read = sum(r["counters"].get("events_read", 0) for r in reports)
    accounted = sum(r["counters"].get(f"events_{k}", 0) for r in reports
                    for k in ("valid", "invalid", "late", "future"))
    config = JobConfig(str(checkpoint), topics=topics)
    stages, _ = config.stages()
    history = DeviceHistory(stages.config.evidence, stages.config.clock)
    history.add_status(*status_arrays(status))
    for slot in range(slots):
        history.add_part(slot_part(stages, events.filter(slot_of == slot), slot))
    history.prune(slots - 32, int(sim.clock.start_ms(slots - 1)))
    state = len(pickle.dumps(history, protocol=pickle.HIGHEST_PROTOCOL))
    return {"devices": devices, "slots": slots, "events": events.num_rows, "status_rows": status.num_rows,
            "seconds": round(seconds, 1), "cycles": len(reports), "events_read": read,
            "events_lost": events.num_rows - accounted, "duplicates_published": repeats,
            "slots_published": len({s for r in reports for s in r["published_slots"]}),
            "peak_rss_mb": round(peak_kb / 1024), "state_mb": round(state / 2**20, 2),
            "state_bytes_per_device": round(state / devices),
            "state_bound_mb": round(devices * 32 * (32 * 4 + 16) / 2**20, 2)}


def accounted(counters: dict) -> int:
    """Events a cycle processed or dead-lettered (a duplicate is processed, then dropped)."""
    return sum(counters.get(f"events_{k}", 0) for k in ("valid", "invalid", "late", "future"))


def reason_kind(reason: str) -> str:
    """``collaboration_event: late: slot 5 ...`` -> ``late``; a field error -> the field's name."""
    parts = reason.split(":")
    return parts[1].strip() if len(parts) > 2 else reason[:40]


def scenario_row(name: str, settings, topics, published: int, reports: list, expect_dead: int = 0,
                 extra: dict | None = None) -> dict[str, Any]:
    """The disorder scenarios' common summary: published, processed, dead-lettered by reason, lost, duplicated."""
    from exporters.kafka_client import read_to_end

    counters = [r.counters for r in reports]
    dead: dict[str, int] = {}
    for record in read_to_end(settings, topics.dead_letter):
        kind = reason_kind(dict(record.headers)["reason"].decode())
        dead[kind] = dead.get(kind, 0) + 1
    _, repeats = published_keys(settings, topics)
    read = sum(c.get("events_read", 0) for c in counters)
    row = {"scenario": name, "published": published, "read": read,
           "processed": sum(c.get("events_valid", 0) for c in counters), "dead_lettered": dead,
           "lost": published - sum(accounted(c) for c in counters), "duplicated": repeats, **(extra or {})}
    row["ok"] = row["lost"] == 0 and repeats == 0 and sum(dead.values()) == expect_dead and read == published
    return row


def disorder(settings, work: Path) -> list[dict[str, Any]]:
    """The ordinary-disorder scenarios (see the module docstring)."""
    return [replaced_log(settings, work), skewed_producer(settings, work), stepping_back(settings, work),
            two_followers(settings, work), stalled_broker(work),
            {"scenario": "compacted / transactional topic", "ok": None, "detail": "not supported by Tansu 0.6; "
             "offset gaps are covered by tests/test_source.py"}]


def replaced_log(settings, work: Path) -> dict[str, Any]:
    from beam_pipeline.options import JobConfig
    from beam_pipeline.run import run
    from exporters.kafka_client import admin, ensure_topics

    os.environ["TRUSTBEAM_STATE_DIR"] = str(work / f"replaced-{uuid.uuid4().hex[:6]}")
    sim, events, status = small_run(5)
    checkpoint = untrained_checkpoint(work / "replaced-model", sim)
    topics = fresh_topics(settings)
    config = JobConfig(str(checkpoint), shards=3, topics=topics)
    publish(settings, topics, events, status)
    (first,) = run(settings, config, "replaced", follow=False)
    client = admin(settings)
    client.delete_topics([topics.events, topics.status])
    client.close()
    time.sleep(0.5)
    ensure_topics(settings, {topics.events: 8, topics.status: 4})
    _, later, later_status = small_run(11, tasks=720)
    publish(settings, topics, later, later_status)
    (second,) = run(settings, config, "replaced", follow=False)
    return scenario_row("broker replaced (topics recreated)", settings, topics, events.num_rows + later.num_rows,
                        [first, second], extra={"detail": f"detected: {second.log_replaced}, slots published "
                                                          f"{len(first.published_slots)} + {len(second.published_slots)}"})


def skewed_producer(settings, work: Path) -> dict[str, Any]:
    from beam_pipeline.options import JobConfig
    from beam_pipeline.run import run
    from model.config import SlotClock
    from schemas import CollaborationEvent, to_json
    from exporters.kafka_client import make_producer

    os.environ["TRUSTBEAM_STATE_DIR"] = str(work / f"skew-{uuid.uuid4().hex[:6]}")
    now_slot = int(time.time() * 1000) // 60_000
    sim, _, _ = small_run(5)
    sim = replace(sim, slots=12, tasks=540, clock=SlotClock(origin_ms=(now_slot - 12) * 60_000))
    from simulator.engine import MemorySink, Simulator

    memory = MemorySink()
    Simulator(sim).run([memory])
    events, status = memory["events"], memory["status"]
    checkpoint = untrained_checkpoint(work / f"skew-model-{now_slot}", sim)
    topics = fresh_topics(settings)
    config = JobConfig(str(checkpoint), shards=3, topics=topics)
    slot = events["slot"].to_numpy()
    publish(settings, topics, events.filter(slot < 6), status)
    ahead = int(time.time() * 1000) + 3 * 3_600_000
    skewed = CollaborationEvent(event_id="skewed", event_time_ms=ahead, owner="dev-000001", collaborator="dev-000002",
                                tr_success=True, com_success=True)
    producer = make_producer(settings)
    producer.send(topics.events, key=b"dev-000001", value=to_json(skewed), timestamp_ms=ahead)
    producer.flush()
    producer.close()
    reports = list(run(settings, config, "skew", follow=True, poll_s=0, max_cycles=1))
    publish(settings, topics, events.filter(slot >= 6), status.slice(0, 0))
    reports += list(run(settings, config, "skew", follow=True, poll_s=0, max_cycles=1))
    closed = [s for r in reports for s in r.published_slots]
    row = scenario_row("a producer 3 h ahead (follow, live clock)", settings, topics, events.num_rows + 1, reports,
                       extra={"detail": f"slots published {closed[0]}..{closed[-1]}; late: "
                                        f"{sum(r.counters.get('events_late', 0) for r in reports)}"})
    row["ok"] = row["ok"] and max(closed) <= 9  # nothing closed by the skewed event; the last slots wait
    return row


def stepping_back(settings, work: Path) -> dict[str, Any]:
    from beam_pipeline.options import JobConfig
    from beam_pipeline.run import run
    from simulator.publish import KafkaPublisher

    os.environ["TRUSTBEAM_STATE_DIR"] = str(work / f"back-{uuid.uuid4().hex[:6]}")
    sim, events, status = small_run(7)
    checkpoint = untrained_checkpoint(work / "back-model", sim)
    topics = fresh_topics(settings)
    publisher = KafkaPublisher(settings, topics)
    publisher.write("status", status)
    for chunk in reversed(np.array_split(np.arange(events.num_rows), 6)):  # each poll's timestamps older than the last
        publisher.write("events", events.take(chunk))
        publisher.sink.flush()
    publisher.close()
    config = JobConfig(str(checkpoint), shards=3, topics=topics)
    reports = list(run(settings, config, "back", follow=False))
    got, _ = published_keys(settings, topics)
    row = scenario_row("record timestamps stepping back", settings, topics, events.num_rows, reports)
    row["ok"] = row["ok"] and same_values(got, offline_keys(checkpoint, topics, events, status))
    row["detail"] = "no crash; outputs equal the offline scorer's"
    return row


def two_followers(settings, work: Path) -> dict[str, Any]:
    sim, events, status = small_run(8)
    checkpoint = untrained_checkpoint(work / "two-model", sim)
    topics = fresh_topics(settings)
    publish(settings, topics, events, status)
    env = {**os.environ, "TRUSTBEAM_STATE_DIR": str(work / f"two-{uuid.uuid4().hex[:6]}")}
    command = [sys.executable, "-m", "trustbeam.cli", "run", "--follow", "--poll-seconds", "1", "--bootstrap",
               settings.bootstrap, "--group", "shared", f"--checkpoint={checkpoint}", "--shards=3",
               *topic_args(topics)]
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first.stdout.readline()  # its first cycle is done: it holds the ledger
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=60)
    _, repeats = published_keys(settings, topics)
    return {"scenario": "two followers on one ledger", "ok": second.returncode == 2 and repeats == 0
            and "is using this ledger" in second.stderr, "published": events.num_rows, "lost": 0,
            "duplicated": repeats, "detail": f"second refused with exit {second.returncode}"}


def stalled_broker(work: Path) -> dict[str, Any]:
    from beam_pipeline.options import JobConfig
    from beam_pipeline.run import Backoff, run
    from deploy.local.broker import LocalBroker
    from deploy.local.broker import free_port

    os.environ["TRUSTBEAM_STATE_DIR"] = str(work / f"stall-{uuid.uuid4().hex[:6]}")
    broker = LocalBroker(port=free_port(), state_dir=work / "stall-broker")
    broker.start()
    try:
        sim, events, status = small_run(9)
        checkpoint = untrained_checkpoint(work / "stall-model", sim)
        topics = fresh_topics(broker.settings)
        publish(broker.settings, topics, events, status)
        pid = broker.pid()

        def freeze() -> None:
            time.sleep(2.0)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(12.0)
            os.kill(pid, signal.SIGCONT)

        threading.Thread(target=freeze, daemon=True).start()
        config = JobConfig(str(checkpoint), shards=3, topics=topics)
        reports = list(run(broker.settings, config, "stall", follow=False, backoff=Backoff(0.5, 4.0),
                           retry_deadline_s=120))
        row = scenario_row("broker frozen 12 s mid-cycle", broker.settings, topics, events.num_rows, reports,
                           extra={"detail": f"retries {sum(r.retries for r in reports)}"})
    finally:
        broker.stop()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--kill-delays", type=float, nargs="+", default=[2.0, 5.0, 9.0])
    parser.add_argument("--load-devices", type=int, default=5000)
    parser.add_argument("--load-slots", type=int, default=20)
    parser.add_argument("--load-pace", type=float, default=15.0,
                        help="seconds between published slots of the load scenario (the job's own pace at 5,000 "
                             "devices on 2 cores is about one 60 s slot per 17 s)")
    parser.add_argument("--soak-minutes", type=float, default=0.0,
                        help="run the load scenario at least this long")
    args = parser.parse_args()
    from deploy.local.broker import LocalBroker
    from deploy.local.broker import free_port

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        broker = LocalBroker(port=free_port(), state_dir=work / "broker")
        broker.start()
        try:
            kills = [kill_restart(broker.settings, work, kill, seed)
                     for seed in range(5, 5 + args.seeds)
                     for kill in ["first-output", *(f"delay:{d}" for d in args.kill_delays)]]
            outages = [outage(work, free_port(), pause_s=6.0)]
            bad = hostile(broker.settings, work)
            slots = max(args.load_slots, math.ceil(args.soak_minutes * 60 / args.load_pace))
            loaded = load(broker.settings, work, devices=args.load_devices, slots=slots, pace_s=args.load_pace)
            disordered = disorder(broker.settings, work)
        finally:
            broker.stop()
    rows = [{"scenario": f"restart kill={k['kill']} seed={k['seed']}", "ok": k["equal_to_uninterrupted"],
             "lost": k["slots_lost"] + k["records_missing"], "duplicates": k["duplicates_published"],
             "detail": f"{k['attempts']} runs, {k['seconds']} s"} for k in kills]
    rows += [{"scenario": f"broker outage {o['outage_s']} s", "ok": not o["crashed"] and
              o["slots_after_recovery"] == o["slots_expected_after"], "lost": 0,
              "duplicates": o["republished_before_outage_slots"],
              "detail": f"{o['slots_after_recovery']}/{o['slots_expected_after']} slots after recovery"}
             for o in outages]
    rows.append({"scenario": f"hostile input, {bad['kinds']} kinds", "ok": bad["dead_lettered"] == bad["kinds"] - 1
                 and bad["read"] == bad["accounted"], "lost": bad["read"] - bad["accounted"],
                 "duplicates": bad["duplicates_published"],
                 "detail": f"{bad['dead_lettered']} dead-lettered, {bad['duplicates_dropped']} duplicate dropped"})
    rows.append({"scenario": f"load {loaded['devices']} devices x {loaded['slots']} slots", "ok":
                 loaded["events_lost"] == 0 and loaded["duplicates_published"] == 0,
                 "lost": loaded["events_lost"], "duplicates": loaded["duplicates_published"],
                 "detail": f"peak RSS {loaded['peak_rss_mb']} MB, state {loaded['state_mb']} MB "
                           f"(bound {loaded['state_bound_mb']} MB), {loaded['seconds']} s"})
    rows += [{"scenario": d["scenario"], "ok": d["ok"], "lost": d.get("lost", 0), "duplicates": d.get("duplicated", 0),
              "detail": "; ".join(filter(None, [d.get("detail", ""), *(f"{k} {d[k]}" for k in ("published", "processed")
                                                                        if k in d),
                                                f"dead-lettered {d['dead_lettered']}" if "dead_lettered" in d else ""]))}
             for d in disordered]
    emit("fault_harness", rows, {"kill_points_survived": sum(k["equal_to_uninterrupted"] for k in kills),
                                 "kill_points": len(kills), "outages_survived": sum(not o["crashed"] for o in outages),
                                 "bad_inputs_by_kind": {k: int(bool(v)) for k, v in bad["reasons"].items()},
                                 "events_lost": sum(r["lost"] for r in rows),
                                 "duplicates_published": sum(r["duplicates"] for r in rows),
                                 "load": loaded, "outages": outages, "restarts": kills, "disorder": disordered})


if __name__ == "__main__":
    main()
