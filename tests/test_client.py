"""The schedulers' client on the real broker: answers, updates, restarts and newer schema versions."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from exporters.kafka import KafkaSink, message
from schemas import CollaboratorRanking, RankedCandidate, TrustScore, to_json
from exporters.client import TrustClient, trust_for_size
from exporters.kafka_client import Topics
from tests.test_pipeline_kafka import fresh_topics

pytestmark = pytest.mark.kafka
SLOT_MS = 60_000


def slot_records(owner: str, slot: int, candidates: dict[str, tuple[float, float]], threshold: float = 0.4,
                 is_update: bool = False, revision: int | None = None, model: str = "bm-test",
                 task_size_bits: float | None = None, split_bits: float | None = None,
                 steps: dict[str, float] | None = None, cpu: dict[str, float] | None = None,
                 success: dict[str, float] | None = None, success_steps: dict[str, float] | None = None
                 ) -> list[tuple[str, object]]:
    """A ranking (candidates with T >= threshold, best VoC first) and a trust score per candidate; ``steps``: each
    candidate's change of T for a task on the other side of ``split_bits`` than ``task_size_bits`` (what the trust
    is for); ``cpu``: the CPU the job read each candidate at; ``success``: each candidate's chance of success, and
    ``success_steps`` its change for a task of the other size class."""
    common = dict(owner=owner, slot=slot, slot_start_ms=slot * SLOT_MS, slot_end_ms=(slot + 1) * SLOT_MS,
                  model_version=model, is_update=is_update, revision=revision, task_size_bits=task_size_bits,
                  size_split_bits=split_bits)
    steps, cpu, success, success_steps = steps or {}, cpu or {}, success or {}, success_steps or {}
    per_candidate = {c: dict(size_step=steps.get(c), cpu_hz=cpu.get(c), p_success=success.get(c),
                             success_step=success_steps.get(c)) for c in candidates}
    ranked = sorted(((c, t, v) for c, (t, v) in candidates.items() if t >= threshold), key=lambda x: -x[2])
    ranking = CollaboratorRanking(threshold=threshold, candidates=tuple(
        RankedCandidate(collaborator=c, trust=t, voc=v, **per_candidate[c]) for c, t, v in ranked), **common)
    scores = [TrustScore(collaborator=c, t_beh=t, t_res=1.0, trust=t, **per_candidate[c], **common)
              for c, (t, _) in candidates.items()]
    return [("rankings", ranking)] + [("scores", s) for s in scores]


def send(broker, topics: Topics, items: list[tuple[str, object]], raw: list[tuple[str, bytes]] = ()) -> None:
    sink = KafkaSink(broker.settings)
    for kind, record in items:
        sink.send(message(getattr(topics, kind), record))
    for kind, value in raw:
        sink.send((getattr(topics, kind), b"x", value, []))
    sink.close()


def test_best_follows_the_newest_slot_its_updates_and_theta(broker) -> None:
    topics = fresh_topics(broker)
    client = TrustClient(broker.settings, topics, group=f"g-{uuid.uuid4().hex[:6]}", now=lambda: 3 * 60.0 + 12)
    phases = [slot_records("a", 1, {"b": (0.9, 0.2), "c": (0.6, 0.8)}),
              slot_records("a", 2, {"b": (0.9, 0.3), "c": (0.5, 0.7), "d": (0.3, 0.9)}),
              slot_records("a", 2, {"b": (0.95, 0.3), "c": (0.45, 0.7), "d": (0.3, 0.9)}, is_update=True),
              slot_records("a", 1, {"e": (0.99, 0.99)}),  # a replayed older slot: ignored, its 2 records stale
              slot_records("z", 2, {"y": (0.2, 0.5)})]
    for phase in phases:  # each phase read before the next: the answer does not hang on topic interleaving
        send(broker, topics, phase)
        client.catch_up()
    choice = client.best("a")  # theta from the ranking: 0.4 -> c (VoC 0.7) beats b (VoC 0.3)
    assert (choice.collaborator, choice.slot, choice.theta, choice.eligible) == ("c", 2, 0.4, 2)
    assert choice.trust == pytest.approx(0.45) and choice.voc == pytest.approx(0.7)  # the update's values
    assert choice.age_s == pytest.approx(12.0) and choice.model_version == "bm-test"
    assert client.best("a", theta=0.5).collaborator == "b"
    assert client.best("a", theta=0.99).collaborator is None
    assert client.best("a", theta=0.2).collaborator == "c"  # d (0.3) is eligible but unranked: no VoC known
    assert client.best("a", theta=0.2, value=lambda ids: np.array([{"b": 0.1, "c": 0.2, "d": 0.6}[i]
                                                                    for i in ids])).collaborator == "d"
    assert client.best("z").collaborator is None and client.best("nobody").slot is None
    assert client.counters["stale"] == 2 and client.counters["undecodable"] == 0
    client.close()


def test_a_view_never_mixes_two_publications(broker) -> None:
    """Revision 2 of a slot drops revision 1's scores (b); another model's publication of the same revision
    replaces the view instead of adding to it."""
    topics = fresh_topics(broker)
    client = TrustClient(broker.settings, topics, group=f"g-{uuid.uuid4().hex[:6]}")
    for phase in (slot_records("a", 5, {"b": (0.9, 0.2), "c": (0.6, 0.8)}, is_update=True, revision=1),
                  slot_records("a", 5, {"c": (0.7, 0.8)}, is_update=True, revision=2),
                  slot_records("a", 5, {"c": (0.65, 0.8)}, is_update=True, revision=1)):  # older: stale
        send(broker, topics, phase)
        client.catch_up()
    view = client.views["a"]
    assert (view.slot, view.revision, sorted(view.scores)) == (5, 2, ["c"])
    assert client.best("a", theta=0.5).trust == pytest.approx(0.7) and client.counters["stale"] == 2
    send(broker, topics, slot_records("a", 5, {"d": (0.8, 0.5)}, is_update=True, revision=2, model="bm-next"))
    client.catch_up()
    view = client.views["a"]
    assert (view.model_version, sorted(view.scores)) == ("bm-next", ["d"])  # not c of bm-test beside it
    assert client.best("a", theta=0.5).collaborator == "d"
    client.close()


def test_newer_schema_versions_are_read_and_garbage_is_counted(broker) -> None:
    topics = fresh_topics(broker)
    (_, ranking), *_ = slot_records("a", 4, {"b": (0.8, 0.6)})
    newer = json.loads(to_json(ranking))
    newer.update(schema_version=CollaboratorRanking.SCHEMA_VERSION + 1, region="eu-west")
    newer["candidates"][0]["latency_ms"] = 12
    (_, ranking), *_ = slot_records("c", 4, {"d": (0.7, 0.5)})
    older = json.loads(to_json(ranking))  # version 1: before the task's size and how trust moves with it
    for key in ("task_size_bits", "size_split_bits"):
        older.pop(key, None)
    for key in ("size_slope", "size_step"):
        older["candidates"][0].pop(key, None)
    older["schema_version"] = 1
    send(broker, topics, [], raw=[("rankings", json.dumps(newer).encode()), ("rankings", json.dumps(older).encode()),
                                   ("rankings", b"\xff garbage"), ("scores", b'{"schema_version": 1}')])
    client = TrustClient(broker.settings, topics, group=f"g-{uuid.uuid4().hex[:6]}")
    client.catch_up()
    assert client.best("a").collaborator == "b" and client.best("c").collaborator == "d"
    assert (client.counters["newer_version"], client.counters["undecodable"], client.counters["read"]) == (1, 2, 4)
    client.close()


def test_a_schedulers_task_size_moves_the_trust_it_reads(broker) -> None:
    """Records for a 1 Mbit task, small beside the 2-Mbit split, whose trust falls by 0.2 at b and not at c for a
    large task: for a 4 Mbit task b's T is 0.9 - 0.2 = 0.7, below theta 0.75, so c answers; for a 0.5 Mbit one, small
    too, b's T stays 0.9, and b (VoC 0.6) beats c (VoC 0.5). Without a size, the records' own task."""
    topics = fresh_topics(broker)
    send(broker, topics, slot_records("a", 3, {"b": (0.9, 0.6), "c": (0.8, 0.5)}, task_size_bits=1e6,
                                      split_bits=2e6, steps={"b": -0.2, "c": 0.0}))
    client = TrustClient(broker.settings, topics, group=f"g-{uuid.uuid4().hex[:6]}")
    client.catch_up()
    large, small = (client.best("a", theta=0.75, task_size_bits=bits) for bits in (4e6, 5e5))
    assert (large.collaborator, large.trust, large.eligible) == ("c", pytest.approx(0.8), 1)
    assert (small.collaborator, small.trust, small.eligible) == ("b", pytest.approx(0.9), 2)
    assert client.best("a", theta=0.75).trust == pytest.approx(0.9)
    for bad in (0.0, -1e6, float("nan")):
        with pytest.raises(ValueError, match="task_size_bits: must be a finite number > 0"):
            client.best("a", theta=0.75, task_size_bits=bad)
    client.close()


def test_a_scheduler_reads_the_cpus_the_job_read(broker) -> None:
    """Each candidate's CPU as the records give it, in an owner's newest view (b of the ranking and its score, d of a
    score alone; c's records say none); across owners, the newest view that lists a collaborator wins."""
    topics = fresh_topics(broker)
    send(broker, topics, slot_records("a", 3, {"b": (0.9, 0.6), "c": (0.8, 0.5), "d": (0.2, 0.9)},
                                      cpu={"b": 2.1e9, "d": 6e9}))
    send(broker, topics, slot_records("z", 4, {"b": (0.7, 0.6)}, cpu={"b": 1.9e9}))
    send(broker, topics, slot_records("y", 2, {"d": (0.7, 0.6)}, cpu={"d": 4e9}))
    client = TrustClient(broker.settings, topics, group=f"g-{uuid.uuid4().hex[:6]}")
    client.catch_up()
    assert client.cpu_hz("a") == {"b": 2.1e9, "d": 6e9} and client.cpu_hz("z") == {"b": 1.9e9}
    assert client.cpu_hz() == {"b": 1.9e9, "d": 6e9} and client.cpu_hz("nobody") == {}
    client.close()


def test_a_scheduler_that_maximizes_the_value_it_expects_reads_each_chance_of_success(broker) -> None:
    """b and c both reach theta 0.5; by VoC b wins (0.8 > 0.7), by T x VoC too (0.72 > 0.42), by the chance of success
    x VoC c does (0.55 x 0.7 = 0.385 > 0.3 x 0.8 = 0.24): b's trust rests on transmissions whose computations fail.
    d, below theta, and e, whose records say no chance, are never rated by it. The records are for a 1 Mbit task,
    small beside the 2-Mbit split: for a 4 Mbit task b's chance is 0.3 + 0.35 and c's 0.55 - 0.3 (their success_step;
    d's record says none, so its chance stands), and b wins again (0.65 x 0.8 = 0.52 > 0.25 x 0.7 = 0.175)."""
    topics = fresh_topics(broker)
    send(broker, topics, slot_records("a", 3, {"b": (0.9, 0.8), "c": (0.6, 0.7), "d": (0.3, 0.9), "e": (0.55, 0.1)},
                                      threshold=0.5, success={"b": 0.3, "c": 0.55, "d": 0.2}, task_size_bits=1e6,
                                      split_bits=2e6, success_steps={"b": 0.35, "c": -0.3}))
    client = TrustClient(broker.settings, topics, group=f"g-{uuid.uuid4().hex[:6]}")
    client.catch_up()
    assert client.success("a") == {"b": 0.3, "c": 0.55, "d": 0.2} and client.success("nobody") == {}
    assert client.success("a", 1.5e6) == client.success("a")  # the same size class
    assert client.success("a", 4e6) == pytest.approx({"b": 0.65, "c": 0.25, "d": 0.2})
    voc = {"b": 0.8, "c": 0.7, "d": 0.9, "e": 0.1}

    def value(chance: dict[str, float]):
        return lambda eligible: np.array([chance[c] * voc[c] if c in chance else -1.0 for c in eligible])

    choice = client.best("a", theta=0.5, value=value(client.success("a")))
    assert (choice.collaborator, choice.eligible) == ("c", 3) and choice.voc == pytest.approx(0.385)
    assert client.best("a", theta=0.5).collaborator == "b"
    large = client.best("a", theta=0.5, value=value(client.success("a", 4e6)), task_size_bits=4e6)
    assert large.collaborator == "b" and large.voc == pytest.approx(0.52)
    client.close()


def test_trust_for_a_size_by_hand_from_version_3_and_version_2_records() -> None:
    """Version 3: T moves by the step only across the split (either way); version 2: by the slope per doubling;
    clipped to [0, 1]; T itself where the record or the scheduler names no size."""
    assert trust_for_size(0.9, 1e6, 4e6, 2e6, -0.2) == pytest.approx(0.7)  # small -> large
    assert trust_for_size(0.7, 4e6, 1e6, 2e6, 0.2) == pytest.approx(0.9)  # large -> small
    assert trust_for_size(0.9, 1e6, 1.5e6, 2e6, -0.2) == 0.9  # the same class
    assert trust_for_size(0.9, 1e6, 4e6, None, None, -0.1) == pytest.approx(0.7)  # two doublings of a v2 slope
    assert trust_for_size(0.95, 4e6, 1e6, 2e6, 0.2) == 1.0  # clipped
    assert trust_for_size(0.9, None, 4e6, 2e6, -0.2) == trust_for_size(0.9, 1e6, None, 2e6, -0.2) == 0.9
    assert trust_for_size(0.9, 1e6, 4e6, None, None) == 0.9  # the model's trust ignores the size


def test_a_restarted_client_resumes_from_its_snapshot_and_committed_offsets(broker, tmp_path) -> None:
    topics = fresh_topics(broker)
    group, snapshot = f"g-{uuid.uuid4().hex[:6]}", tmp_path / "client.json"
    first = slot_records("a", 1, {"b": (0.9, 0.2)}) + slot_records("q", 1, {"r": (0.7, 0.4)})
    send(broker, topics, first)
    client = TrustClient(broker.settings, topics, group=group, snapshot=snapshot)
    assert client.resumed_from == "recent" and client.catch_up() == len(first)
    client.checkpoint()
    committed = {tp: client.consumer.committed(tp) for tp in client.partitions}
    client.close()
    assert sum(committed.values()) == len(first)

    later = slot_records("a", 2, {"c": (0.8, 0.9)})
    send(broker, topics, later)
    again = TrustClient(broker.settings, topics, group=group, snapshot=snapshot)
    assert again.resumed_from == "snapshot" and again.catch_up() == len(later)  # nothing read twice
    assert again.best("a").collaborator == "c" and again.best("q").collaborator == "r"  # q from the snapshot
    again.close()

    cold = TrustClient(broker.settings, topics, group=group)  # no snapshot: rebuilt from the newest two slots
    assert cold.catch_up() == len(first) + len(later) and cold.best("q").collaborator == "r"
    cold.close()


def test_a_fresh_client_reads_the_newest_slots_not_the_history(broker) -> None:
    """Without a snapshot a client starts where each partition's newest slots begin: it reads those slots' records
    and answers as a client that read everything does, but for an owner silent for longer (known only to the
    latter, from an old slot) until it reads the history it skipped (``backfill``)."""
    topics = fresh_topics(broker)
    owners = [f"o{k}" for k in range(6)]

    def candidates(slot: int, k: int) -> dict[str, tuple[float, float]]:  # (T, VoC) of two collaborators
        return {f"c{(slot + k) % 5}": (0.5 + 0.04 * k, 0.1 * (slot % 10)), f"c{(slot + k + 1) % 5}": (0.8, 0.5)}

    slots = [[record for k, owner in enumerate(owners) for record in slot_records(owner, slot, candidates(slot, k))]
             for slot in range(1, 13)]
    for slot, records in enumerate(slots, start=1):
        send(broker, topics, records + (slot_records("old", slot, {"c9": (0.9, 0.9)}) if slot <= 3 else []))
    full, fresh = (TrustClient(broker.settings, topics, group=f"g-{uuid.uuid4().hex[:6]}", now=lambda: 13 * 60.0,
                               recent_slots=window) for window in (None, 2))
    everything, recent = full.catch_up(), fresh.catch_up()
    assert full.resumed_from == "beginning" and fresh.resumed_from == "recent"
    newest = len(slots[-1]) + len(slots[-2])  # and at most a record batch of the slot before them
    assert newest <= recent <= newest + len(slots[-3]) and 3 * recent < everything
    for owner in owners:
        assert fresh.best(owner, theta=0.5) == full.best(owner, theta=0.5) and fresh.views[owner].slot == 12
    assert full.best("old").collaborator == "c9" and fresh.best("old").collaborator is None
    assert full.backfill() == 0  # it skipped nothing
    views = {owner: fresh.views[owner] for owner in owners}
    with pytest.raises(TimeoutError, match="history not read"):
        fresh.backfill(timeout_s=0)
    history = fresh.backfill()  # what the fresh start skipped, afterwards: the silent owner is known too
    assert history + recent == everything and fresh.backfill() == 0  # every record once, by one or the other
    assert fresh.best("old") == full.best("old") and fresh.views["old"].slot == 3
    assert all(fresh.views[owner] is views[owner] for owner in owners)  # the newer publications stay as they were
    fresh.poll(0.5)
    assert fresh.catch_up() == 0  # the client's own positions did not move
    with pytest.raises(ValueError, match="recent_slots"):
        TrustClient(broker.settings, topics, recent_slots=0)
    full.close()
    fresh.close()


def test_the_demo_shows_its_own_jobs_newest_slot_one_ranking_per_owner(broker) -> None:
    from beam_pipeline.pipeline import JOB_HEADER
    from trustbeam.demo import latest_rankings

    topics = fresh_topics(broker)
    sink = KafkaSink(broker.settings)
    published = [("demo@1", slot_records("a", 3, {"b": (0.9, 0.2)})),
                 ("demo@1", slot_records("a", 3, {"c": (0.8, 0.5)}, is_update=True, revision=2)),
                 ("demo@1", slot_records("a", 3, {"d": (0.7, 0.5)}, is_update=True, revision=1)),  # older, read later
                 ("demo@1", slot_records("e", 3, {"f": (0.6, 0.4)})),
                 ("demo@1", slot_records("g", 3, {"h": (0.1, 0.4)})),  # nothing reaches theta: not shown
                 ("demo@1", slot_records("a", 2, {"b": (0.9, 0.9)})),
                 ("other@7", slot_records("a", 3, {"x": (0.99, 0.99)})),  # another job on the broker
                 ("other@7", slot_records("a", 4, {"x": (0.99, 0.99)}))]
    for job, items in published:
        for kind, record in items:
            if kind == "rankings":
                topic, key, value, headers = message(topics.rankings, record)
                sink.send((topic, key, value, [*headers, (JOB_HEADER, job.encode())]))
    sink.close()
    shown = latest_rankings(broker.settings, topics.rankings, "demo@1")
    assert [(r.owner, r.slot, r.revision, [c.collaborator for c in r.candidates]) for r in shown] == \
        [("a", 3, 2, ["c"]), ("e", 3, None, ["f"])]
    assert latest_rankings(broker.settings, topics.rankings, "nobody@0") == []
