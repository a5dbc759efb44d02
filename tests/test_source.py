"""The kafka-python source under disorder: timestamps stepping back, offset gaps, skewed clocks, stalls."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
from apache_beam.io.restriction_trackers import OffsetRange, OffsetRestrictionTracker
from apache_beam.io.watermark_estimators import ManualWatermarkEstimator
from apache_beam.utils.timestamp import Timestamp

from beam_pipeline.kafka_io import PartitionRange, PartitionStalled, ReadPartition
from exporters.kafka_client import KafkaSettings


@dataclass
class Record:
    offset: int
    timestamp: int
    value: bytes = b"{}"


class FakeConsumer:
    """Serves fixed polls of one partition; offsets may have gaps (transaction markers, compaction)."""

    def __init__(self, polls: list[list[Record]], end: int) -> None:
        self.polls, self.end, self.at, self.tp = list(polls), end, 0, None

    def assign(self, partitions) -> None:
        self.tp = partitions[0]

    def seek(self, tp, offset: int) -> None:
        self.at = offset

    def position(self, tp) -> int:
        return self.at

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        if not self.polls:
            return {}
        records = self.polls.pop(0)
        if records:
            self.at = records[-1].offset + 1
        else:  # a control record or compacted records at the end: the position moves past them
            self.at = self.end
        return {self.tp: records}

    def end_offsets(self, partitions) -> dict:
        return {tp: self.end for tp in partitions}

    def close(self) -> None:
        pass


def read(polls: list[list[Record]], stop: int, max_skew_ms: float = 60_000) -> tuple[list, OffsetRestrictionTracker,
                                                                                      ManualWatermarkEstimator]:
    reader = ReadPartition(KafkaSettings("unused:1"), max_batch=100, max_skew_ms=max_skew_ms)
    reader.client = FakeConsumer(polls, stop)
    tracker = OffsetRestrictionTracker(OffsetRange(0, stop))
    watermark = ManualWatermarkEstimator(None)
    batches = list(reader.process(PartitionRange("events", 0, 0, stop, 0), tracker, watermark))
    return batches, tracker, watermark


def test_timestamps_stepping_back_across_polls_keep_the_watermark_monotone() -> None:
    now = int(time.time() * 1000)
    batches, tracker, watermark = read([[Record(0, now - 300), Record(1, now - 100)], [Record(2, now - 5_000)]], 3)
    assert sum(len(b.values) for b in batches) == 3  # the stepped-back record is read, not a crash
    assert watermark.current_watermark() == Timestamp(micros=(now - 100) * 1000)
    tracker.check_done()


def test_offset_gaps_are_not_missing_records() -> None:
    now = int(time.time() * 1000)
    polls = [[Record(0, now), Record(1, now)], [Record(4, now), Record(5, now)], []]  # 2-3 and 6-9: markers
    batches, tracker, _ = read(polls, 10)
    assert [int(o) for b in batches for o in b.offsets] == [0, 1, 4, 5]
    tracker.check_done()  # the whole range is claimed: nothing is waited for beyond the last record


def test_a_record_from_a_clock_hours_ahead_does_not_move_the_watermark() -> None:
    now = int(time.time() * 1000)
    polls = [[Record(0, now - 1_000), Record(1, now + 3 * 3_600_000), Record(2, now - 500)]]
    batches, _, watermark = read(polls, 3)
    assert sum(len(b.values) for b in batches) == 3  # the event is kept (within max_future_s), only not trusted
    assert watermark.current_watermark() == Timestamp(micros=(now - 500) * 1000)


def test_a_stalled_partition_is_a_retriable_error() -> None:
    polls = [[]] * 25  # the broker answers, but nothing below the planned end arrives
    reader = ReadPartition(KafkaSettings("unused:1"), max_batch=100)
    reader.client = FakeConsumer(polls, 10)
    reader.client.poll = lambda timeout_ms=0, max_records=None: {}  # the position never moves
    tracker = OffsetRestrictionTracker(OffsetRange(0, 10))
    with pytest.raises(PartitionStalled) as raised:
        list(reader.process(PartitionRange("events", 0, 0, 10, 0), tracker, ManualWatermarkEstimator(None)))
    assert raised.value.retriable


class FakeLog:
    """A kafka-python consumer over one partition holding offsets [begin, end) (what plan() asks of it)."""

    def __init__(self, begin: int, end: int, topic_id: str = "id-1", salt: bytes = b"") -> None:
        from types import SimpleNamespace

        self.begin, self.end, self.salt, self.at, self.tp = begin, end, salt, begin, None
        self._client = SimpleNamespace(cluster=SimpleNamespace(_topic_ids={"events": topic_id}))

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {0}

    def beginning_offsets(self, partitions) -> dict:
        return {tp: self.begin for tp in partitions}

    def end_offsets(self, partitions) -> dict:
        return {tp: self.end for tp in partitions}

    def assign(self, partitions) -> None:
        self.tp = partitions[0]

    def seek(self, tp, offset: int) -> None:
        self.at = max(offset, self.begin)

    def position(self, tp) -> int:
        return self.at

    def highwater(self, tp) -> int:
        return self.end

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict:
        if self.at >= self.end:
            return {}
        record = Record(self.at, 1_000 + self.at, b"value-%d" % self.at + self.salt)
        self.at += 1
        return {self.tp: [record]}

    def close(self) -> None:
        pass


def planned(monkeypatch, log: FakeLog, start: dict, identity: dict | None = None):
    import beam_pipeline.kafka_io as kafka_io

    monkeypatch.setattr(kafka_io, "consumer", lambda settings: log)
    return kafka_io.plan(KafkaSettings("unused:1"), ["events"], start, identity)


def test_records_deleted_by_retention_before_they_were_read_are_counted_and_warned(monkeypatch, caplog) -> None:
    reading = planned(monkeypatch, FakeLog(begin=10, end=20), {("events", 0): 4})
    (part,) = reading.ranges
    assert (part.start, part.stop) == (10, 20) and reading.lost == {"events/0": 6}
    assert "retention deleted offsets 4..9 before they were read (6 records lost)" in caplog.text


def test_a_log_that_is_not_the_one_read_is_refused_by_name(monkeypatch) -> None:
    from beam_pipeline.kafka_io import LogReplaced

    first = planned(monkeypatch, FakeLog(0, 20), {})
    assert first.identity["topic_ids"] == {"events": "id-1"} and first.identity["tails"]["events/0"][0] == 19
    grown = planned(monkeypatch, FakeLog(0, 30), {("events", 0): 20}, first.identity)  # the same log, longer
    assert grown.ranges[0].start == 20
    for log, why in ((FakeLog(0, 30, topic_id="id-2"), "deleted and created again"),
                     (FakeLog(0, 30, salt=b"-new"), "not the one read before"),
                     (FakeLog(0, 12), "ends at offset 12")):
        with pytest.raises(LogReplaced, match=why):
            planned(monkeypatch, log, {("events", 0): 20}, first.identity)
