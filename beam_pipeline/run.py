"""``trustbeam run``: the job over Kafka on a local runner, as bounded catch-up cycles.

The pure-Python runners cannot run an endless source as a live stream, so a run is made of cycles.
Each cycle is one bounded Beam pipeline over the records that arrived since the last one (up to the
end offsets seen at its launch), plus what the last cycle kept:

* ``--until-end``: one cycle; every slot in the data is closed and published, then it exits.
* ``--follow``: cycles repeat every ``--poll-seconds``. A slot is published once the job's
  *progress* is the allowed lateness past the slot's end; events arriving later for it go to
  dead-letter as late. Progress is the minimum over the partitions that delivered new records of
  each one's newest event time not more than ``--max_skew_s`` past the wall clock, never moving
  back: a producer whose clock runs hours ahead neither closes slots nor makes other events late,
  and one whose clock steps back is simply late.

State between cycles lives in snapshot files beside the ledger: the valid events of the slots a
cycle still needs (the last S slots, and events stamped ahead of the progress), each device's
latest statuses, and the forgetting-weighted evidence of every slot that can no longer change
(:class:`model.scoring.EvidenceSnapshot`). So a cycle reads each record once, its work is bounded
by S slots, and its scores equal one uninterrupted run's.

The ledger (``$TRUSTBEAM_STATE_DIR/run/<group>.json``) holds per partition the offset to read
next, the last published slot, the progress, the snapshots' paths, the identity of the log it read
(topic ids and the last record read per partition: a replaced broker or a recreated topic is
detected, logged, and the job starts over on the new log; never a silent skip), and a generation
id. Semantics: records are read at least once and published at most once per (generation, slot,
owner, collaborator, model version): the ledger is saved after a cycle's publication, and a cycle
that died between the two finds its own records at the output topics' tails (by their
``trustbeam-job`` header; other producers' records are skipped) and does not send them again. One
follower per ledger: a second ``trustbeam run`` on the same group is refused while the first holds
its lock. Broker trouble (any error kafka-python marks retriable, timeouts, stalled partitions,
undelivered output) is retried with a bounded backoff until ``--retry_deadline_s`` has passed
without a successful cycle.
"""

from __future__ import annotations

import fcntl
import gc
import json
import logging
import os
import random
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from beam_pipeline.kafka_io import LogReplaced, TopicMissing, consumer, plan
from beam_pipeline.options import JobConfig
from beam_pipeline.cycle import CycleOptions, cycle_pipeline, identity
from beam_pipeline.pipeline import JOB_HEADER
from model.scoring import EvidenceSnapshot, dedup, slots_read_back, window_read
from model.status import latest_entries
from exporters.kafka_client import KafkaSettings, end_offsets, wait_until_answering
from model.config import state_dir

log = logging.getLogger(__name__)
LEDGER_FORMAT = 3
TAIL_SCAN = 2000  # records read back from an output partition's end to find this job's last one
TAIL_READ_S = 60.0  # longest a tail read may take before the cycle fails (retriably)
IDLE_CYCLE_S = 30.0  # a follower with no new records still runs a cycle this often


class LedgerError(ValueError):
    """A ledger that cannot be used: written by another version, or held by another follower."""


@dataclass
class Ledger:
    """Where the next cycle starts. Keys of the offset maps are ``topic/partition``."""

    generation: str = field(default_factory=lambda: uuid.uuid4().hex[:12])  # this job's identity in its outputs
    read_to: dict[str, int] = field(default_factory=dict)  # the next offset to read
    published_through: int = -1
    progress_ms: int = -1  # the job's progress: a slot closes when its end + the lateness lie before it
    events_snapshot: str | None = None  # Parquet: the valid events the next cycle needs from earlier ones
    status_snapshot: str | None = None  # Parquet: the statuses the next cycle needs from earlier ones
    evidence_snapshot: str | None = None  # .npz: the final evidence of the slots the next cycle does not hold
    evidence_through: int = -1  # the last slot that snapshot holds
    online_snapshot: str | None = None  # .npz: the online recalibration after the last published slot
    log: dict[str, Any] = field(default_factory=dict)  # the identity of the log read (kafka_io.Plan.identity)
    format: int = LEDGER_FORMAT

    @staticmethod
    def directory() -> Path:
        return state_dir() / "run"

    @classmethod
    def path(cls, group: str) -> Path:
        return cls.directory() / f"{group}.json"

    @classmethod
    def load(cls, group: str) -> "Ledger":
        path = cls.path(group)
        if not path.exists():
            return cls()
        body = json.loads(path.read_text())
        if body.get("format") == 2:  # before the online recalibration: it starts afresh at the next slot
            body["format"] = LEDGER_FORMAT
        if body.get("format") != LEDGER_FORMAT:
            raise LedgerError(f"{path}: a ledger of format {body.get('format', 1)!r}, written by an earlier "
                              f"trustbeam (this one writes {LEDGER_FORMAT}); move it away to start over")
        return cls(**body)

    def save(self, group: str) -> None:
        path = self.path(group)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        partial.write_text(json.dumps(asdict(self), indent=1))
        os.replace(partial, path)

    @property
    def snapshots(self) -> tuple[str | None, ...]:
        return self.events_snapshot, self.status_snapshot, self.evidence_snapshot, self.online_snapshot

    def job_id(self, group: str) -> str:
        return f"{group}@{self.generation}"


class LedgerLock:
    """An exclusive lock on a group's ledger for as long as a run uses it (``flock``: released if the holder dies)."""

    def __init__(self, group: str) -> None:
        self.path = Ledger.directory() / f"{group}.lock"
        self.group = group
        self.handle: IO[str] | None = None

    def __enter__(self) -> "LedgerLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise LedgerError(f"--group {self.group}: another `trustbeam run` (pid {holder}) is using this ledger; "
                              "stop it first, or run this one under another --group") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        self.handle = handle
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.handle is not None:
            fcntl.flock(self.handle, fcntl.LOCK_UN)
            self.handle.close()


@dataclass(frozen=True)
class CycleReport:
    published_slots: list[int]
    records_published: int
    counters: dict[str, int]
    seconds: float
    progress_ms: int = -1
    retries: int = 0  # failed attempts before this cycle succeeded
    log_replaced: bool = False  # the job started over on a new log in this cycle
    lag: dict[str, int] = field(default_factory=dict)  # topic -> records past what the cycle read, when it ended
    state_bytes: int = 0  # the ledger and the snapshots the next cycle starts from

    DEAD = ("invalid", "unknown_device", "late", "future")  # the counters' dead-letter reasons, per input

    def line(self, cycle: int) -> str:
        """One line for an operator: events read and their rate, consumer lag per topic, dead letters by reason,
        slots published, state size, time."""
        read = self.counters.get("events_read", 0)
        dead = {f"{kind}_{reason}": self.counters[f"{kind}_{reason}"] for kind in ("events", "status")
                for reason in self.DEAD if self.counters.get(f"{kind}_{reason}")}
        slots = self.published_slots
        return (f"cycle {cycle}: {read:,} events read ({read / max(self.seconds, 1e-9):,.0f}/s), "
                f"{self.counters.get('status_read', 0):,} statuses; lag "
                + (", ".join(f"{topic} {n:,}" for topic, n in sorted(self.lag.items())) or "-")
                + "; dead letters " + (", ".join(f"{k} {n:,}" for k, n in dead.items()) or "0")
                + f"; {len(slots)} slots published" + (f" ({slots[0]}..{slots[-1]})" if slots else "")
                + f", {self.records_published:,} records; state {_size(self.state_bytes)}; "
                f"{self.seconds:.1f} s" + (f"; {self.retries} retries" if self.retries else "")
                + ("; log replaced, started over" if self.log_replaced else ""))


def _size(n: int) -> str:
    """Bytes for people: ``3.0 MiB``, ``32.1 KiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n} B"


def tail_marks(settings: KafkaSettings, topics: list[str], job_id: str, model_version: str
               ) -> dict[tuple[str, int], tuple]:
    """Per output partition, the (slot, owner, collaborator) of the last record this job published with this
    model version: records of other producers, jobs or models, and values that are not JSON, are skipped."""
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
                client.seek(tp, max(ends[tp] - TAIL_SCAN, 0))
                last, deadline = None, time.monotonic() + TAIL_READ_S
                while client.position(tp) < ends[tp]:  # an empty poll is a slow broker, not the end: read on
                    if time.monotonic() > deadline:
                        raise KafkaTimeoutError(f"reading the tail of {topic}/{tp.partition} took over {TAIL_READ_S} s")
                    for record in client.poll(timeout_ms=500).get(tp, []):
                        mark = _own_mark(record, job_id, model_version)
                        last = mark if mark is not None else last
                if last is not None:
                    marks[(topic, tp.partition)] = last
    finally:
        client.close()
    return marks


def _own_mark(record: Any, job_id: str, model_version: str) -> tuple | None:
    if dict(record.headers or []).get(JOB_HEADER) != job_id.encode():
        return None
    try:
        body = json.loads(record.value)
        return identity(body) if body.get("model_version") == model_version else None
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def run_cycle(settings: KafkaSettings, config: JobConfig, ledger: Ledger, final: bool, group: str = "trustbeam-run",
              runner: str = "FnApiRunner", beam_args: list[str] | None = None, snapshot_dir: Path | None = None,
              max_batch: int = 5000, check_tails: bool = True) -> tuple[Ledger, CycleReport]:
    """One bounded pass over the topics; returns the next ledger (not yet saved) and what was done.

    Raises :class:`LogReplaced` when the log is not the one the ledger read. The snapshots the next
    cycle needs are written as new files in ``snapshot_dir`` (default: the ledgers' directory).
    ``check_tails``: read the output partitions' tails for what this job sent beyond the ledger (a cycle that
    died publishing); a follower that saved its ledger after its last cycle knows there is nothing.
    """
    started = time.perf_counter()
    topics = config.topics
    reading = plan(settings, [topics.events, topics.status], _offsets(ledger.read_to), ledger.log)
    stages, version = config.stages()
    partitions = _partition_counts(settings, [topics.scores, topics.rankings])
    marks = tail_marks(settings, [topics.scores, topics.rankings], ledger.job_id(group), version) if check_tails else {}
    work = tempfile.mkdtemp(prefix="trustbeam-cycle-")
    # every cycle builds the same graph again: its construction-time type check (which the streaming job and the
    # suite's cycles run once) would cost ~0.4 s of a ~2.4 s cycle each time
    options = CycleOptions(beam_args or [], runner=runner, pipeline_type_check=False)
    p = cycle_pipeline(options, settings, config, reading.ranges, ledger, final, partitions, marks, work,
                       ledger.job_id(group), max_batch)
    result = p.run()
    result.wait_until_finish()
    metrics = result.metrics().query()
    counters = {m.key.metric.name: m.committed for m in metrics["counters"]}
    sizes = [m.committed.max for m in metrics["distributions"] if m.key.metric.name == "shard_state_bytes"
             and m.committed.count]
    if sizes:  # the largest shard's kept state (the Beam metric that Flink and Dataflow show too)
        counters["shard_state_max_bytes"] = max(sizes)
    counters["records_lost_to_retention"] = sum(reading.lost.values())
    outcome = json.loads(Path(work, "published.json").read_text()) if Path(work, "published.json").exists() else {}
    published, progress = outcome.get("published", []), max(ledger.progress_ms, outcome.get("progress_ms", -1))
    through = max([ledger.published_through, *published])
    directory = snapshot_dir or Ledger.directory()
    evidence, evidence_through = _keep_evidence(Path(work, "evidence.npz"), directory)
    if evidence is None:  # nothing became final in this cycle: the last snapshot still holds
        evidence, evidence_through = ledger.evidence_snapshot, ledger.evidence_through
    clock = stages.config.clock
    keep_from = min(through + 1 - slots_read_back(window_read(stages), config.ranking), evidence_through + 1)
    events = _keep_events(Path(work, "events.parquet"), int(clock.start_ms(keep_from)), directory)
    statuses = _keep_statuses(Path(work, "status.parquet"), int(clock.start_ms(keep_from)), directory)
    online = _keep(Path(work, "online.npz"), directory, "online") or ledger.online_snapshot  # none: nothing published
    shutil.rmtree(work, ignore_errors=True)
    next_ledger = Ledger(ledger.generation, {f"{r.topic}/{r.partition}": r.stop for r in reading.ranges}, through,
                         progress, events, statuses, evidence, evidence_through, online, reading.identity)
    report = CycleReport(published, counters.get("published", 0), counters, round(time.perf_counter() - started, 3),
                         progress, lag=lag(settings, reading.ranges),
                         state_bytes=sum(Path(f).stat().st_size for f in next_ledger.snapshots if f))
    return next_ledger, report


def moved(settings: KafkaSettings, config: JobConfig, ledger: Ledger) -> bool:
    """Whether an input partition's end differs from where the ledger will read from (records arrived, or the log
    under it was replaced: the next cycle tells which)."""
    client = consumer(settings)
    try:
        tps = [TopicPartition(topic, p) for topic in (config.topics.events, config.topics.status)
               for p in sorted(client.partitions_for_topic(topic) or ())]
        ends = end_offsets(client, tps)
    finally:
        client.close()
    return any(ends[tp] != ledger.read_to.get(f"{tp.topic}/{tp.partition}", 0) for tp in tps)


def unread(settings: KafkaSettings, topic: str, ledger: Ledger) -> int:
    """Records of ``topic`` that the next cycle of ``ledger`` reads as new: past its offsets, or the whole
    topic where the log under it was replaced (the job starts over on the new one)."""
    try:
        ranges = plan(settings, [topic], _offsets(ledger.read_to), ledger.log).ranges
    except LogReplaced:
        ranges = plan(settings, [topic], {}).ranges
    return sum(r.stop - r.new_from for r in ranges)


def lag(settings: KafkaSettings, ranges: list[Any]) -> dict[str, int]:
    """Per topic, the records past the ends a cycle read to (what arrived while it ran)."""
    client = consumer(settings)
    try:
        ends = end_offsets(client, [TopicPartition(r.topic, r.partition) for r in ranges])
    finally:
        client.close()
    out: dict[str, int] = {}
    for r in ranges:
        out[r.topic] = out.get(r.topic, 0) + max(0, ends[TopicPartition(r.topic, r.partition)] - r.stop)
    return out


def _offsets(which: dict[str, int]) -> dict[tuple[str, int], int]:
    return {(k.rsplit("/", 1)[0], int(k.rsplit("/", 1)[1])): v for k, v in which.items()}


def _keep(path: Path, directory: Path, name: str) -> str | None:
    """A file the cycle wrote, moved to a new file in ``directory`` (None if it wrote none)."""
    if not path.exists():
        return None
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}-{uuid.uuid4().hex}{path.suffix}"
    shutil.move(str(path), target)
    return str(target)


def _keep_evidence(path: Path, directory: Path) -> tuple[str | None, int]:
    """The cycle's final evidence moved to a new file in ``directory``: (its path, the last slot it holds)."""
    target = _keep(path, directory, "evidence")
    return (None, -1) if target is None else (target, EvidenceSnapshot.load(target).folded_through)


def _keep_events(path: Path, cut_ms: int, directory: Path) -> str | None:
    """The cycle's valid events of the slots from ``cut_ms`` on (deduplicated), to a new Parquet file."""
    if not path.exists():
        return None
    table = pq.read_table(path)
    table = table.filter(pa.array(table["event_time_ms"].to_numpy() >= cut_ms))
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"events-{uuid.uuid4().hex}.parquet"
    pq.write_table(dedup(table), target)
    return str(target)


def _keep_statuses(path: Path, cut_ms: int, directory: Path) -> str | None:
    """Each device's latest status before ``cut_ms`` and all from it on, to a new Parquet file."""
    if not path.exists():
        return None
    table = pq.read_table(path)
    times, devices = table["time_ms"].to_numpy(), table["device"].to_numpy(zero_copy_only=False)
    keep = np.sort(np.concatenate([latest_entries(devices, times, times < cut_ms), np.flatnonzero(times >= cut_ms)]))
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
        raise TopicMissing(f"output topics {missing} do not exist at {settings.bootstrap} (trustbeam broker start "
                           "creates them)")
    return counts


def run(settings: KafkaSettings, config: JobConfig, group: str, follow: bool, poll_s: float = 5.0,
        max_cycles: int | None = None, runner: str = "FnApiRunner", beam_args: list[str] | None = None,
        backoff: "Backoff | None" = None, retry_deadline_s: float = 600.0,
        stop: threading.Event | None = None) -> Iterator[CycleReport]:
    """Cycles until the end (one) or forever (``follow``), saving the ledger after each, under the ledger's lock.

    A cycle that fails with a retriable error (:func:`retriable`) is retried after a bounded
    exponential backoff, until ``retry_deadline_s`` have passed since the last successful cycle (then
    the last error is raised); the ledger is only saved after a cycle succeeds, so a failed cycle is
    simply done again. The output topics' tails are read at launch and after a failed cycle only (what a cycle
    that died may have sent): after a successful one the saved ledger says all (a cycle's cost stays flat). A new ledger is saved before the first cycle, so that its generation (the job's
    identity in its outputs) survives a cycle killed while publishing; likewise the fresh ledger of
    a job that starts over on a replaced log. ``stop`` (set by a signal handler, say) ends the run after
    the cycle in flight, its ledger saved: a graceful shutdown. A follower starts its next cycle at once when the
    last one ended with records waiting on its input topics (its ``lag``); otherwise it looks every ``poll_s`` and
    runs one when records arrived, or ``IDLE_CYCLE_S`` after the last (a cycle without new records can publish
    only what the wall clock makes trusted: events stamped ahead of it that it has come to pass).
    """
    stop = stop or threading.Event()
    with LedgerLock(group):
        ledger = Ledger.load(group)
        if not Ledger.path(group).exists():
            ledger.save(group)
        backoff = backoff or Backoff()
        cycles, last_success, replaced, check_tails = 0, time.monotonic(), False, True
        while True:
            try:
                wait_until_answering(settings, timeout_s=3.0)
                next_ledger, report = run_cycle(settings, config, ledger, final=not follow, group=group,
                                                runner=runner, beam_args=beam_args, check_tails=check_tails)
            except LogReplaced as error:
                log.warning("the log under ledger %r was replaced (%s): starting over from its beginning; slots "
                            "published before stay published, the new log's are published under a new generation",
                            group, error)
                ledger, replaced, check_tails = Ledger(), True, True
                ledger.save(group)
                continue
            except Exception as error:  # noqa: BLE001 - classified below; anything else propagates
                if not retriable(error) or time.monotonic() - last_success > retry_deadline_s:
                    raise
                check_tails = True  # the failed cycle may have published part of its records
                delay = backoff.next()
                log.error("cycle failed (%s: %s); retry %d in %.1f s", type(error).__name__, _first_line(error),
                          backoff.failures, delay)
                if stop.wait(delay):
                    return
                continue
            report = CycleReport(**{**asdict(report), "retries": backoff.failures, "log_replaced": replaced})
            backoff.reset()
            replaced = check_tails = False
            previous, ledger = ledger.snapshots, next_ledger
            ledger.save(group)
            for old in set(previous) - set(ledger.snapshots) - {None}:
                Path(old).unlink(missing_ok=True)
            cycles, last_success = cycles + 1, time.monotonic()
            if follow and cycles == 1:
                freeze_long_lived()
            yield report
            if not follow or (max_cycles is not None and cycles >= max_cycles) or stop.is_set():
                return
            idle_since = time.monotonic()
            while not any(report.lag.values()):  # records waiting: the next cycle at once; else wait for some
                if stop.wait(poll_s):
                    return
                if time.monotonic() - idle_since >= IDLE_CYCLE_S or moved(settings, config, ledger):
                    break


def freeze_long_lived() -> None:
    """A follower after its first cycle: what is alive then (the modules, the model, Beam's and PyTorch's caches)
    lives as long as the process, so the garbage collector's full passes need not walk it again (each took 0.3-0.5 s,
    every two or three cycles of a 2,000-event slot). What the later cycles make is collected as before; a frozen
    object is still freed when its last reference goes (only a reference cycle among frozen objects stays)."""
    gc.collect()
    gc.freeze()


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


def retriable(error: BaseException) -> bool:
    """Whether a failure is transient broker trouble worth a retry: an error in its chain that kafka-python (or
    trustbeam) marks ``retriable``, a timeout, or a refused connection."""
    seen: BaseException | None = error
    while seen is not None:
        if getattr(seen, "retriable", False) or isinstance(seen, (TimeoutError, ConnectionError)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0][:300] if str(error).strip() else type(error).__name__
