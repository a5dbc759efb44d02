"""Kafka I/O for the local runners: a kafka-python source of raw record batches, and the producer sink.

Beam 2.77's ReadFromKafka/WriteToKafka are cross-language (Java); the jars
cannot be fetched on the development machine, so local runs use this source:

* :func:`plan` fixes, per partition, the offset range of one run: from the
  group's replay offsets (or the beginning) to the end offsets seen at launch.
* :class:`ReadPartition` is a splittable DoFn over one partition's offset range
  (Kafka offsets are dense, so an :class:`OffsetRangeTracker` claims them). It
  emits :class:`RawBatch` elements of up to ``max_batch`` records, not one
  element per record, and reports the largest record timestamp seen as its
  watermark (the publishers stamp records with their event time).
* :class:`ProduceRecords` sends (topic, key, value, headers) tuples through the Kafka sink of
  :mod:`exporters.kafka`; delivery failures are counted and raised, never swallowed.

``--kafka_io=xlang`` swaps in Beam's Java KafkaIO on Flink/Dataflow (see
:mod:`beam_pipeline.pipeline`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterator

import apache_beam as beam
import numpy as np
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.metrics import Metrics
from apache_beam.utils.timestamp import Timestamp
from kafka import KafkaConsumer, TopicPartition

from exporters.kafka import KafkaSink, Message
from trustbeam.kafka import KafkaSettings, end_offsets

log = logging.getLogger(__name__)
MAX_AHEAD_MS = 86_400_000  # a day: how far past the wall clock a watermark may run (--max_future_s)

POLL_MS = 500
IDLE_POLLS = 20  # consecutive empty polls before a partition below its planned end is reported stuck


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
                         max_partition_fetch_bytes=8 << 20, fetch_max_bytes=64 << 20)


def plan(settings: KafkaSettings, topics: list[str], start: dict[tuple[str, int], int],
         new_from: dict[tuple[str, int], int]) -> list[PartitionRange]:
    """Offset ranges of every partition of ``topics``: from ``start`` (else the beginning) to the end now."""
    client = consumer(settings)
    try:
        partitions = []
        for topic in topics:
            numbers = client.partitions_for_topic(topic)
            if not numbers:
                raise KeyError(f"topic {topic!r} does not exist at {settings.bootstrap}")
            partitions += [TopicPartition(topic, p) for p in sorted(numbers)]
        begin, end = client.beginning_offsets(partitions), end_offsets(client, partitions)
    finally:
        client.close()
    ranges = []
    for tp in partitions:
        key = (tp.topic, tp.partition)
        first = max(start.get(key, begin[tp]), begin[tp])
        seen = new_from.get(key, first)
        if seen > end[tp]:  # the partition ends before what was read: the broker lost or recreated its log
            log.warning("%s/%d ends at offset %d but %d were read before: the broker lost its log (a restarted "
                        "memory-only broker, or a recreated topic); reading it again from %d. Slots already "
                        "published stay published; events the broker lost cannot be recovered.",
                        tp.topic, tp.partition, end[tp], seen, begin[tp])
            first = seen = begin[tp]
        ranges.append(PartitionRange(tp.topic, tp.partition, min(first, end[tp]), end[tp], seen))
    return ranges


class _WholeRange(beam.transforms.core.RestrictionProvider):
    def initial_restriction(self, element: PartitionRange) -> OffsetRange:
        return OffsetRange(element.start, element.stop)

    def create_tracker(self, restriction: OffsetRange) -> OffsetRestrictionTracker:
        return OffsetRestrictionTracker(restriction)

    def restriction_size(self, element: PartitionRange, restriction: OffsetRange) -> int:
        return restriction.size()


class ReadPartition(beam.DoFn):
    """Splittable read of one partition's planned offset range, as RawBatch elements."""

    def __init__(self, settings: KafkaSettings, max_batch: int = 5000, max_ahead_ms: float = MAX_AHEAD_MS) -> None:
        self.settings = settings
        self.max_batch = max_batch
        self.max_ahead_ms = max_ahead_ms  # the watermark never runs further past the wall clock
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
                if idle >= IDLE_POLLS:
                    raise RuntimeError(f"{element.topic}[{element.partition}]: no records below the planned end "
                                       f"{tracker.current_restriction().stop} after {idle} polls (broker lost data?)")
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
                newest = min(int(stamps.max()), int(time.time() * 1000 + self.max_ahead_ms))
                watermark.set_watermark(Timestamp(micros=max(newest, 0) * 1000))
                yield RawBatch(element.topic, element.partition,
                               np.fromiter((r.offset for r in claimed), np.int64, len(claimed)), stamps,
                               [r.value for r in claimed], element.new_from)
            if len(claimed) < len(records):
                return


class ReadKafka(beam.PTransform):
    """The planned partition ranges -> RawBatch elements."""

    def __init__(self, settings: KafkaSettings, ranges: list[PartitionRange], max_batch: int = 5000,
                 max_ahead_ms: float = MAX_AHEAD_MS) -> None:
        super().__init__()
        self.settings, self.ranges, self.max_batch, self.max_ahead_ms = settings, ranges, max_batch, max_ahead_ms

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (pbegin | "Ranges" >> beam.Create(self.ranges)
                | "Read" >> beam.ParDo(ReadPartition(self.settings, self.max_batch, self.max_ahead_ms)))


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
