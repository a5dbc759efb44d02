"""Kafka I/O for the local runners: a kafka-python source of raw record batches, and the producer sink.

Beam 2.77's ReadFromKafka/WriteToKafka are cross-language (Java); the jars
cannot be fetched on the development machine, so local runs use this source:

* :func:`plan` fixes, per partition, the offset range of one run: from where the
  last run stopped (or the beginning) to the end offsets seen at launch, and
  checks that the log is the one the last run read (topic ids, the last record
  read), so a replaced broker or a recreated topic is detected, never skipped.
* :class:`ReadPartition` is a splittable DoFn over one partition's offset range,
  claimed with an :class:`OffsetRestrictionTracker`. Offsets may have gaps
  (transaction markers, compacted records): the consumer reads committed data
  only (``read_committed``), and the range ends where the consumer's position
  passes its end, whatever offsets lie in between. It emits :class:`RawBatch`
  elements of up to ``max_batch`` records, not one element per record, and
  reports as its watermark the newest record timestamp it can trust (the
  publishers stamp records with their event time): monotone by construction
  (a record stepping back never lowers it), and a record stamped more than
  ``max_skew_ms`` past the wall clock never moves it (one producer's skewed
  clock cannot close slots). A partition whose records stop coming below its
  planned end raises :class:`PartitionStalled`, which is retriable.
* :class:`ProduceRecords` sends (topic, key, value, headers) tuples through the Kafka sink of
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
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics import Metrics
from apache_beam.utils.timestamp import Timestamp
from kafka import KafkaConsumer, TopicPartition

from exporters.kafka import KafkaSink, Message
from exporters.kafka_client import KafkaSettings, end_offsets

log = logging.getLogger(__name__)
MAX_AHEAD_MS = 86_400_000  # a day: events timed further past the wall clock are dead-lettered (--max_future_s)

MAX_SKEW_MS = 300_000  # how far past the wall clock a record's time may lie and still move a watermark
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


def consumer(settings: KafkaSettings) -> KafkaConsumer:
    return KafkaConsumer(**settings.client_args(), enable_auto_commit=False, group_id=None,
                         isolation_level="read_committed", max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)


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


def record_at(client: KafkaConsumer, tp: TopicPartition, offset: int, polls: int = 20) -> Any | None:
    """The record at ``offset`` of a partition, or None where there is none (deleted, compacted, never written)."""
    client.assign([tp])
    client.seek(tp, offset)
    for _ in range(polls):
        records = client.poll(timeout_ms=POLL_MS, max_records=1).get(tp, [])
        if records:
            return records[0] if records[0].offset == offset else None
        if client.position(tp) > offset:
            return None
    return None


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
    client = consumer(settings)
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
        tails = {f"{tp.topic}/{tp.partition}": fingerprint(record) for tp in partitions
                 if end[tp] and (record := record_at(client, tp, end[tp] - 1)) is not None}
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
        record = record_at(client, tp, offset)
        if record is None or fingerprint(record) != [offset, timestamp, digest]:
            raise LogReplaced(f"{name}: the record at offset {offset} is not the one read before (a new broker or "
                              "a recreated topic)")


class _WholeRange(beam.transforms.core.RestrictionProvider):
    def initial_restriction(self, element: PartitionRange) -> OffsetRange:
        return OffsetRange(element.start, element.stop)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: PartitionRange, restriction: OffsetRange) -> int:
        return restriction.size()


class ReadPartition(beam.DoFn):
    """Splittable read of one partition's planned offset range, as RawBatch elements."""

    def __init__(self, settings: KafkaSettings, max_batch: int = 5000, max_skew_ms: float = MAX_SKEW_MS) -> None:
        self.settings = settings
        self.max_batch = max_batch
        self.max_skew_ms = max_skew_ms  # records stamped further past the wall clock do not move the watermark
        self.read = Metrics.counter("kafka", "records_read")

    def setup(self) -> None:
        self.client = consumer(self.settings)

    def teardown(self) -> None:
        self.client.close()

    def process(self, element: PartitionRange,
                tracker: OffsetRestrictionTracker = beam.DoFn.RestrictionParam(_WholeRange()),
                watermark: ManualWatermarkEstimator = beam.DoFn.WatermarkEstimatorParam(
                    ManualWatermarkEstimator.default_provider())) -> Iterator[RawBatch]:
        tp = TopicPartition(element.topic, element.partition)
        self.client.assign([tp])
        self.client.seek(tp, tracker.current_restriction().start)
        idle = 0
        while self.client.position(tp) < tracker.current_restriction().stop:
            records = self.client.poll(timeout_ms=POLL_MS, max_records=self.max_batch).get(tp, [])
            if not records:
                idle += 1
                if idle >= IDLE_POLLS and self.client.position(tp) < tracker.current_restriction().stop:
                    raise PartitionStalled(f"{element.topic}[{element.partition}]: nothing below the planned end "
                                           f"{tracker.current_restriction().stop} from position "
                                           f"{self.client.position(tp)} after {idle} polls")
                continue
            idle = 0
            claimed = []
            for record in records:  # one by one: the runner may have split the range meanwhile
                if not tracker.try_claim(record.offset):
                    break
                claimed.append(record)
            if claimed:
                self.read.inc(len(claimed))
                stamps = np.fromiter((r.timestamp for r in claimed), np.int64, len(claimed))
                self._advance(watermark, trusted_progress(stamps, time.time() * 1000, self.max_skew_ms))
                yield RawBatch(element.topic, element.partition,
                               np.fromiter((r.offset for r in claimed), np.int64, len(claimed)), stamps,
                               [r.value for r in claimed], element.new_from)
            if len(claimed) < len(records):
                return
        tracker.try_claim(tracker.current_restriction().stop)  # offsets up to the end were gaps: the range is done

    @staticmethod
    def _advance(watermark: ManualWatermarkEstimator, progress_ms: int | None) -> None:
        """Move the watermark to ``progress_ms`` if that is later: never back (timestamps may step back)."""
        if progress_ms is None:
            return
        proposed = Timestamp(micros=max(progress_ms, 0) * 1000)
        current = watermark.current_watermark()
        if current is None or proposed > current:
            watermark.set_watermark(proposed)


class ReadKafka(beam.PTransform):
    """The planned partition ranges -> RawBatch elements."""

    def __init__(self, settings: KafkaSettings, ranges: list[PartitionRange], max_batch: int = 5000,
                 max_skew_ms: float = MAX_SKEW_MS) -> None:
        super().__init__()
        self.settings, self.ranges, self.max_batch, self.max_skew_ms = settings, ranges, max_batch, max_skew_ms

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (pbegin | "Ranges" >> beam.Create(self.ranges)
                | "Read" >> beam.ParDo(ReadPartition(self.settings, self.max_batch, self.max_skew_ms)))


class ProduceRecords(beam.DoFn):
    """Send (topic, key, value, headers) through :class:`exporters.kafka.KafkaSink`; flush per bundle, so a
    delivery failure fails the bundle (and Beam retries it) instead of being lost."""

    def __init__(self, settings: KafkaSettings, counter: str) -> None:
        self.settings = settings
        self.sent = Metrics.counter("trustbeam", counter)
        self.failures = Metrics.counter("trustbeam", f"{counter}_failed")

    def setup(self) -> None:
        self.sink = KafkaSink(self.settings, on_failure=self.failures.inc)

    def process(self, element: Message) -> None:
        self.sink.send(element)
        self.sent.inc()

    def finish_bundle(self) -> None:
        self.sink.flush()

    def teardown(self) -> None:
        self.sink.close()
