"""``trustbeam run``: the job over Kafka on a local runner, as bounded catch-up cycles.

The pure-Python runners cannot run an endless source as a live stream, so a run is made of cycles.
Each cycle is one bounded Beam pipeline over the topics, from the replay offsets kept in a ledger
to the end offsets seen at its launch:

* ``--until-end``: one cycle; every slot in the data is closed and published, then it exits.
* ``--follow``: cycles repeat every ``--poll-seconds``. A slot is published once the newest event
  time seen is the allowed lateness past the slot's end; events arriving later for it go to
  dead-letter as late. Each cycle replays the last S slots of events (the log is the source of
  truth) to rebuild the shards' state; statuses from before them come from a snapshot the previous
  cycle kept (each device's latest), and so does the forgetting-weighted evidence of every slot
  that can no longer change (model.scoring.EvidenceSnapshot), so a cycle's work is bounded by S
  slots, not by the log, and its scores equal one uninterrupted run's.

The ledger (``$TRUSTBEAM_STATE_DIR/run/<group>.json``) holds, per partition, the offset the next
cycle replays from and the offset below which records were already read, the last published
slot, and the status and evidence snapshots' paths. Semantics: at-least-once reading, and publication made idempotent by the ledger plus a check
of the output topics' tails at launch, so a crash between publishing and saving the ledger re-sends
nothing already on the topic.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from apache_beam.options.pipeline_options import PipelineOptions
import numpy as np
import pyarrow.parquet as pq
from kafka import TopicPartition
from kafka.errors import KafkaError

from beam_pipeline.kafka_io import consumer, plan
from beam_pipeline.options import JobConfig
from beam_pipeline.pipeline import cycle_pipeline, identity
from exporters.kafka import DeliveryError
from model.scoring import EvidenceSnapshot
from trustbeam.kafka import KafkaSettings, end_offsets, wait_until_answering
from trustbeam.state import state_dir

log = logging.getLogger(__name__)


@dataclass
class Ledger:
    """Where the next cycle starts. Keys are ``topic/partition``."""

    replay_from: dict[str, int] = field(default_factory=dict)
    read_to: dict[str, int] = field(default_factory=dict)
    published_through: int = -1
    status_snapshot: str | None = None  # Parquet of the statuses the next cycle needs from earlier ones
    evidence_snapshot: str | None = None  # .npz of the final evidence of the slots before the replay
    evidence_through: int = -1  # the last slot that snapshot holds

    @staticmethod
    def directory() -> Path:
        return state_dir() / "run"

    @classmethod
    def path(cls, group: str) -> Path:
        return cls.directory() / f"{group}.json"

    @classmethod
    def load(cls, group: str) -> "Ledger":
        path = cls.path(group)
        return cls(**json.loads(path.read_text())) if path.exists() else cls()

    def save(self, group: str) -> None:
        path = self.path(group)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(self), indent=1))
        os.replace(partial, path)

    def offsets(self, which: dict[str, int]) -> dict[tuple[str, int], int]:
        return {(k.rsplit("/", 1)[0], int(k.rsplit("/", 1)[1])): v for k, v in which.items()}


@dataclass(frozen=True)
class CycleReport:
    published_slots: list[int]
    records_published: int
    counters: dict[str, int]
    seconds: float


def tail_marks(settings: KafkaSettings, topics: list[str]) -> dict[tuple[str, int], tuple]:
    """The (slot, owner, collaborator) of the last record in each output partition."""
    client = consumer(settings)
    marks = {}
    try:
        for topic in topics:
            tps = [TopicPartition(topic, p) for p in sorted(client.partitions_for_topic(topic) or [])]
            ends = end_offsets(client, tps)
            for tp in tps:
                if not ends[tp]:
                    continue
                client.assign([tp])
                client.seek(tp, ends[tp] - 1)
                records = []
                for _ in range(20):
                    records = client.poll(timeout_ms=500).get(tp, [])
                    if records:
                        break
                if records:
                    marks[(topic, tp.partition)] = identity(json.loads(records[-1].value))
    finally:
        client.close()
    return marks


def run_cycle(settings: KafkaSettings, config: JobConfig, ledger: Ledger, final: bool,
              runner: str = "FnApiRunner", beam_args: list[str] | None = None, snapshot_dir: Path | None = None,
              max_batch: int = 5000) -> tuple[Ledger, CycleReport]:
    """One bounded pass over the topics; returns the next ledger (not yet saved) and what was done.

    The statuses the next cycle needs (each device's latest before the replay start, and all after
    it) and the final evidence (of every slot the next cycle does not replay) are written to new files
    in ``snapshot_dir`` (default: the ledgers' directory).
    """
    started = time.perf_counter()
    topics = config.topics
    ranges = plan(settings, [topics.events, topics.status], ledger.offsets(ledger.replay_from),
                  ledger.offsets(ledger.read_to))
    partitions = _partition_counts(settings, [topics.scores, topics.rankings])
    marks = tail_marks(settings, [topics.scores, topics.rankings])
    work = tempfile.mkdtemp(prefix="trustbeam-cycle-")
    options = PipelineOptions(beam_args or [], runner=runner)
    p = cycle_pipeline(options, settings, config, ranges, ledger.published_through, final, partitions, marks, work,
                       ledger.status_snapshot, ledger.evidence_snapshot, max_batch)
    result = p.run()
    result.wait_until_finish()
    counters = {m.key.metric.name: m.committed for m in result.metrics().query()["counters"]}
    published, offsets = (json.loads(Path(work, f).read_text()) if Path(work, f).exists() else []
                          for f in ("published.json", "offsets.json"))
    stages = config.stages()[0]
    through = max([ledger.published_through, *published])
    directory = snapshot_dir or Ledger.directory()
    evidence, evidence_through = _keep_evidence(Path(work, "evidence.npz"), directory)
    if evidence is None:  # nothing became final in this cycle: the last snapshot still holds
        evidence, evidence_through = ledger.evidence_snapshot, ledger.evidence_through
    keep_from = min(through + 1 - max(stages.config.window, config.ranking.owner_slots), evidence_through + 1)
    snapshot = _keep_statuses(Path(work, "status.parquet"), int(stages.config.clock.start_ms(keep_from)), directory)
    shutil.rmtree(work, ignore_errors=True)
    replay: dict[str, int] = {}
    for (topic, partition, slot), offset in offsets:
        if slot >= keep_from:
            name = f"{topic}/{partition}"
            replay[name] = min(offset, replay.get(name, offset))
    read_to = {f"{r.topic}/{r.partition}": r.stop for r in ranges}
    for r in ranges:  # events: from the replay start; statuses: only new ones (the snapshot has the rest)
        replay.setdefault(f"{r.topic}/{r.partition}", r.stop)
    next_ledger = Ledger(replay, read_to, through, snapshot, evidence, evidence_through)
    report = CycleReport(published, counters.get("published", 0), counters, round(time.perf_counter() - started, 3))
    return next_ledger, report


def _keep_evidence(path: Path, directory: Path) -> tuple[str | None, int]:
    """The cycle's final evidence moved to a new file in ``directory``: (its path, the last slot it holds)."""
    if not path.exists():
        return None, -1
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"evidence-{uuid.uuid4().hex}.npz"
    shutil.move(str(path), target)
    return str(target), EvidenceSnapshot.load(target).folded_through


def _keep_statuses(path: Path, cut_ms: int, directory: Path) -> str | None:
    """Each device's latest status before ``cut_ms`` and all from it on, to a new Parquet file."""
    if not path.exists():
        return None
    table = pq.read_table(path)
    times, devices = table["time_ms"].to_numpy(), table["device"].to_numpy(zero_copy_only=False)
    before = np.flatnonzero(times < cut_ms)
    order = before[np.lexsort((times[before], devices[before]))]
    latest = order[np.r_[devices[order][1:] != devices[order][:-1], True]] if len(order) else order
    keep = np.sort(np.concatenate([latest, np.flatnonzero(times >= cut_ms)]))
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"status-{uuid.uuid4().hex}.parquet"
    pq.write_table(table.take(keep), target)
    return str(target)


def _partition_counts(settings: KafkaSettings, topics: list[str]) -> dict[str, int]:
    client = consumer(settings)
    try:
        counts = {t: len(client.partitions_for_topic(t) or ()) for t in topics}
    finally:
        client.close()
    missing = [t for t, n in counts.items() if not n]
    if missing:
        raise KeyError(f"output topics {missing} do not exist at {settings.bootstrap} (trustbeam broker start "
                       "creates them)")
    return counts


def run(settings: KafkaSettings, config: JobConfig, group: str, follow: bool, poll_s: float = 5.0,
        max_cycles: int | None = None, runner: str = "FnApiRunner", beam_args: list[str] | None = None,
        backoff: "Backoff | None" = None) -> Iterator[CycleReport]:
    """Cycles until the end (one) or forever (``follow``), saving the ledger after each.

    In ``follow`` mode a cycle that fails because the brokers are unreachable (or its topics are gone)
    is reported and retried after a bounded exponential backoff instead of ending the run; the
    ledger is only saved after a cycle succeeds, so a failed cycle is simply done again.
    """
    ledger = Ledger.load(group)
    backoff = backoff or Backoff()
    cycles = 0
    while True:
        previous = (ledger.status_snapshot, ledger.evidence_snapshot)
        try:
            if follow:
                wait_until_answering(settings, timeout_s=3.0)
            next_ledger, report = run_cycle(settings, config, ledger, final=not follow, runner=runner,
                                            beam_args=beam_args)
        except Exception as error:  # noqa: BLE001 - classified below; anything else propagates
            if not follow or not broker_trouble(error):
                raise
            delay = backoff.next()
            log.error("cycle failed, brokers at %s unreachable or topics missing (%s); retry %d in %.1f s",
                      settings.bootstrap, _first_line(error), backoff.failures, delay)
            time.sleep(delay)
            continue
        backoff.reset()
        ledger = next_ledger
        ledger.save(group)
        for old, new in zip(previous, (ledger.status_snapshot, ledger.evidence_snapshot)):
            if old and old != new:
                Path(old).unlink(missing_ok=True)
        cycles += 1
        yield report
        if not follow or (max_cycles is not None and cycles >= max_cycles):
            return
        time.sleep(poll_s)


@dataclass
class Backoff:
    """Exponential backoff with full jitter: first ``initial_s``, doubling up to ``max_s``."""

    initial_s: float = 1.0
    max_s: float = 30.0
    failures: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next(self) -> float:
        self.failures += 1
        ceiling = min(self.max_s, self.initial_s * 2 ** (self.failures - 1))
        return ceiling / 2 + self.rng.random() * ceiling / 2

    def reset(self) -> None:
        self.failures = 0


_BROKER_TROUBLE = ("KafkaConnectionError", "NoBrokersAvailable", "KafkaTimeoutError", "did not answer",
                   "does not exist at", "do not exist at", "UnknownTopicOrPartition", "ECONNREFUSED",
                   "Connection refused", "not delivered", "undelivered", "NodeNotReady", "LeaderNotAvailable")


def broker_trouble(error: BaseException) -> bool:
    """Whether a failure comes from the brokers (unreachable, topics gone), through Beam's wrapping."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (KafkaError, TimeoutError, ConnectionError, DeliveryError)):
            return True
        if any(marker in f"{type(seen).__name__}: {seen}" for marker in _BROKER_TROUBLE):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
