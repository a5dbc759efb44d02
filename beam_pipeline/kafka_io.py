"""Kafka I/O for the local runners: a source of raw record batches, and the producer sink.

Beam 2.77's ReadFromKafka/WriteToKafka are cross-language (Java); the jars
cannot be fetched on the development machine, so local runs use this source:

* :func:`plan` fixes, per partition, the offset range of one run: from where the
  last run stopped (or the beginning) to the end offsets seen at launch, and
  checks that the log is the one the last run read (topic ids, the last record
  read), so a replaced broker or a recreated topic is detected, never skipped.
* :class:`ReadRanges` reads a group of those ranges with one librdkafka consumer (confluent-kafka), so
  the partitions are fetched concurrently and decoded in C while Python parses (kafka-python reads
  one assigned partition at a time and decodes in Python: the source ran at 0.3 x raw consumption).
  It emits :class:`RawBatch` elements of up to ``max_batch`` records of one partition, not one
  element per record. Offsets may have gaps (transaction markers, compacted records): the consumer
  reads committed data only (``read_committed``), and a range ends where a record or the end of the
  log reaches its end, whatever offsets lie in between. A group whose records stop coming below
  its planned ends raises :class:`PartitionStalled`, which is retriable. The cycles are bounded:
  event-time progress is what the parse step reports per partition (:func:`trusted_progress`), so a
  record stamped more than ``max_skew_s`` past the wall clock never moves it.
* :class:`ProduceRecords` sends batches of (topic, key, value, headers) tuples through the Kafka sink of
  :mod:`exporters.kafka`; delivery failures are counted and raised, never swallowed.

``--kafka_io=xlang`` swaps in Beam's Java KafkaIO on Flink/Dataflow (see
:mod:`beam_pipeline.pipeline`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as ConfluentPartition
from kafka import KafkaConsumer, TopicPartition

from beam_pipeline.options import MAX_AHEAD_MS, MAX_SKEW_MS
from exporters.kafka import KafkaSink, Message
from exporters.kafka_client import KafkaSettings, end_offsets

log = logging.getLogger(__name__)

POLL_MS = 500
IDLE_POLLS = 20  # consecutive empty polls before a partition below its planned end is reported stuck


class PartitionStalled(RuntimeError):
    """A partition delivers nothing below its planned end: the broker stalls (or lost data). Retriable."""

    retriable = True


@dataclass(frozen=True)
class PartitionRange:
    topic: str
    partition: int
    start: int  # first offset to read
    stop: int  # end offset seen at launch (exclusive)
    new_from: int  # offsets below this were read by an earlier run (replayed for state only)


@dataclass(frozen=True)
class RawBatch:
    """Consecutive records of one partition: offsets, Kafka timestamps (ms) and values."""

    topic: str
    partition: int
    offsets: np.ndarray  # (n,) int64
    timestamps: np.ndarray  # (n,) int64 ms
    values: list[bytes]
    new_from: int


def consumer(settings: KafkaSettings, **overrides: Any) -> KafkaConsumer:
    return KafkaConsumer(**{**settings.client_args(), "enable_auto_commit": False, "group_id": None,
                            "isolation_level": "read_committed", "max_partition_fetch_bytes": 8 << 20,
                            "fetch_max_bytes": 64 << 20, **overrides})


def trusted_progress(stamps: np.ndarray, now_ms: float, max_skew_ms: float) -> int | None:
    """The newest timestamp that is not more than ``max_skew_ms`` past ``now_ms`` (None when there is none)."""
    trusted = stamps[stamps <= now_ms + max_skew_ms]
    return int(trusted.max()) if len(trusted) else None


class TopicMissing(KeyError):
    """A topic the job reads or writes does not exist (a restarted memory broker recreates them). Retriable."""

    retriable = True


class LogReplaced(RuntimeError):
    """The log under a ledger is not the one it read: a new broker, or a topic deleted and created again."""


def fingerprint(record: Any) -> list:
    """[offset, timestamp, digest of the value] of a record: what identifies it in its log."""
    return [int(record.offset), int(record.timestamp), hashlib.sha256(record.value or b"").hexdigest()[:16]]


def records_at(client: KafkaConsumer, wanted: dict[TopicPartition, int], polls: int = 20) -> dict[TopicPartition, Any]:
    """The record at each partition's offset in ``wanted``, or None where there is none (deleted, compacted, never
    written): every partition assigned and fetched together (one round trip for all, not one each)."""
    found: dict[TopicPartition, Any] = {}
    if not wanted:
        return found
    client.assign(list(wanted))
    for tp, offset in wanted.items():
        client.seek(tp, offset)
    for _ in range(polls):
        for tp, records in client.poll(timeout_ms=POLL_MS).items():
            if tp in wanted and tp not in found and records:
                found[tp] = records[0] if records[0].offset == wanted[tp] else None
                client.seek_to_end(tp)  # the rest of it unread (pausing it instead left its fetched data blocking the others')
        for tp, offset in wanted.items():
            if tp not in found and client.position(tp) > offset:
                found[tp] = None
        if len(found) == len(wanted):
            break
    return {tp: found.get(tp) for tp in wanted}


def topic_ids(client: KafkaConsumer) -> dict[str, str]:
    """The brokers' topic ids (Kafka 2.8+ metadata; a recreated topic gets a new one), where reported."""
    ids = getattr(client._client.cluster, "_topic_ids", None) or {}  # kafka-python keeps them from Metadata v10+
    return {topic: str(value) for topic, value in ids.items() if value}


@dataclass(frozen=True)
class Plan:
    """One run's reading: the ranges, the log's identity as read, and the records retention deleted unread."""

    ranges: list[PartitionRange]
    identity: dict[str, Any]  # {"topic_ids": {topic: id}, "tails": {"topic/partition": fingerprint}}
    lost: dict[str, int]  # "topic/partition" -> records deleted by retention before they were read


def plan(settings: KafkaSettings, topics: list[str], start: dict[tuple[str, int], int],
         identity: dict[str, Any] | None = None) -> Plan:
    """Offset ranges of every partition of ``topics``: from ``start`` (else the beginning) to the end now.

    ``identity`` is what an earlier plan read (:attr:`Plan.identity`): a topic whose id changed, or a
    partition whose last read record is gone or different, raises :class:`LogReplaced`, never a
    silent skip. Records that retention deleted before they were read are logged and counted.
    """
    client = consumer(settings, fetch_max_wait_ms=20)  # records at known offsets: no waiting for more
    try:
        partitions = []
        for topic in topics:
            numbers = client.partitions_for_topic(topic)
            if not numbers:
                raise TopicMissing(f"topic {topic!r} does not exist at {settings.bootstrap}")
            partitions += [TopicPartition(topic, p) for p in sorted(numbers)]
        ids = {t: i for t, i in topic_ids(client).items() if t in topics}
        begin, end = client.beginning_offsets(partitions), end_offsets(client, partitions)
        _verify(client, identity or {}, ids, begin, end)
        last = records_at(client, {tp: end[tp] - 1 for tp in partitions if end[tp]})
        tails = {f"{tp.topic}/{tp.partition}": fingerprint(record) for tp, record in last.items() if record is not None}
    finally:
        client.close()
    ranges, lost = [], {}
    for tp in partitions:
        first = start.get((tp.topic, tp.partition), begin[tp])
        if first < begin[tp]:
            lost[f"{tp.topic}/{tp.partition}"] = begin[tp] - first
            log.warning("%s/%d: retention deleted offsets %d..%d before they were read (%d records lost)",
                        tp.topic, tp.partition, first, begin[tp] - 1, begin[tp] - first)
            first = begin[tp]
        ranges.append(PartitionRange(tp.topic, tp.partition, min(first, end[tp]), end[tp], min(first, end[tp])))
    return Plan(ranges, {"topic_ids": ids, "tails": tails}, lost)


def _verify(client: KafkaConsumer, identity: dict[str, Any], ids: dict[str, str], begin: dict, end: dict) -> None:
    """Raise LogReplaced where the log differs from the one ``identity`` describes."""
    for topic, known in identity.get("topic_ids", {}).items():
        if topic in ids and ids[topic] != known:
            raise LogReplaced(f"topic {topic!r} was deleted and created again (id {known} is now {ids[topic]})")
    checked = {}
    for name, (offset, timestamp, digest) in identity.get("tails", {}).items():
        topic, partition = name.rsplit("/", 1)
        tp = TopicPartition(topic, int(partition))
        if tp not in end:
            continue
        if end[tp] <= offset:
            raise LogReplaced(f"{name} ends at offset {end[tp]}, below offset {offset} that was read (a new broker "
                              "or a recreated topic)")
        if offset < begin[tp]:
            log.warning("%s: retention deleted the last record read (offset %d); the log's identity is not "
                        "checked past it", name, offset)
            continue
        checked[tp] = (name, [offset, timestamp, digest])
    found = records_at(client, {tp: known[1][0] for tp, known in checked.items()})
    for tp, (name, known) in checked.items():
        record, offset = found[tp], known[0]
        if record is None or fingerprint(record) != known:
            raise LogReplaced(f"{name}: the record at offset {offset} is not the one read before (a new broker or "
                              "a recreated topic)")


class ReadRanges(beam.DoFn):
    """Reads a group of planned partition ranges together, as RawBatch elements of one partition each.

    One librdkafka consumer is assigned every range of the group at its start offset, so the partitions
    are fetched concurrently and decoded in librdkafka's threads while this one parses the previous
    batch. A partition is done when a record at or past its planned end arrives or its end of log is
    reported at or past it: offsets may have gaps (transaction markers, compacted records), and the
    consumer reads committed data only. A group that delivers nothing for ``idle_polls`` polls while
    some partition is below its planned end raises :class:`PartitionStalled` (retriable).
    """

    def __init__(self, settings: KafkaSettings, max_batch: int = 5000, idle_polls: int = IDLE_POLLS) -> None:
        self.settings, self.max_batch, self.idle_polls = settings, max_batch, idle_polls
        self.read = Metrics.counter("kafka", "records_read")

    def setup(self) -> None:
        self.client = Consumer({**self.settings.librdkafka_config(), "group.id": "trustbeam-reader",
                                "enable.auto.commit": False, "enable.auto.offset.store": False,
                                "isolation.level": "read_committed", "enable.partition.eof": True},
                               logger=log)

    def teardown(self) -> None:
        self.client.close()

    def process(self, ranges: tuple[PartitionRange, ...]) -> Iterator[RawBatch]:
        planned = {(r.topic, r.partition): r for r in ranges if r.start < r.stop}
        todo = dict(planned)  # the partitions still below their planned end
        if not todo:
            return
        self.client.assign([ConfluentPartition(t, p, r.start) for (t, p), r in todo.items()])
        at = {key: r.start for key, r in planned.items()}  # the next offset expected per partition
        try:
            idle = 0
            while todo:
                # consume() waits for as many messages as asked: never ask for more than the ranges still hold
                wanted = min(self.max_batch, sum(planned[key].stop - at[key] for key in todo))
                messages = self.client.consume(wanted, timeout=POLL_MS / 1000)
                batches: dict[tuple[str, int], list] = {}
                left = len(todo)
                for message in messages:
                    key = (message.topic(), message.partition())
                    if message.error() is not None:
                        self._error(message, todo)
                    elif key not in todo:
                        continue  # a partition already read to its planned end
                    elif message.offset() >= todo[key].stop:
                        del todo[key]
                    else:
                        batches.setdefault(key, []).append(message)
                idle = 0 if batches or len(todo) < left else idle + 1  # error events are no progress
                if idle >= self.idle_polls:
                    raise PartitionStalled(f"nothing below the planned ends of {sorted(todo)} after {idle} polls "
                                           f"(planned ends {[todo[k].stop for k in sorted(todo)]})")
                for (topic, partition), part in batches.items():
                    self.read.inc(len(part))
                    r = planned[(topic, partition)]
                    at[(topic, partition)] = part[-1].offset() + 1
                    yield RawBatch(topic, partition, np.fromiter((m.offset() for m in part), np.int64, len(part)),
                                   np.fromiter((m.timestamp()[1] for m in part), np.int64, len(part)),
                                   [m.value() for m in part], r.new_from)
                    if part[-1].offset() + 1 >= r.stop:
                        todo.pop((topic, partition), None)
        finally:
            self.client.unassign()

    @staticmethod
    def _error(message: Any, todo: dict[tuple[str, int], PartitionRange]) -> None:
        """An end of log at or past the planned end finishes its partition; a missing topic and fatal errors
        raise; librdkafka recovers from the rest (broker and transport errors) by itself, and a group that
        stops progressing is caught by the idle polls."""
        error, key = message.error(), (message.topic(), message.partition())
        if error.code() == KafkaError._PARTITION_EOF:
            if key in todo and message.offset() >= todo[key].stop:
                del todo[key]
            return
        if error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION):
            raise TopicMissing(f"{key[0]}[{key[1]}]: {error.str()}")
        if error.fatal():
            raise KafkaException(error)
        log.warning("Kafka consumer: %s (librdkafka retries)", error.str())


class ReadKafka(beam.PTransform):
    """The planned partition ranges -> RawBatch elements, read in ``groups`` groups of partitions (one consumer
    each; the local runners gain nothing from more than one)."""

    def __init__(self, settings: KafkaSettings, ranges: list[PartitionRange], max_batch: int = 5000,
                 groups: int = 1) -> None:
        super().__init__()
        self.settings, self.ranges, self.max_batch, self.groups = settings, ranges, max_batch, groups

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        groups = [tuple(self.ranges[k::self.groups]) for k in range(self.groups)]
        return (pbegin | "Ranges" >> beam.Create([g for g in groups if g])
                | "Read" >> beam.ParDo(ReadRanges(self.settings, self.max_batch)))


class ProduceRecords(beam.DoFn):
    """Send batches of (topic, key, value, headers) through :class:`exporters.kafka.KafkaSink`; flush per bundle, so a
    delivery failure fails the bundle (and Beam retries it) instead of being lost."""

    def __init__(self, settings: KafkaSettings, counter: str) -> None:
        self.settings = settings
        self.sent = Metrics.counter("trustbeam", counter)
        self.failures = Metrics.counter("trustbeam", f"{counter}_failed")

    def setup(self) -> None:
        self.sink = KafkaSink(self.settings, on_failure=self.failures.inc, shared=True)  # one per process, all cycles

    def process(self, batch: list[Message]) -> None:
        for message in batch:
            self.sink.send(message)
        self.sent.inc(len(batch))

    def finish_bundle(self) -> None:
        self.sink.flush()

    def teardown(self) -> None:
        self.sink.close()
