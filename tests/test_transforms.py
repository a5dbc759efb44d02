"""The job's transforms under a TestStream: slot close on the watermark, lateness, updates, dedup, state.

Runs on BundleBasedDirectRunner in streaming mode. Results are written out by a DoFn and checked
after the run (Beam's issue tracker reports assert_that as unreliable with state and timers on
the Python DirectRunner), and they are compared with the offline scorer on the same events.
"""

from __future__ import annotations

from dataclasses import replace

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream as Stream
from apache_beam.transforms.userstate import CombiningValueStateSpec

from beam_pipeline.kafka_io import RawBatch
from beam_pipeline.transforms import ScoreSlots
from model.recalibration import OnlineShift
from model.scoring import score_log
from schemas import CollaborationEvent, DeviceStatus, from_json, to_json
from tests.pipeline_fixtures import SIM, Keep, at, job, kept, run_tables, whole_slots, write_checkpoint

SLOT_MS = SIM.clock.slot_ms


def raw(cls, table: pa.Table, topic: str, first_offset: int = 0) -> RawBatch:
    rows = table.select([c for c in table.column_names if c != "slot"]).to_pylist()
    values = [to_json(cls(**row)) for row in rows]
    offsets = np.arange(first_offset, first_offset + len(values), dtype=np.int64)
    return RawBatch(topic, 0, offsets, np.zeros(len(values), np.int64), values, 0)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory):
    """Slots 0-2 stream in; slot 0 gets a late event inside the lateness, a duplicate, and one past it."""
    root = tmp_path_factory.mktemp("stream")
    checkpoint = write_checkpoint(root / "model")
    config = job(checkpoint)
    events, status = run_tables()
    slot = events["slot"]
    on_time = [events.filter(pc.equal(slot, s)) for s in range(3)]
    late = on_time[0].slice(0, 2)  # held back from slot 0's first batch
    on_time[0] = on_time[0].slice(2)
    clock = SIM.clock
    status = status.filter(pc.less(status["time_ms"], clock.end_ms(2)))
    t = config.topics
    stream = (Stream()
              .add_elements([("status", raw(DeviceStatus, status, t.status))], event_timestamp=at(clock.origin_ms))
              .add_elements([("events", raw(CollaborationEvent, on_time[0], t.events))])
              .advance_watermark_to(at(clock.end_ms(0)))  # slot 0 closes
              .add_elements([("events", raw(CollaborationEvent, late.slice(0, 1), t.events, 100))])
              .add_elements([("events", raw(CollaborationEvent, late.slice(0, 1), t.events, 101))])  # duplicate
              .add_elements([("events", raw(CollaborationEvent, on_time[1], t.events, 200))])
              .advance_watermark_to(at(clock.end_ms(1)))  # slot 0 updated, slot 1 closes
              .advance_watermark_to(at(clock.end_ms(1) + SLOT_MS + 5))  # slot 0's lateness is over
              .add_elements([("events", raw(CollaborationEvent, late.slice(1, 1), t.events, 300))])  # too late
              .add_elements([("events", raw(CollaborationEvent, on_time[2], t.events, 400))])
              .advance_watermark_to_infinity())
    out = root / "out"
    dead = root / "dead"
    out.mkdir()
    dead.mkdir()
    options = PipelineOptions(runner="BundleBasedDirectRunner")
    options.view_as(StandardOptions).streaming = True
    p = beam.Pipeline(options=options)
    tagged = p | stream
    inputs = tuple(tagged | f"Only {kind}" >> beam.Filter(lambda x, k=kind: x[0] == k) | f"Unwrap {kind}" >>
                   beam.Map(lambda x: x[1]) for kind in ("events", "status"))
    result = inputs | ScoreSlots(config)
    result["scores"] | "KeepScores" >> beam.ParDo(Keep(str(out)))
    result["dead"] | "KeepDead" >> beam.ParDo(Keep(str(dead)))
    p.run().wait_until_finish()
    return {"config": config, "events": on_time, "late": late, "status": status, "scores": kept(out),
            "dead": kept(dead)}


def offline(config, events: pa.Table, status: pa.Table) -> dict:
    stages, version = config.stages()
    return {r.slot: r for r in score_log(stages, events, status, config.ranking, config.params, version,
                                         online=OnlineShift.start(config.recalibration))}


def same_scores(got, want) -> None:
    key = (lambda s: (s.owner, s.collaborator))
    assert sorted(map(key, got.scores)) == sorted(map(key, want.scores))
    expected = {key(s): s.trust for s in want.scores}
    assert max(abs(s.trust - expected[key(s)]) for s in got.scores) < 1e-5


def test_each_slot_closes_once_on_the_watermark_and_late_events_update_it(scenario) -> None:
    results = whole_slots(scenario["scores"])
    assert [(r.slot, bool(r.scores) and r.scores[0].is_update) for r in results] == \
        [(0, False), (0, True), (1, False), (2, False)]
    config, events, late, status = scenario["config"], scenario["events"], scenario["late"], scenario["status"]
    first = offline(config, events[0], status)
    with_late = offline(config, pa.concat_tables([events[0], late.slice(0, 1), events[1], events[2]]), status)
    same_scores(results[0], first[0])  # before the late event
    same_scores(results[1], with_late[0])  # the update includes it
    same_scores(results[2], with_late[1])  # state across slots: slot 1 sees slot 0's updated embeddings
    same_scores(results[3], with_late[2])
    assert all(s.is_update for s in results[1].scores) and all(r.is_update for r in results[1].rankings)


def test_events_past_the_lateness_are_dead_lettered_with_the_reason(scenario) -> None:
    """(Counters are checked on FnApiRunner in the Kafka test: this runner drops some in streaming mode.)"""
    (letter,) = scenario["dead"]
    topic, _, value, headers = letter
    assert topic == scenario["config"].topics.dead_letter
    assert b"expired" in dict(headers)["reason"]
    assert from_json(CollaborationEvent, value).event_id == scenario["late"]["event_id"][1].as_py()


def test_a_bounded_re_run_rebuilds_published_slots_without_publishing_them(tmp_path) -> None:
    """--replay_through 1 over slots 0-2 (Create, batch): slots 0-1 rebuild state only, slot 2 is scored with
    their history and the recalibration the run that published them left (as the offline scorer does), and a new
    event for slot 0 is dead-lettered as late."""
    config = job(write_checkpoint(tmp_path / "model"), replay_through=1)
    events, status = run_tables()
    events = events.filter(pc.less(events["slot"], 3))
    status = status.filter(pc.less(status["time_ms"], SIM.clock.end_ms(2)))
    earlier = events.filter(pc.less(events["slot"], 2))
    stages, version = config.stages()
    online = OnlineShift.start(config.recalibration)  # what the run that published slots 0-1 left
    list(score_log(stages, earlier, status, config.ranking, config.params, version, online=online))
    online.save(tmp_path / "online.npz")
    t = config.topics
    replayed = replace(raw(CollaborationEvent, earlier, t.events), new_from=earlier.num_rows)
    new = raw(CollaborationEvent, pa.concat_tables([events.filter(pc.equal(events["slot"], 2)), earlier.slice(0, 1)]),
              t.events, earlier.num_rows)
    out, dead = tmp_path / "out", tmp_path / "dead"
    out.mkdir()
    dead.mkdir()
    with beam.Pipeline(options=PipelineOptions(runner="FnApiRunner")) as p:
        result = (p | "Events" >> beam.Create([replayed, new]), p | "Status" >> beam.Create(
            [raw(DeviceStatus, status, t.status)])) | ScoreSlots(config, kept_online=str(tmp_path / "online.npz"))
        result["scores"] | "KeepScores" >> beam.ParDo(Keep(str(out)))
        result["dead"] | "KeepDead" >> beam.ParDo(Keep(str(dead)))
    (slot_2,) = whole_slots(kept(out))
    assert slot_2.slot == 2
    same_scores(slot_2, offline(config, events, status)[2])
    (letter,) = kept(dead)
    assert b"late: slot 0 was already published" in dict(letter[3])["reason"]


@pytest.mark.parametrize("final", [False, True])
def test_the_cycle_graph_passes_beams_type_check(tmp_path, final: bool) -> None:
    """The follower builds each cycle without Beam's construction-time type check (it costs every cycle); the
    graph it builds, with kept events, statuses and evidence, is checked here instead."""
    from beam_pipeline.cycle import cycle_pipeline
    from beam_pipeline.kafka_io import PartitionRange
    from beam_pipeline.run import Ledger
    from exporters.kafka_client import KafkaSettings

    config = job(write_checkpoint(tmp_path / "model"))
    events, status = run_tables()
    pq.write_table(events, tmp_path / "events.parquet")
    pq.write_table(status, tmp_path / "status.parquet")
    ledger = Ledger(published_through=2, progress_ms=1, events_snapshot=str(tmp_path / "events.parquet"),
                    status_snapshot=str(tmp_path / "status.parquet"), evidence_snapshot=str(tmp_path / "ev.npz"))
    ranges = [PartitionRange(config.topics.events, 0, 0, 10, 5), PartitionRange(config.topics.status, 0, 0, 10, 5)]
    options = PipelineOptions(pipeline_type_check=True)
    pipeline = cycle_pipeline(options, KafkaSettings("unused:1"), config, ranges, ledger, final,
                              {config.topics.scores: 8, config.topics.rankings: 8}, {}, str(tmp_path), "job")
    assert pipeline.to_runner_api().components.transforms  # built and type-checked, never run


COUNT = CombiningValueStateSpec("count", sum)


class _Counting(beam.DoFn):
    def count(self, element, count=beam.DoFn.StateParam(COUNT)):
        count.add(1)
        yield element


class _Borrowing(beam.DoFn):
    """Stateful when an instance holds a bound method with a state parameter (of another DoFn, here)."""

    def __init__(self, stateful: bool) -> None:
        super().__init__()
        if stateful:
            self.borrowed = _Counting().count

    def process(self, element):
        yield element


def test_the_dofn_specs_remembered_are_beams_own(tmp_path) -> None:
    """Beam's lookup of a DoFn's state and timer specs is remembered (a quarter of a follower's cycle went to it):
    per class where the specs are the class's, per instance where an instance can change them."""
    from apache_beam.transforms import userstate

    from beam_pipeline.cycle import cycle_pipeline, memoized_dofn_specs
    from beam_pipeline.kafka_io import PartitionRange
    from beam_pipeline.run import Ledger
    from exporters.kafka_client import KafkaSettings

    config = job(write_checkpoint(tmp_path / "model"))
    ranges = [PartitionRange(config.topics.events, 0, 0, 10, 5), PartitionRange(config.topics.status, 0, 0, 10, 5)]
    pipeline = cycle_pipeline(PipelineOptions(), KafkaSettings("unused:1"), config, ranges, Ledger(), False,
                              {config.topics.scores: 8, config.topics.rankings: 8}, {}, str(tmp_path), "job")
    memoized_dofn_specs()  # idempotent: the cycle did it
    specs = userstate.get_dofn_specs
    introspect = specs.__wrapped__
    assert introspect.__module__ == "apache_beam.transforms.userstate"

    class DoFns(beam.pipeline.PipelineVisitor):
        fns: list = []

        def visit_transform(self, node) -> None:
            if isinstance(node.transform, beam.ParDo):
                self.fns.append(node.transform.fn)

    pipeline.visit(DoFns())
    for fn in DoFns.fns * 2:  # the second time from memory
        assert specs(fn) == introspect(fn), fn
    assert sum(userstate.is_stateful_dofn(fn) for fn in DoFns.fns) >= 3  # the shards, the gathering, publishing

    for order in ((False, True), (True, False)):  # one class, instances that differ
        assert [userstate.is_stateful_dofn(_Borrowing(stateful)) for stateful in order] == list(order)


def test_a_cycles_options_make_each_view_once_and_views_share_their_values() -> None:
    """Beam asks for a view at every transform it applies; the cycle's options make each once (as Beam's own
    views, they read and write one dict of values, in the deep copy a Pipeline takes too)."""
    import copy

    from apache_beam.options.pipeline_options import DebugOptions, TypeOptions

    from beam_pipeline.cycle import CycleOptions

    options = CycleOptions([], runner="FnApiRunner", pipeline_type_check=False)
    typed = options.view_as(TypeOptions)
    assert options.view_as(TypeOptions) is typed and not typed.pipeline_type_check
    assert options.view_as(StandardOptions).runner == "FnApiRunner"
    options.view_as(DebugOptions).experiments = ["x"]
    assert options.get_all_options()["experiments"] == ["x"]
    copied = copy.deepcopy(options)  # what beam.Pipeline keeps
    assert isinstance(copied, CycleOptions) and copied.view_as(TypeOptions) is not typed
    copied.view_as(TypeOptions).pipeline_type_check = True
    assert copied.get_all_options()["pipeline_type_check"] and not options.get_all_options()["pipeline_type_check"]
    assert copied.view_as(TypeOptions) is copied.view_as(TypeOptions)
