"""``trustbeam demo``: the whole job on embedded defaults, from a clean machine.

1. Start the local broker (unless ``KAFKA_BOOTSTRAP``/``--bootstrap`` names one) and its topics.
2. A checkpoint: BM trained on an earlier simulated run of the paper's setting, trained once and
   cached in the state directory (the cache key is the setting and the training options).
3. A new simulated run of the same world, its clock starting at the current slot, published to
   ``collab-events`` and ``device-status`` (and written to Parquet).
4. ``trustbeam run --until-end`` over the topics: trust scores and rankings to their topics.
5. The rankings topic read back: the top collaborators of a few owners in the latest slot.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from model.config import SlotClock
from simulator.config import SimConfig

DEMO_GROUP = "demo"  # the demo job's ledger: a second demo continues its stream


def step(message: str) -> float:
    print(f"==> {message}", file=sys.stderr, flush=True)
    return time.perf_counter()


def live_config(sim: SimConfig, not_before_slot: int = 0) -> SimConfig:
    """The same world with its clock starting at the current slot, or at ``not_before_slot`` (of ``sim``'s clock)
    if that is later: a stream that goes on after the slots a job already published, never back into them."""
    clock = sim.clock
    now_slot = (int(time.time() * 1000) - clock.origin_ms) // clock.slot_ms
    first = max(now_slot, not_before_slot)
    return replace(sim, clock=SlotClock(origin_ms=clock.origin_ms + first * clock.slot_ms, slot_ms=clock.slot_ms))


def cached_checkpoint(sim: SimConfig, epochs: int, root: Path) -> Path:
    """A BM checkpoint trained on ``sim`` (default clock); trained on first use, then reused."""
    import pyarrow.parquet as pq

    from model.bm import BMConfig
    from model.checkpoint import CheckpointError, load, save
    from model.history import History
    from model.train import TrainConfig, train_bm
    from simulator.engine import Simulator
    from simulator.parquet_sink import ParquetSink

    key = hashlib.sha256(json.dumps([asdict(sim), epochs], default=str, sort_keys=True).encode()).hexdigest()[:12]
    directory = root / f"checkpoint-{key}"
    try:
        load(directory)
        return directory
    except CheckpointError:
        pass
    history_dir = root / f"history-{key}"
    Simulator(sim).run([ParquetSink(history_dir)])
    config = replace(BMConfig(), clock=sim.clock)
    history = History.from_events(pq.read_table(history_dir / "events.parquet"), config.clock, config.weights,
                                  status=pq.read_table(history_dir / "status.parquet"))
    model, _, report = train_bm(history, config, TrainConfig(epochs=epochs, patience=3), progress=True)
    save(model, history.index, directory, metadata={"demo": True, "test_rmse": report.test_rmse})
    print(f"    trained: test RMSE {report.test_rmse:.4f} on {len(report.test_slots)} held-out slots",
          file=sys.stderr)
    return directory


def latest_rankings(settings: Any, topic: str, job: str) -> list[Any]:
    """The rankings ``job`` published for its newest slot, one per owner with candidates: an owner's record of the
    highest revision (an update replaces the earlier ones; the one read last among equals). Records of other jobs
    on the same broker (another state directory's demo, a ``trustbeam run``) are left out."""
    from beam_pipeline.pipeline import JOB_HEADER
    from exporters.client import revision
    from exporters.kafka_client import read_to_end
    from schemas import CollaboratorRanking, from_json

    newest: dict[tuple[int, str], Any] = {}
    for message in read_to_end(settings, topic):
        if dict(message.headers or []).get(JOB_HEADER) != job.encode():
            continue
        ranking = from_json(CollaboratorRanking, message.value)
        held = newest.get((ranking.slot, ranking.owner))
        if held is None or revision(ranking) >= revision(held):
            newest[(ranking.slot, ranking.owner)] = ranking
    if not newest:
        return []
    last = max(slot for slot, _ in newest)
    return sorted((r for (slot, _), r in newest.items() if slot == last and r.candidates), key=lambda r: r.owner)


def run_demo(sim: SimConfig, bootstrap: str | None, out: str, epochs: int, owners: int = 5) -> int:
    from beam_pipeline.options import JobConfig
    from beam_pipeline.run import Ledger, run, unread
    from deploy.local.broker import LocalBroker
    from simulator.engine import Simulator
    from simulator.parquet_sink import ParquetSink
    from simulator.publish import KafkaPublisher
    from exporters.kafka_client import KafkaSettings, Topics, ensure_topics
    from model.config import state_dir

    timings: dict[str, float] = {}
    settings = KafkaSettings.resolve(bootstrap)
    started = step(f"broker at {settings.bootstrap}")
    if settings.is_local:
        print(f"    {LocalBroker().start()}", file=sys.stderr)
    topics = Topics()
    ensure_topics(settings, topics.partitions())

    started = step("model: BM trained on an earlier run of this world's setting (cached after the first demo)")
    checkpoint = cached_checkpoint(sim, epochs, state_dir() / "demo")
    timings["model_s"] = time.perf_counter() - started

    # a demo run again on the running broker continues the stream after the slots the last one published
    ledger = Ledger.load(DEMO_GROUP)
    live = live_config(sim, ledger.published_through + 1)
    backlog = unread(settings, topics.events, ledger)  # e.g. an earlier demo's events, under another state dir
    if backlog:
        print(f"    {backlog} events already on {topics.events} that this demo's ledger has not read: read too",
              file=sys.stderr)
    started = step(f"simulate {live.tasks} tasks of {live.devices} devices over {live.slots} slots onto Kafka")
    publisher = KafkaPublisher(settings, topics)
    summary = Simulator(live).run([publisher, ParquetSink(out)], progress=sys.stderr.isatty())
    timings["publish_s"] = time.perf_counter() - started

    started = step("trustbeam run --until-end (Beam FnApiRunner)")
    config = JobConfig(str(checkpoint))
    (report,) = run(settings, config, group=DEMO_GROUP, follow=False)
    timings["pipeline_s"] = time.perf_counter() - started

    rankings = latest_rankings(settings, topics.rankings, Ledger.load(DEMO_GROUP).job_id(DEMO_GROUP))
    if rankings:
        print(f"\nTop collaborators after slot {rankings[0].slot} (T >= the task's theta, best VoC first):")
    for ranking in rankings[:owners]:
        best = ", ".join(f"{c.collaborator} (T {c.trust:.2f}, VoC {c.voc:.2f})" for c in ranking.candidates[:3])
        print(f"  {ranking.owner} (theta {ranking.threshold:.2f}): {best}")
    c = report.counters
    result = {"events_published": publisher.counts()["events_published"], "events_read": c.get("events_read", 0),
              "events_valid": c.get("events_valid", 0), "dead_letters": c.get("dead_letters", 0),
              "slots_published": len(report.published_slots), "records_published": report.records_published,
              "timings_s": {k: round(v, 1) for k, v in timings.items()}, "bootstrap": settings.bootstrap,
              "topics": {"scores": topics.scores, "rankings": topics.rankings, "dead_letter": topics.dead_letter},
              "checkpoint": str(checkpoint), "parquet": str(Path(out).resolve()), "simulated_events": summary.events,
              "events_unread_before": backlog}
    print(json.dumps(result, indent=2))
    ok = report.published_slots and c.get("events_read", 0) == summary.events + backlog and rankings
    return 0 if ok else 1
