"""The schedulers' client: follow ``collaborator-rankings`` and ``trust-scores``, answer "the best
collaborator for owner X with this task and threshold theta" from the latest slot, with the score's age.

* **State**: per owner, one view: the ranking and trust scores of its newest publication, identified by
  (slot, revision, model version). A later slot, or a later revision of the slot (an update after late
  events), replaces the view; a record of the same slot and revision from another model version starts
  a new view too (the one read last wins): a view never mixes two publications. Records of an older
  publication, as on a replay, are ignored.
* **Answers** (:meth:`TrustClient.best`): the candidates of the owner's newest slot (its ranking and its
  trust scores) with T >= theta; the highest VoC wins, then the highest T. VoC and T are the ranking's,
  computed for the owner's latest task profile; a scheduler with a different task passes ``value`` to rate the
  candidates for it, and its task's size to read each T for that size (:func:`trust_for_size`: where the
  model's trust depends on the size, the records say how). ``age_s`` is how long ago the scored slot ended.
  Such a scheduler computes its task's VoC at each collaborator's CPU as the job read it (:meth:`TrustClient.cpu_hz`:
  a device's statuses may claim a faster CPU than the times its tasks took show). One that maximizes the value it
  expects rates each candidate by its chance of success times that VoC (:meth:`TrustClient.success`; the rankings
  list that choice for every theta at or above theirs).
* **Restarts**: :meth:`TrustClient.checkpoint` writes the state and its topic positions to a snapshot
  file (atomically), then commits those positions to the consumer group. A restarted client loads the
  snapshot and resumes from its positions, which are the group's committed offsets unless it died
  between the two steps (then the snapshot's are the consistent ones). Without a snapshot it starts at the
  records of each partition's newest ``recent_slots`` slots (:func:`recent_start`), so what a fresh client reads
  does not grow with the topics' history (None: it rebuilds from the beginning); :meth:`TrustClient.backfill` reads
  the history it skipped afterwards, for owners silent since. Re-reading a record is harmless (newest slot wins).
* **Schema versions**: records of a newer version are read with the fields this version knows
  (:func:`schemas.from_json_forward`) and counted; undecodable records are counted and skipped.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from kafka import KafkaConsumer, TopicPartition

from schemas import CollaboratorRanking, RankedCandidate, TrustScore, ValidationError, from_json_forward
from exporters.kafka_client import KafkaSettings, Topics, end_offsets

log = logging.getLogger(__name__)

Value = Callable[[Sequence[str]], np.ndarray]  # candidate ids -> VoC of the scheduler's task at each
RECENT_SLOTS = 2  # the newest slots of each partition a client without a snapshot starts from
PROBE_BYTES = 1 << 10  # what one probe of :func:`recent_start` asks a fetch for (a broker sends one batch at least)


@dataclass(frozen=True)
class Choice:
    """An answer: ``collaborator`` is None when no candidate of the newest slot reaches theta."""

    owner: str
    collaborator: str | None
    trust: float | None
    voc: float | None
    theta: float
    slot: int | None  # the scored slot the answer comes from
    age_s: float | None  # seconds since that slot ended
    model_version: str | None
    eligible: int  # candidates with T >= theta


@dataclass
class OwnerView:
    slot: int = -1
    revision: int = -1
    model_version: str = ""
    ranking: CollaboratorRanking | None = None
    scores: dict[str, TrustScore] = field(default_factory=dict)


def trust_for_size(trust: float, published_bits: float | None, task_bits: float | None, split_bits: float | None,
                   step: float | None, slope: float | None = None) -> float:
    """A published T read for a task of ``task_bits``: T + ``step`` where the task and the size the trust is for
    (``published_bits``) lie on different sides of ``split_bits`` (a version-3 record's ``size_split_bits`` and
    ``size_step``; a version-6 record's ``p_success`` reads its ``success_step`` alike), else T; from a version-2
    record, T + slope * log2(task_bits / published_bits) (its ``size_slope`` per doubling); clipped to [0, 1]; T
    itself where the record says nothing of sizes or a size is unknown. Raises ValueError naming ``task_size_bits``
    for a size that is not a positive number."""
    if task_bits is not None and not (isinstance(task_bits, Real) and not isinstance(task_bits, bool)
                                      and 0 < task_bits < np.inf):
        raise ValueError(f"task_size_bits: must be a finite number > 0 (got {task_bits!r})")
    if task_bits is None or published_bits is None:
        return trust
    if split_bits is not None and step is not None:
        moved = trust + step if (task_bits > split_bits) != (published_bits > split_bits) else trust
    elif slope is not None:
        moved = trust + slope * np.log2(task_bits / published_bits)
    else:
        return trust
    return float(np.clip(moved, 0.0, 1.0))


def probe_slot(consumer: KafkaConsumer, tp: TopicPartition, offset: int, timeout_s: float = 10.0) -> int:
    """The newest slot among the decodable records of one small fetch at ``offset`` of partition ``tp`` (the
    consumer assigned to it alone; a fetch holds at least one record batch), or -1 where there is none: the newest,
    so that an update of an older slot published among newer ones does not pass for the older slot's place."""
    consumer.seek(tp, offset)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = consumer.poll(timeout_ms=200).get(tp, [])
        if records:
            return max((record_slot(record.value) for record in records), default=-1)
    return -1


def record_slot(value: bytes) -> int:
    """A record's slot, or -1 for one that names none."""
    try:
        return int(json.loads(value)["slot"])
    except (ValueError, KeyError, TypeError):
        return -1


def recent_start(consumer: KafkaConsumer, tp: TopicPartition, begin: int, end: int, slots: int) -> int:
    """The offset of partition ``tp`` (records ``begin`` .. ``end`` - 1) where the records of its newest ``slots``
    slots begin (or up to one record batch before): the job publishes slot after slot, so a partition's slots rise
    with its offsets (an update of an older slot aside), and a binary search over them reads one small fetch per
    halving, not the partition."""
    if end - begin <= 1:
        return begin
    first = probe_slot(consumer, tp, end - 1) - slots + 1  # the oldest slot to read
    low, high = begin, end - 1
    while low < high:  # the first offset whose fetch holds a slot >= first
        middle = (low + high) // 2
        if probe_slot(consumer, tp, middle) >= first:
            high = middle
        else:
            low = middle + 1
    return low


def revision(record: TrustScore | CollaboratorRanking) -> int:
    """A record's revision; a producer that did not number them: 0 for a first publication, 1 for an update."""
    return record.revision if record.revision is not None else int(record.is_update)


class TrustClient:
    def __init__(self, settings: KafkaSettings, topics: Topics = Topics(), group: str = "trustbeam-scheduler",
                 snapshot: str | os.PathLike[str] | None = None, default_theta: float = 0.5,
                 now: Callable[[], float] = time.time, recent_slots: int | None = RECENT_SLOTS) -> None:
        if recent_slots is not None and recent_slots < 1:
            raise ValueError(f"recent_slots: must be >= 1 or None (got {recent_slots!r})")
        self.topics, self.group, self.now, self.default_theta = topics, group, now, default_theta
        self.settings, self.recent_slots = settings, recent_slots
        self.snapshot = Path(snapshot) if snapshot else None
        self.views: dict[str, OwnerView] = {}
        self.skipped: dict[TopicPartition, int] = {}  # a fresh start's history not read yet: each partition up to here
        self.from_history: set[str] = set()  # owners whose views :meth:`backfill` made
        self.counters = {"read": 0, "applied": 0, "stale": 0, "newer_version": 0, "undecodable": 0}
        self.consumer = KafkaConsumer(**settings.client_args(), group_id=group, enable_auto_commit=False,
                                      auto_offset_reset="earliest", max_partition_fetch_bytes=8 << 20)
        self.partitions = [TopicPartition(t, p) for t in (topics.rankings, topics.scores)
                           for p in sorted(self.consumer.partitions_for_topic(t) or ())]
        if not self.partitions:
            raise KeyError(f"topics {topics.rankings!r} and {topics.scores!r} do not exist at {settings.bootstrap}")
        self.consumer.assign(self.partitions)
        self.resumed_from = self._restore()

    def _restore(self) -> str:
        if self.snapshot is None or not self.snapshot.exists():
            if self.recent_slots is None:
                self.consumer.seek_to_beginning(*self.partitions)
                return "beginning"
            self.skipped = self._recent_starts()
            for tp, offset in self.skipped.items():
                self.consumer.seek(tp, offset)
            return "recent"
        saved = json.loads(self.snapshot.read_text())
        for body in saved["rankings"]:
            self._apply_ranking(CollaboratorRanking.from_dict(body))
        for body in saved["scores"]:
            self._apply_score(TrustScore.from_dict(body))
        positions = {tuple(k.rsplit("/", 1)): v for k, v in saved["positions"].items()}
        for tp in self.partitions:
            offset = positions.get((tp.topic, str(tp.partition)))
            if offset is None:
                self.consumer.seek_to_beginning(tp)
            else:
                self.consumer.seek(tp, offset)
        committed = {tp: self.consumer.committed(tp) for tp in self.partitions}
        differs = [tp for tp in self.partitions if committed[tp] is not None
                   and committed[tp] != positions.get((tp.topic, str(tp.partition)))]
        if differs:
            log.warning("group %s: committed offsets differ from the snapshot's on %d partitions; "
                        "resuming from the snapshot's", self.group, len(differs))
        return "snapshot"

    def _recent_starts(self) -> dict[TopicPartition, int]:
        """Where each partition's newest ``recent_slots`` slots begin (:func:`recent_start`), found by a consumer of
        its own that fetches little a probe."""
        probe = KafkaConsumer(**self.settings.client_args(), enable_auto_commit=False,
                              max_partition_fetch_bytes=PROBE_BYTES, fetch_max_bytes=PROBE_BYTES)
        try:
            begins, ends = probe.beginning_offsets(self.partitions), end_offsets(probe, self.partitions)
            starts = {}
            for tp in self.partitions:
                probe.assign([tp])
                starts[tp] = recent_start(probe, tp, begins[tp], ends[tp], self.recent_slots)
            return starts
        finally:
            probe.close()

    def poll(self, timeout_s: float = 1.0) -> int:
        """Read what has arrived (waiting up to ``timeout_s``); returns the records read."""
        read = 0
        for tp, records in self.consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=100_000).items():
            for record in records:
                read += 1
                self._apply(tp.topic, record.value)
        self.counters["read"] += read
        return read

    def _apply(self, topic: str, value: bytes, history: bool = False) -> None:
        """Decode and apply one record; ``history``: one :meth:`backfill` reads, published before every record the
        client's own consumer reads, so it changes no view that consumer made."""
        cls = CollaboratorRanking if topic == self.topics.rankings else TrustScore
        try:
            record, newer = from_json_forward(cls, value)
        except ValidationError as error:
            self.counters["undecodable"] += 1
            log.warning("%s: skipped an undecodable record: %s", topic, error)
            return
        self.counters["newer_version"] += newer
        if history and record.owner in self.views and record.owner not in self.from_history:
            self.counters["stale"] += 1
            return
        applied = self._apply_ranking(record) if cls is CollaboratorRanking else self._apply_score(record)
        self.counters["applied" if applied else "stale"] += 1
        if applied:
            (self.from_history.add if history else self.from_history.discard)(record.owner)

    def _view(self, record: TrustScore | CollaboratorRanking) -> OwnerView | None:
        """The owner's view the record belongs to (a new one if the record is of a newer publication), or None
        for a record of an older publication."""
        view = self.views.get(record.owner, OwnerView())
        key, held = (record.slot, revision(record)), (view.slot, view.revision)
        if key < held:
            return None
        if key > held or record.model_version != view.model_version:
            view = OwnerView(record.slot, key[1], record.model_version)
        self.views[record.owner] = view
        return view

    def _apply_ranking(self, ranking: CollaboratorRanking) -> bool:
        view = self._view(ranking)
        if view is None:
            return False
        view.ranking = ranking
        return True

    def _apply_score(self, score: TrustScore) -> bool:
        view = self._view(score)
        if view is None:
            return False
        view.scores[score.collaborator] = score
        return True

    def catch_up(self, timeout_s: float = 30.0) -> int:
        """Poll until every partition is at the end offsets seen now; returns the records read."""
        positions = {tp: self.consumer.position(tp) for tp in self.partitions}
        ends = end_offsets(self.consumer, self.partitions)  # reassigns: restore ours
        self.consumer.assign(self.partitions)
        for tp, offset in positions.items():
            self.consumer.seek(tp, offset)
        read, deadline = 0, time.monotonic() + timeout_s
        while any(self.consumer.position(tp) < ends[tp] for tp in self.partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"client {self.group}: not caught up after {timeout_s} s")
            read += self.poll(0.2)
        return read

    def backfill(self, timeout_s: float = 60.0) -> int:
        """Read the history a fresh start skipped (each partition's records before its recent start), so that owners
        silent since are known too, each from its newest publication there; returns the records read (0 after a
        snapshot or a start from the beginning, which skip nothing). An owner the client's own consumer read was
        published later than anything here, so its view stays as it is, whatever the model versions. Call it between
        polls, as :meth:`catch_up`: it reads with a consumer of its own and leaves the client's positions where they
        are; after a timeout, calling it again reads the history again from its beginning."""
        if not self.skipped:
            return 0
        reader = KafkaConsumer(**self.settings.client_args(), enable_auto_commit=False,
                               max_partition_fetch_bytes=8 << 20)
        try:
            reader.assign(list(self.skipped))
            reader.seek_to_beginning(*self.skipped)
            pending = {tp for tp, start in self.skipped.items() if reader.position(tp) < start}
            read, deadline = 0, time.monotonic() + timeout_s
            while pending:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"client {self.group}: history not read after {timeout_s} s")
                for tp, records in reader.poll(timeout_ms=200, max_records=100_000).items():
                    for record in records:
                        if record.offset < self.skipped[tp]:  # from the start on, the client's own consumer reads
                            read += 1
                            self._apply(tp.topic, record.value, history=True)
                    if reader.position(tp) >= self.skipped[tp]:
                        pending.discard(tp)
                        reader.pause(tp)
        finally:
            reader.close()
        self.counters["read"] += read
        self.skipped = {}
        return read

    def best(self, owner: str, theta: float | None = None, value: Value | None = None,
             task_size_bits: float | None = None) -> Choice:
        """The best collaborator for ``owner`` at threshold ``theta`` (default: its ranking's threshold), with each
        T read for a task of ``task_size_bits`` (default: the owner's latest, which the records are for)."""
        view = self.views.get(owner)
        ranking = view.ranking if view else None
        theta = theta if theta is not None else (ranking.threshold if ranking else self.default_theta)
        if view is None:
            return Choice(owner, None, None, None, theta, None, None, None, 0)
        trust = self.trust(owner, task_size_bits)
        voc = {candidate.collaborator: candidate.voc for candidate in (ranking.candidates if ranking else ())}
        eligible = sorted(c for c, t in trust.items() if t >= theta)
        any_record = ranking or next(iter(view.scores.values()))
        age = self.now() - any_record.slot_end_ms / 1000
        if not eligible:
            return Choice(owner, None, None, None, theta, view.slot, age, any_record.model_version, 0)
        rated = value(eligible) if value is not None else np.array([voc.get(c, -1.0) for c in eligible])
        best = max(range(len(eligible)), key=lambda k: (rated[k], trust[eligible[k]], eligible[k]))
        chosen = eligible[best]
        return Choice(owner, chosen, trust[chosen], float(rated[best]) if rated[best] >= 0 else None, theta,
                      view.slot, age, any_record.model_version, len(eligible))

    def trust(self, owner: str, task_size_bits: float | None = None) -> dict[str, float]:
        """Each candidate's T in ``owner``'s newest view (its trust scores, then its ranking's), read for a task of
        ``task_size_bits`` (default: the owner's latest, which the records are for); empty for an owner unseen."""
        return self._for_size(owner, task_size_bits, lambda r: (r.trust, r.size_step, r.size_slope))

    def success(self, owner: str, task_size_bits: float | None = None) -> dict[str, float]:
        """Each candidate's chance of success (``p_success``: P(success) x T_res) in ``owner``'s newest view, where its
        records say (version 5 on), read for a task of ``task_size_bits`` as :meth:`trust` reads T (by the records'
        ``success_step``, version 6 on; default: the owner's latest task, which the records are for): a scheduler
        that maximizes the value it expects rates each candidate with T >= theta by this times its task's VoC
        (``value`` of :meth:`best`)."""
        return self._for_size(owner, task_size_bits, lambda r: (r.p_success, r.success_step, None))

    def _for_size(self, owner: str, task_size_bits: float | None,
                  figure: Callable[[TrustScore | RankedCandidate], tuple[float | None, float | None, float | None]]
                  ) -> dict[str, float]:
        """Each candidate's ``figure`` of its record (the value, its step across the size split, a version-2 slope)
        in ``owner``'s newest view, its trust scores' then its ranking's, read for a task of ``task_size_bits``
        (:func:`trust_for_size`); candidates whose records give no value are left out."""
        view = self.views.get(owner)
        if view is None:
            return {}
        ranking = view.ranking
        records = [(c, s, s.task_size_bits, s.size_split_bits) for c, s in view.scores.items()]
        records += [(c.collaborator, c, ranking.task_size_bits, ranking.size_split_bits)
                    for c in (ranking.candidates if ranking else ())]
        out: dict[str, float] = {}
        for collaborator, record, published_bits, split_bits in records:
            value, step, slope = figure(record)
            if value is not None:
                out[collaborator] = trust_for_size(value, published_bits, task_size_bits, split_bits, step, slope)
        return out

    def cpu_hz(self, owner: str | None = None) -> dict[str, float]:
        """Each candidate's CPU frequency (Hz) as the job read it in ``owner``'s newest view, where its records say
        (version 4 on); without an owner, each collaborator's from the newest view that lists it."""
        if owner is None:
            views = sorted(self.views.values(), key=lambda v: (v.slot, v.revision))
        else:
            views = [self.views[owner]] if owner in self.views else []
        out: dict[str, float] = {}
        for view in views:  # newer views last: theirs stand
            for candidate in view.ranking.candidates if view.ranking else ():
                if candidate.cpu_hz is not None:
                    out[candidate.collaborator] = candidate.cpu_hz
            out.update({c: s.cpu_hz for c, s in view.scores.items() if s.cpu_hz is not None})
        return out

    def checkpoint(self) -> None:
        """Snapshot the state with its positions (atomically), then commit the positions to the group."""
        positions = {tp: self.consumer.position(tp) for tp in self.partitions}
        if self.snapshot is not None:
            body = {"positions": {f"{tp.topic}/{tp.partition}": p for tp, p in positions.items()},
                    "rankings": [v.ranking.to_dict() for v in self.views.values() if v.ranking],
                    "scores": [s.to_dict() for v in self.views.values() for s in v.scores.values()]}
            self.snapshot.parent.mkdir(parents=True, exist_ok=True)
            partial = self.snapshot.with_name(f".{self.snapshot.name}.partial")
            partial.write_text(json.dumps(body))
            os.replace(partial, self.snapshot)
        from kafka.structs import OffsetAndMetadata

        self.consumer.commit({tp: OffsetAndMetadata(p, "", -1) for tp, p in positions.items()})

    def close(self) -> None:
        self.consumer.close()
