"""The streaming job (``streaming_pipeline``) under a TestStream: out-of-order, early and late events.

The Kafka source and sink are swapped for a TestStream of raw batches and files; everything between
is the job Flink or Dataflow runs. The final publication of every slot must equal the offline twin
(``score_log`` over all the events) to 1e-6, whatever the allowed lateness; events past it go to
dead-letter with their source pointer, whether their slot is still remembered (a tombstone) or
already forgotten (the shards refuse it: a late event never triggers scoring).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream as Stream

from beam_pipeline.pipeline import JOB_HEADER, streaming_pipeline
from model.history import History
from model.recalibration import OnlineShift
from model.scoring import score_log
from schemas import CollaborationEvent, CollaboratorRanking, DeviceStatus, TrustScore, from_json
from simulator.config import Attack, AttackKind, SimConfig
from tests.pipeline_fixtures import SIM, SMALL, Keep, at, job, kept, run_tables, write_checkpoint
from tests.test_transforms import raw
from exporters.kafka_client import KafkaSettings

SLOTS = 6
SLOT_MS = SIM.clock.slot_ms


def timeline(events: pa.Table, lateness: int, rng: np.random.Generator) -> list[tuple[float, str, object]]:
    """(time, "mark"|"send", watermark ms or event rows) in order. Per slot s: its on-time events, with a few of
    slot s + 1's (early), half a slot before its end; the watermark at its end; and a few late events once
    the watermark is lateness - 1/2 slots past its end, when the slots after it have been published."""
    clock, slot = SIM.clock, events["slot"].to_numpy()
    rows = {s: rng.permutation(np.flatnonzero(slot == s)) for s in range(SLOTS)}
    early = {s: rows[s][:3] for s in range(SLOTS)}
    late = {s: rows[s][3:8] for s in range(SLOTS)}
    steps = []
    for s in range(SLOTS):
        end = float(clock.end_ms(s))
        ahead = early[s + 1] if s + 1 < SLOTS else np.zeros(0, np.int64)
        own_early = early[s] if s == 0 else np.zeros(0, np.int64)  # slot 0 has no slot before to ride with
        steps.append((end - SLOT_MS / 2, "send", np.concatenate([own_early, rows[s][8:], ahead])))
        steps.append((end, "mark", end))
        steps.append((end + (lateness - 0.5) * SLOT_MS, "mark", end + (lateness - 0.5) * SLOT_MS))
        steps.append((end + (lateness - 0.5) * SLOT_MS + 1, "send", late[s]))
    return sorted(steps, key=lambda step: (step[0], step[1] == "send"))


def run_stream(root: Path, lateness: int, extra: list | None = None, tombstone_slots: int = 64,
               reads_y: bool = True, sim: SimConfig = SIM) -> dict:
    checkpoint = write_checkpoint(root / "model", sim, reads_y=reads_y)
    config = job(checkpoint, lateness_slots=lateness, tombstone_slots=tombstone_slots)
    events, status = run_tables(sim)
    events = events.filter(pc.less(events["slot"], SLOTS))
    status = status.filter(pc.less(status["time_ms"], SIM.clock.end_ms(SLOTS)))
    steps = timeline(events, lateness, np.random.default_rng(lateness)) + (extra or [])
    t = config.topics
    stream = Stream().add_elements([("status", raw(DeviceStatus, status, t.status))],
                                   event_timestamp=at(SIM.clock.origin_ms))
    watermark, offset = -1.0, 0
    for _, action, what in steps:
        if action == "mark" and what > watermark:
            stream, watermark = stream.advance_watermark_to(at(what)), what
        elif action == "send" and len(what):
            batch = what if isinstance(what, pa.Table) else events.take(what)
            stream = stream.add_elements([("events", raw(CollaborationEvent, batch, t.events, offset))])
            offset += batch.num_rows
    stream = stream.advance_watermark_to_infinity()
    sinks = {name: root / name for name in ("scores", "rankings", "dead")}
    for directory in sinks.values():
        directory.mkdir()

    def source(p):
        tagged = p | stream
        return tuple(tagged | f"Only{kind}" >> beam.Filter(lambda x, k=kind: x[0] == k)
                     | f"Unwrap{kind}" >> beam.Map(lambda x: x[1]) for kind in ("events", "status"))

    def sink(label, topic, messages):
        name = {t.scores: "scores", t.rankings: "rankings", t.dead_letter: "dead"}[topic]
        messages | f"Keep{label}" >> beam.ParDo(Keep(str(sinks[name])))

    options = PipelineOptions(runner="BundleBasedDirectRunner")
    options.view_as(StandardOptions).streaming = True
    streaming_pipeline(options, KafkaSettings("unused:1"), config, source, sink).run().wait_until_finish()
    stages, version = config.stages()
    twin = {r.slot: r for r in score_log(stages, events, status, config.ranking, config.params, version,
                                         online=OnlineShift.start(config.recalibration))}
    return {"config": config, "events": events, "twin": twin, **{k: kept(v) for k, v in sinks.items()}}


def final(messages: list, cls) -> dict:
    """What a consumer holds at the end: per (slot, owner) the records of its newest revision (a revision replaces
    the owner's earlier records of the slot), keyed by (slot, owner, collaborator)."""
    newest: dict = {}
    for _, _, value, headers in messages:
        record = from_json(cls, value)
        assert dict(headers)[JOB_HEADER]
        revision, held = newest.get((record.slot, record.owner), (-1, []))
        if record.revision > revision:
            newest[(record.slot, record.owner)] = (record.revision, [record])
        elif record.revision == revision:
            held.append(record)
    return {(r.slot, r.owner, getattr(r, "collaborator", "")): r for _, records in newest.values() for r in records}


@pytest.mark.parametrize("lateness", [pytest.param(1, marks=pytest.mark.slow), 3])  # 2: every stream test below
def test_the_streaming_job_equals_its_offline_twin_whatever_the_lateness(tmp_path, lateness: int) -> None:
    equals_its_twin(run_stream(tmp_path, lateness))


@pytest.mark.slow  # the twins above stream a model that reads y
def test_a_model_that_reads_no_y_streams_like_its_offline_twin(tmp_path) -> None:
    result = run_stream(tmp_path, 2, reads_y=False)
    stages, _ = result["config"].stages()
    assert not stages.uses_encoder  # no slot GNN, no sequence encoder, one slot of statuses kept per device
    equals_its_twin(result)


def test_owners_reports_weighed_by_their_credibility_stream_like_the_offline_twin(tmp_path) -> None:
    """Owners report their tasks' outcomes and a fifth of them bad-mouth: each shard holds what owners reported of its
    collaborators, and every slot's scorer weighs it by the reporters' credibility as the offline twin does."""
    sim = replace(SIM, attack=Attack(AttackKind.BAD_MOUTHING, 0.2), owner_reports=1.0)
    result = run_stream(tmp_path, 2, sim=sim)
    assert result["events"]["reporter"].null_count == 0
    assert result["config"].stages()[0].config.evidence.discredited  # and reads what it does not believe alike
    equals_its_twin(result)


def test_a_sybils_ids_judged_as_one_stream_like_the_offline_twin(tmp_path) -> None:
    """A quarter of the devices answer under three ids at one place: the shards hold the ids apart, and the slot's
    scorer judges them as one collaborator (model.identity) as the offline twin does."""
    sim = replace(SIM, attack=Attack(AttackKind.SYBIL, 0.25, sybil_ids=3))
    result = run_stream(tmp_path, 2, sim=sim)
    status = run_tables(sim)[1]
    places = set(zip(status["x_m"].to_pylist(), status["y_m"].to_pylist()))
    assert len(places) < len(set(status["device"].to_pylist()))  # ids at one place
    equals_its_twin(result)


@pytest.mark.slow  # a Sybil's ids, streamed above, take the same path
@pytest.mark.parametrize("spread_m, radii", [(3.0, ("succession_m", "poor_succession_m")),
                                             (50.0, ("poor_succession_m",))])
def test_a_whitewashers_ids_one_after_another_judged_as_one_stream_like_the_offline_twin(tmp_path, spread_m: float,
                                                                                         radii: tuple) -> None:
    """A fifth of the devices whitewash, each new id reporting up to ``spread_m`` from the old one, beyond the place
    radius (3 m) or the succession radius too (50 m): every slot's scorer judges a fresh id that reports where an id
    just fell silent (model.identity.successions), or far from where an id with a poor record did
    (model.identity.poor_successions), as its continuation as the offline twin does; without ``radii`` none is."""
    sim = replace(SIM, attack=Attack(AttackKind.WHITEWASHING, 0.2, id_spread_m=spread_m))
    events, status = run_tables(sim)
    history = History.from_events(events, sim.clock, SMALL.weights, status=status)
    linked = [s for s in range(history.slots) if history.judged_together(SMALL.evidence, s) is not None]
    apart = replace(SMALL.evidence, **dict.fromkeys(radii))
    assert linked and not any(history.judged_together(apart, s) is not None for s in linked)
    result = run_stream(tmp_path, 2, sim=sim)
    equals_its_twin(result)


def test_the_task_sizes_correction_streams_like_the_offline_twin(tmp_path) -> None:
    """Tasks of many sizes and opportunistic collaborators, the model's size correction adopted: each shard keeps its
    collaborators' size evidence, and every slot's scorer reads it with the owner's latest task as the twin does."""
    sim = replace(SIM, attack=Attack(AttackKind.OPPORTUNISTIC, 0.2), task_size_spread=4.0)
    result = run_stream(tmp_path, 2, sim=sim)
    assert len(set(result["events"]["task_size_bits"].to_pylist())) > 10
    equals_its_twin(result)


def equals_its_twin(result: dict) -> None:
    """The final publication of every slot equals the offline twin's; late events came as updates, none died."""
    scores, rankings = final(result["scores"], TrustScore), final(result["rankings"], CollaboratorRanking)
    twin = result["twin"]
    want_scores = {(s.slot, s.owner, s.collaborator): s for r in twin.values() for s in r.scores}
    assert set(scores) == set(want_scores)
    assert max(abs(scores[k].t_beh - w.t_beh) for k, w in want_scores.items()) < 1e-6
    assert max(abs(scores[k].trust - w.trust) for k, w in want_scores.items()) < 1e-6
    want_rankings = {(r.slot, r.owner, ""): r for t in twin.values() for r in t.rankings}
    assert set(rankings) == set(want_rankings)
    for key, want in want_rankings.items():
        assert [c.collaborator for c in rankings[key].candidates] == [c.collaborator for c in want.candidates]
    assert any(r.revision > 0 for r in scores.values())  # the late events were published as updates
    assert not result["dead"]  # nothing was late beyond the lateness


def test_late_events_go_to_dead_letter_whether_their_slot_is_remembered_or_forgotten(tmp_path) -> None:
    events, _ = run_tables()
    slot0 = events.filter(pc.equal(events["slot"], 0))
    clock = SIM.clock

    def event(row: int, event_id: str, slot: int) -> pa.Table:
        one = slot0.slice(row, 1).set_column(0, "event_id", pa.array([event_id]))
        where = events.schema.get_field_index("event_time_ms")
        return one.set_column(where, "event_time_ms", pa.array([int(clock.start_ms(slot))]))

    # lateness 1 and a 1-slot tombstone: at end(5) + 1.5 slots, slot 5 is a tombstone and slot 0 long forgotten
    mark = float(clock.end_ms(SLOTS - 1) + 1.5 * SLOT_MS)
    extra = [(mark, "mark", mark), (mark, "send", event(0, "late-and-forgotten", 0)),
             (mark, "send", event(1, "late-but-remembered", SLOTS - 1))]
    result = run_stream(tmp_path, 1, extra=extra, tombstone_slots=1)
    reasons = {json.loads(value)["event_id"]: dict(headers)["reason"].decode() for _, _, value, headers in result["dead"]}
    assert "past the allowed lateness" in reasons["late-and-forgotten"]  # refused by the shards: never scored
    assert "expired" in reasons["late-but-remembered"]  # slot 5 is a tombstone
    for _, _, _, headers in result["dead"]:
        assert {"source_topic", "source_partition", "source_offset"} <= set(dict(headers))
    # nothing was published for slot 0 after its first publication and its in-lateness updates
    scores = final(result["scores"], TrustScore)
    twin = {(s.slot, s.owner, s.collaborator): s for r in result["twin"].values() for s in r.scores}
    assert max(abs(scores[k].trust - w.trust) for k, w in twin.items()) < 1e-6

