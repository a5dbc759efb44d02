"""Ordinary disorder on the real broker: a replaced log, a producer hours ahead, foreign records at the output
tails, two followers on one ledger, a broker that stalls."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace

import pyarrow.compute as pc
import pytest

from beam_pipeline.kafka_io import PartitionStalled
from beam_pipeline.run import Ledger, LedgerError, LedgerLock, moved, retriable, run
from exporters.kafka import DeliveryError
from model.config import SlotClock
from schemas import TrustScore, to_json
from tests.pipeline_fixtures import SIM, job, run_tables, write_checkpoint
from tests.records import event
from tests.test_pipeline_kafka import assert_same, fresh_topics, offline, publish, published
from exporters.kafka_client import admin, ensure_topics, make_producer

pytestmark = pytest.mark.kafka


@pytest.fixture(autouse=True)
def own_state(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path))


def test_a_replaced_log_is_detected_and_the_job_starts_over_on_it(broker, checkpoint) -> None:
    topics = fresh_topics(broker)
    events, status = run_tables()
    publish(broker, topics, events, status)
    config = job(checkpoint, topics=topics)
    (first,) = run(broker.settings, config, "replaced", follow=False)
    assert first.published_slots and not first.log_replaced
    client = admin(broker.settings)  # the input topics deleted and created again, and a new run published
    client.delete_topics([topics.events, topics.status])
    client.close()
    time.sleep(0.5)
    ensure_topics(broker.settings, {topics.events: 8, topics.status: 4})
    later, later_status = run_tables(replace(SIM, seed=11, tasks=2 * SIM.tasks))
    publish(broker, topics, later, later_status)
    (second,) = run(broker.settings, config, "replaced", follow=False)
    assert second.log_replaced
    assert second.counters["events_read"] == later.num_rows and second.counters.get("events_replayed", 0) == 0
    assert second.published_slots == list(range(SIM.slots))  # the new log's slots, under a new generation
    assert sum(len(r) for r in published(broker, topics)) == first.records_published + second.records_published


def test_a_producer_hours_ahead_neither_closes_slots_nor_makes_others_late(broker, tmp_path) -> None:
    now_slot = int(time.time() * 1000) // SIM.clock.slot_ms
    clock = SlotClock(origin_ms=(now_slot - 12) * SIM.clock.slot_ms, slot_ms=SIM.clock.slot_ms)  # slots just past
    sim = replace(SIM, slots=12, tasks=540, clock=clock)
    events, status = run_tables(sim)
    slot = events["slot"]
    topics = fresh_topics(broker)
    config = job(write_checkpoint(tmp_path / "live-model", sim), topics=topics)
    skewed = event(event_id="skewed", owner="dev-000001", collaborator="dev-000002",
                   event_time_ms=int(time.time() * 1000) + 3 * 3_600_000)  # 3 h ahead: within --max_future_s
    publish(broker, topics, events.filter(pc.less(slot, 6)), status)
    producer = make_producer(broker.settings)
    producer.send(topics.events, key=b"dev-000001", value=to_json(skewed), timestamp_ms=skewed.event_time_ms)
    producer.flush()
    producer.close()
    (first,) = run(broker.settings, config, "skew", follow=True, poll_s=0, max_cycles=1)
    # slots 0-5 are in; a slot closes a slot after its end (lateness 1): at most 0-3, whatever the skewed event says
    assert first.published_slots and first.published_slots == list(range(len(first.published_slots)))
    assert max(first.published_slots) <= 3 and first.progress_ms < clock.end_ms(5)
    publish(broker, topics, events.filter(pc.greater_equal(slot, 6)), status.slice(0, 0))
    (second,) = run(broker.settings, config, "skew", follow=True, poll_s=0, max_cycles=1)
    assert second.published_slots == list(range(max(first.published_slots) + 1, max(second.published_slots) + 1))
    assert 8 <= max(second.published_slots) <= 9  # the ordinary events moved the progress, and nothing was late
    assert second.counters.get("events_late", 0) == 0 and first.counters.get("events_late", 0) == 0
    assert second.counters["events_valid"] + first.counters["events_valid"] == events.num_rows + 1


def test_foreign_records_at_the_output_tails_are_skipped_never_trusted(broker, checkpoint) -> None:
    topics = fresh_topics(broker)
    events, status = run_tables()
    publish(broker, topics, events, status)
    producer = make_producer(broker.settings)
    foreign = TrustScore(owner="dev-000000", collaborator="dev-000001", slot=10**6, slot_start_ms=0, slot_end_ms=1,
                         t_beh=0.5, t_res=1.0, trust=0.5, model_version="someone-else", is_update=False)
    for partition in range(8):  # another producer's records, one not even JSON, at every partition's end
        producer.send(topics.scores, key=b"x", value=b"\xffnot json", partition=partition)
        producer.send(topics.scores, key=b"x", value=to_json(foreign), partition=partition)
    producer.flush()
    producer.close()
    (report,) = run(broker.settings, job(checkpoint, topics=topics), "foreign", follow=False)
    scores, rankings = published(broker, topics, skip_foreign=True)
    assert_same((scores, rankings), offline(checkpoint, events, status))
    assert report.published_slots == list(range(SIM.slots))


def test_a_second_follower_on_a_ledger_is_refused(broker, checkpoint) -> None:
    topics = fresh_topics(broker)
    with LedgerLock("busy"):
        with pytest.raises(LedgerError, match="another `trustbeam run` .* is using this ledger"):
            next(run(broker.settings, job(checkpoint, topics=topics), "busy", follow=True, poll_s=0, max_cycles=1))
    (report,) = run(broker.settings, job(checkpoint, topics=topics), "busy", follow=False)  # free again
    assert report.counters.get("events_read", 0) == 0 and not report.published_slots


def test_a_broker_that_stalls_longer_than_a_read_is_ridden_out(tmp_path, checkpoint, monkeypatch) -> None:
    from confluent_kafka import Consumer

    import beam_pipeline.kafka_io as kafka_io
    from deploy.local.broker import LocalBroker
    from deploy.local.broker import free_port

    broker = LocalBroker(port=free_port(), state_dir=tmp_path / "stalling")
    broker.start()
    stalled = threading.Event()

    class FreezingConsumer(Consumer):
        """Freezes the broker (SIGSTOP) for 12 s, longer than a read's 10 s of patience, at the first read."""

        def consume(self, *args, **kwargs):
            if not stalled.is_set():
                pid = broker.pid()
                os.kill(pid, signal.SIGSTOP)
                stalled.set()
                threading.Timer(12.0, os.kill, (pid, signal.SIGCONT)).start()
            return super().consume(*args, **kwargs)

    try:
        topics = fresh_topics(broker)
        events, status = run_tables()
        publish(broker, topics, events, status)
        monkeypatch.setattr(kafka_io, "Consumer", FreezingConsumer)
        reports = list(run(broker.settings, job(checkpoint, topics=topics), "stall", follow=False,
                           retry_deadline_s=120))
        assert stalled.is_set() and reports[0].published_slots == list(range(SIM.slots))
        assert_same(published(broker, topics), offline(checkpoint, events, status))
    finally:
        broker.stop()


def test_retries_are_classified_by_type_not_by_message() -> None:
    from kafka.errors import KafkaTimeoutError, LeaderNotAvailableError

    for error in (PartitionStalled("x"), KafkaTimeoutError(), LeaderNotAvailableError(), DeliveryError("x"),
                  TimeoutError("x"), ConnectionRefusedError()):
        assert retriable(error), error
    wrapped = RuntimeError("bundle failed")
    wrapped.__cause__ = KafkaTimeoutError()
    assert retriable(wrapped)
    for error in (ValueError("Connection refused"), KeyError("did not answer"), RuntimeError("NodeNotReady")):
        assert not retriable(error), error  # words in a message are not a classification


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "model")


def test_each_cycle_says_what_an_operator_needs_on_one_line() -> None:
    from beam_pipeline.run import CycleReport

    report = CycleReport([4, 5, 6], 1800, {"events_read": 3000, "status_read": 40, "events_late": 2,
                                           "events_invalid": 1, "status_invalid": 0, "events_duplicate": 7},
                         seconds=2.0, retries=1, lag={"collab-events": 12, "device-status": 0},
                         state_bytes=3 * 2**20)
    assert report.line(7) == ("cycle 7: 3,000 events read (1,500/s), 40 statuses; lag collab-events 12, "
                              "device-status 0; dead letters events_invalid 1, events_late 2; 3 slots published "
                              "(4..6), 1,800 records; state 3.0 MiB; 2.0 s; 1 retries")


def test_a_cycle_reports_its_lag_and_state(broker, checkpoint) -> None:
    topics = fresh_topics(broker)
    events, status = run_tables()
    publish(broker, topics, events, status)
    (report,) = run(broker.settings, job(checkpoint, topics=topics), "lag", follow=False)
    assert report.lag == {topics.events: 0, topics.status: 0}  # nothing arrived while it ran
    assert report.counters["status_read"] > 0 and f"{report.counters['status_read']:,} statuses" in report.line(1)
    assert report.state_bytes > 1024 and "KiB" in report.line(1)  # the snapshots the next cycle starts from
    assert report.counters["shard_state_max_bytes"] > 1024  # the Beam metric of the largest shard's state


def test_an_idle_follower_runs_a_cycle_only_when_records_arrive(broker, checkpoint) -> None:
    topics = fresh_topics(broker)
    config = job(checkpoint, topics=topics)
    assert not moved(broker.settings, config, Ledger())  # empty topics, a fresh ledger: nothing to read
    events, status = run_tables()
    publish(broker, topics, events.slice(0, 10), status)
    assert moved(broker.settings, config, Ledger())
    (report,) = run(broker.settings, config, "idle", follow=True, poll_s=0, max_cycles=1)
    assert report.counters["events_read"] == 10 and not moved(broker.settings, config, Ledger.load("idle"))
    publish(broker, topics, events.slice(10, 1), status.slice(0, 0))
    assert moved(broker.settings, config, Ledger.load("idle"))


def test_sigint_stops_a_follower_after_its_cycle_with_the_ledger_saved(broker, checkpoint, tmp_path) -> None:
    import subprocess
    import sys

    from beam_pipeline.run import Ledger

    topics = fresh_topics(broker)
    events, status = run_tables()
    publish(broker, topics, events, status)
    command = [sys.executable, "-m", "trustbeam.cli", "run", "--follow", "--poll-seconds", "1", "--bootstrap",
               broker.settings.bootstrap, "--group", "graceful", f"--checkpoint={checkpoint}", "--shards=3",
               *(f"--{name}_topic={getattr(topics, name)}" for name in ("events", "status", "scores", "rankings",
                                                                        "dead_letter"))]
    follower = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = json.loads(follower.stdout.readline())  # its first cycle is done
        follower.send_signal(signal.SIGINT)
        out, err = follower.communicate(timeout=120)
    finally:
        follower.kill()
    assert follower.returncode == 0 and "SIGINT: stopping after the cycle in flight" in err
    assert first["published_slots"] and "Traceback" not in err
    assert Ledger.load("graceful").published_through == max(first["published_slots"])  # saved: a restart resumes


def test_a_ledger_from_before_the_recalibration_continues_and_an_older_one_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path))
    Ledger(published_through=7).save("old")
    body = json.loads(Ledger.path("old").read_text())
    del body["online_snapshot"]
    Ledger.path("old").write_text(json.dumps({**body, "format": 2}))
    ledger = Ledger.load("old")  # the recalibration starts afresh at the next slot
    assert (ledger.published_through, ledger.online_snapshot, ledger.format) == (7, None, 3)
    Ledger.path("old").write_text(json.dumps({**body, "format": 1}))
    with pytest.raises(LedgerError, match="a ledger of format 1, written by an earlier trustbeam"):
        Ledger.load("old")
