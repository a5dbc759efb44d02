"""The job end to end on the real local broker: simulator -> Kafka -> pipeline -> output topics.

The published scores must equal the offline scorer's (``trustbeam score``) within 1e-5 (on either
backend, torch or onnxruntime), the Parquet sink must hold what was published, bad input
must land in dead-letter with counters that add up, and catch-up cycles must neither lose a slot
nor publish one twice.
"""

from __future__ import annotations

import gc
import uuid
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from beam_pipeline.pipeline import JOB_HEADER
from beam_pipeline.run import Ledger, run, run_cycle, unread
from deploy.local.broker import LocalBroker
from exporters.onnx import export_onnx
from exporters.parquet import read_results
from model.recalibration import OnlineShift
from model.scoring import score_log
from schemas import CollaborationEvent, CollaboratorRanking, TrustScore, from_arrow, from_json, to_arrow, to_json
from simulator.publish import KafkaPublisher
from tests.pipeline_fixtures import PIECES, SIM, job, run_tables, write_checkpoint
from tests.records import event
from trustbeam.cli import main
from exporters.kafka_client import Topics, ensure_topics, make_producer, read_to_end

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("ckpt") / "model")


def fresh_topics(broker: LocalBroker) -> Topics:
    tag = uuid.uuid4().hex[:8]
    topics = Topics(*(f"{name}-{tag}" for name in ("events", "status", "scores", "rankings", "dead")))
    ensure_topics(broker.settings, topics.partitions())
    return topics


def publish(broker: LocalBroker, topics: Topics, events: pa.Table, status: pa.Table) -> None:
    publisher = KafkaPublisher(broker.settings, topics)
    publisher.write("status", status)
    publisher.write("events", events)
    publisher.close()


def published(broker: LocalBroker, topics: Topics, skip_foreign: bool = False
              ) -> tuple[list[TrustScore], list[CollaboratorRanking]]:
    """The records on the output topics (``skip_foreign``: only those a trustbeam job published)."""
    def ours(record) -> bool:
        return not skip_foreign or JOB_HEADER in dict(record.headers or [])

    scores = [from_json(TrustScore, r.value) for r in read_to_end(broker.settings, topics.scores) if ours(r)]
    rankings = [from_json(CollaboratorRanking, r.value) for r in read_to_end(broker.settings, topics.rankings)
                if ours(r)]
    return scores, rankings


def offline(checkpoint: Path, events: pa.Table, status: pa.Table, slots: set[int] | None = None
            ) -> tuple[list[TrustScore], list[CollaboratorRanking]]:
    config = job(checkpoint)
    stages, version = config.stages()
    scores, rankings = [], []
    for result in score_log(stages, events, status, config.ranking, config.params, version,
                            online=OnlineShift.start(config.recalibration)):
        if slots is None or result.slot in slots:
            scores += result.scores
            rankings += result.rankings
    return scores, rankings


def assert_same(got: tuple[list, list], expected: tuple[list, list]) -> None:
    """Same records (by owner, collaborator, slot) with values within 1e-5, each published once."""
    for got_records, expected_records in zip(got, expected):
        key = (lambda r: (r.slot, r.owner, getattr(r, "collaborator", "")))
        assert len({key(r) for r in got_records}) == len(got_records), "a record was published twice"
        by_key = {key(r): r for r in got_records}
        assert set(by_key) == {key(r) for r in expected_records}
        for want in expected_records:
            have = by_key[key(want)]
            if isinstance(want, TrustScore):
                assert have.t_beh == pytest.approx(want.t_beh, abs=1e-5)
                assert have.trust == pytest.approx(want.trust, abs=1e-5)
                assert have.t_res == want.t_res
            else:
                assert have.threshold == want.threshold
                assert [c.collaborator for c in have.candidates] == [c.collaborator for c in want.candidates]
                for a, b in zip(have.candidates, want.candidates):
                    assert (a.trust, a.voc) == pytest.approx((b.trust, b.voc), abs=1e-5)


def test_until_end_publishes_the_offline_scores_and_dead_letters_bad_input(broker, checkpoint, tmp_path) -> None:
    topics = fresh_topics(broker)
    events, status = run_tables()
    # a device the model never saw is not bad input: it is scored from the cold row and its own evidence
    newcomer = event(event_id="newcomer", owner="dev-000001", collaborator="newcomer", event_time_ms=SIM.clock.origin_ms)
    newcomer_status = status.slice(0, 1).set_column(0, status.schema.field("device"), pa.array(["newcomer"]))
    events = pa.concat_tables([events, to_arrow(CollaborationEvent, [newcomer]).append_column(
        "slot", pa.array([0], pa.int64())).cast(events.schema)])
    status = pa.concat_tables([status, newcomer_status])
    publish(broker, topics, events, status)
    origin = SIM.clock.origin_ms
    bad = [b"\x00\xffnot json", b'{"schema_version":1}',
           to_json(event(event_id="self", owner="dev-000001", collaborator="dev-000002"))
           .replace(b'"collaborator":"dev-000002"', b'"collaborator":"dev-000001"'),
           to_json(event(event_id="ancient", owner="dev-000001", collaborator="dev-000002", event_time_ms=5)),
           to_json(event(event_id="v2", event_time_ms=origin)).replace(b'"schema_version":1', b'"schema_version":2')]
    first = events.slice(0, 1).select([c for c in events.column_names if c != "slot"]).to_pylist()[0]
    duplicate = to_json(event(**first))
    producer = make_producer(broker.settings)
    for value in [*bad, duplicate]:
        producer.send(topics.events, key=b"k", value=value)
    producer.flush()
    producer.close()

    ledger, report = run_cycle(broker.settings, job(checkpoint, topics=topics), Ledger(), final=True,
                               snapshot_dir=tmp_path)

    assert_same(published(broker, topics), offline(checkpoint, events, status))
    c = report.counters
    assert c["events_read"] == events.num_rows + len(bad) + 1
    assert c["events_read"] == c["events_valid"] + c["events_invalid"] + c["events_late"] + c.get("events_future", 0)
    assert (c["events_invalid"], c["events_late"], c["events_duplicate"]) == (4, 1, 1)
    dead = read_to_end(broker.settings, topics.dead_letter)
    assert sorted(r.value for r in dead) == sorted(bad)
    reasons = {r.value: dict(r.headers)["reason"].decode() for r in dead}
    assert "before the clock's origin" in reasons[bad[3]] and "schema_version" in reasons[bad[4]]
    assert any(r.collaborator == "newcomer" for r in published(broker, topics)[0] if r.slot == 0)
    assert report.published_slots == list(range(SIM.slots)) and ledger.published_through == SIM.slots - 1
    assert report.records_published == sum(len(x) for x in published(broker, topics))

    again, second = run_cycle(broker.settings, job(checkpoint, topics=topics), ledger, final=True,
                              snapshot_dir=tmp_path)
    assert second.records_published == 0 and second.counters["events_read"] == 0


def test_catch_up_cycles_equal_one_uninterrupted_run(broker, checkpoint, tmp_path, monkeypatch) -> None:
    """Cycles replay only the last S slots (S = 6 here) and a status snapshot, yet match one offline pass. A follower
    freezes what is alive after its first cycle (the collector's full passes skip it; `freeze_long_lived`)."""
    monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path))
    gc.unfreeze()
    sim = replace(SIM, slots=15, tasks=675)
    topics = fresh_topics(broker)
    events, status = run_tables(sim)
    config = job(checkpoint, topics=topics)
    clock, previous, replayed, scored, closed = sim.clock, -1, [], 0, 0
    for last in (4, 9, 12, sim.slots - 1):  # the log grows; each cycle catches up from the saved ledger
        new_events = pc.and_(pc.greater(events["slot"], previous), pc.less_equal(events["slot"], last))
        new_status = pc.and_(pc.greater_equal(status["time_ms"], clock.start_ms(previous + 1)),
                             pc.less(status["time_ms"], clock.end_ms(last)))
        publish(broker, topics, events.filter(new_events), status.filter(new_status))
        (report,) = run(broker.settings, config, "catch-up", follow=True, poll_s=0, max_cycles=1)
        assert gc.get_freeze_count() > 0  # frozen at the follower's first cycle
        gc.unfreeze()  # this process goes on to other tests
        assert report.counters.get("events_late", 0) == 0
        replayed.append(report.counters.get("events_replayed", 0))
        scored, closed = scored + report.counters.get("slots_scored", 0), closed + len(report.published_slots)
        previous = last
    # a slot closes once the newest event is the allowed lateness (1 slot) past its end
    ledger = Ledger.load("catch-up")
    assert ledger.published_through == sim.slots - 3
    assert 0 < replayed[-1] < events.filter(pc.less_equal(events["slot"], 9)).num_rows  # bounded replay
    assert scored == PIECES.count * closed  # each slot scored once, by the cycle that closes it, never while still open
    assert len(list(tmp_path.glob("run/status-*.parquet"))) == 1 and ledger.status_snapshot
    assert_same(published(broker, topics), offline(checkpoint, events, status, set(range(sim.slots - 2))))


def test_the_onnx_backend_publishes_the_same_and_the_parquet_sink_holds_what_was_published(
        broker, checkpoint, tmp_path) -> None:
    export_onnx(checkpoint)
    topics = fresh_topics(broker)
    events, status = run_tables()
    publish(broker, topics, events, status)
    config = job(checkpoint, topics=topics, backend="onnx", parquet_out=str(tmp_path / "lake"))
    _, report = run_cycle(broker.settings, config, Ledger(), final=True, snapshot_dir=tmp_path)

    got = published(broker, topics)
    assert_same(got, offline(checkpoint, events, status))  # torch offline vs onnxruntime in the pipeline
    lake = (from_arrow(TrustScore, read_results(str(tmp_path / "lake"), "trust_scores")),
            from_arrow(CollaboratorRanking, read_results(str(tmp_path / "lake"), "collaborator_rankings")))
    for kafka_records, parquet_records in zip(got, lake):
        assert sorted(map(to_json, parquet_records)) == sorted(map(to_json, kafka_records))
    assert report.counters["parquet_files"] == 2 * SIM.slots


def test_the_portable_runner_publishes_what_the_local_runner_does(broker, checkpoint, tmp_path, monkeypatch) -> None:
    """`trustbeam run --runner PortableRunner --job_endpoint embed --environment_type LOOPBACK`: the portable
    submission path (the translation Flink receives), against FnApiRunner on the same input topics."""
    monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path))
    inputs = fresh_topics(broker)
    events, status = run_tables()
    publish(broker, inputs, events, status)
    results = {}
    for runner, extra in (("FnApiRunner", []), ("PortableRunner", ["--job_endpoint=embed",
                                                                   "--environment_type=LOOPBACK"])):
        outputs = fresh_topics(broker)
        args = ["run", "--until-end", "--runner", runner, "--bootstrap", broker.settings.bootstrap,
                "--group", f"g-{runner}", "--checkpoint", str(checkpoint), "--shards", "3",
                "--events_topic", inputs.events, "--status_topic", inputs.status, "--scores_topic", outputs.scores,
                "--rankings_topic", outputs.rankings, "--dead_letter_topic", outputs.dead_letter, *extra]
        assert main(args) == 0
        scores, rankings = published(broker, outputs)
        results[runner] = (sorted(map(to_json, scores)), sorted(map(to_json, rankings)))
        assert scores and rankings
    assert results["PortableRunner"] == results["FnApiRunner"]


def test_submission_refuses_missing_topics_by_option(broker, checkpoint, capsys) -> None:
    code = main(["run", "--until-end", "--bootstrap", broker.settings.bootstrap, "--checkpoint", str(checkpoint),
                 "--events_topic", "no-such-events"])
    assert code == 2 and "--events_topic: topic 'no-such-events'" in capsys.readouterr().err


def test_duplicated_and_reordered_events_give_the_same_outputs(broker, checkpoint, tmp_path, monkeypatch) -> None:
    """Events sent out of order (each displaced by less than the allowed lateness of one slot) and 15 % of
    them sent twice, over four catch-up cycles: the same outputs as one clean offline pass. The whole log
    replayed afterwards changes nothing (each replayed event is late, dead-lettered and counted)."""
    monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path))
    sim = replace(SIM, slots=12, tasks=540)
    topics = fresh_topics(broker)
    events, status = run_tables(sim)
    rng = np.random.default_rng(3)
    jitter = rng.uniform(0, 0.9 * sim.clock.slot_ms, events.num_rows)
    arrival = events["event_time_ms"].to_numpy() + jitter
    again = rng.random(events.num_rows) < 0.15
    redo = events["event_time_ms"].to_numpy()[again] + rng.uniform(0, 0.9 * sim.clock.slot_ms, again.sum())
    arrival = np.concatenate([arrival, redo])
    rows = np.concatenate([np.arange(events.num_rows), np.flatnonzero(again)])[np.argsort(arrival, kind="stable")]
    sent = events.take(rows)
    publish(broker, topics, events.slice(0, 0), status)
    config = job(checkpoint, topics=topics)
    chunks = np.array_split(np.arange(sent.num_rows), 4)
    duplicates = 0
    for k, chunk in enumerate(chunks):
        publish(broker, topics, sent.take(chunk), status.slice(0, 0))
        (report,) = run(broker.settings, config, "shuffled", follow=k < len(chunks) - 1, poll_s=0, max_cycles=1)
        assert report.counters.get("events_late", 0) == 0
        duplicates += report.counters.get("events_duplicate", 0)
    assert duplicates == int(again.sum())
    assert_same(published(broker, topics), offline(checkpoint, events, status))
    publish(broker, topics, events, status.slice(0, 0))  # the whole log replayed after every slot was published
    (report,) = run(broker.settings, config, "shuffled", follow=False)
    assert report.counters["events_late"] == events.num_rows and report.records_published == 0
    assert_same(published(broker, topics), offline(checkpoint, events, status))


def test_unread_counts_what_the_next_cycle_of_a_ledger_reads_as_new(broker) -> None:
    """What the demo expects besides its own events (an earlier demo's, under another state dir)."""
    topics = fresh_topics(broker)
    events, status = run_tables()
    publish(broker, topics, events, status)
    assert unread(broker.settings, topics.events, Ledger()) == events.num_rows  # a fresh ledger reads them all
    first = f"{topics.events}/0"
    on_0 = sum(1 for r in read_to_end(broker.settings, topics.events) if r.partition == 0)
    assert unread(broker.settings, topics.events, Ledger(read_to={first: on_0})) == events.num_rows - on_0
    replaced = Ledger(read_to={first: on_0 + 10}, log={"tails": {first: [on_0 + 9, 0, "0" * 16]}})  # read past its end
    assert unread(broker.settings, topics.events, replaced) == events.num_rows  # starts over on the new log
