"""The local Kafka source under disorder: offset gaps, partitions read together, stalls, skewed clocks; and the
plan's checks of the log (retention, a replaced log)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from confluent_kafka import KafkaError

from beam_pipeline.kafka_io import PartitionRange, PartitionStalled, ReadRanges, trusted_progress
from exporters.kafka_client import KafkaSettings


@dataclass
class Record:
    offset: int
    timestamp: int
    value: bytes = b"{}"


class Message:
    """A confluent-kafka message, an end-of-log event when ``eof``, or an error event with ``code``."""

    def __init__(self, partition: int, record: Record | None = None, eof: int | None = None,
                 code: int = KafkaError._PARTITION_EOF) -> None:
        self._partition, self.record, self.eof, self.code = partition, record, eof, code

    def topic(self) -> str:
        return "events"

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self.eof if self.record is None else self.record.offset

    def timestamp(self) -> tuple[int, int]:
        return 1, self.record.timestamp

    def value(self) -> bytes:
        return self.record.value

    def error(self) -> KafkaError | None:
        return None if self.record is not None else KafkaError(self.code)


class FakeConsumer:
    """Serves fixed answers to consume(); records the assignment."""

    def __init__(self, answers: list[list[Message]]) -> None:
        self.answers, self.assigned = list(answers), None

    def assign(self, partitions) -> None:
        self.assigned = sorted((tp.partition, tp.offset) for tp in partitions)

    def unassign(self) -> None:
        self.assigned = None

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        return self.answers.pop(0) if self.answers else []

    def close(self) -> None:
        pass


def read(answers: list[list[Message]], *ranges: PartitionRange, idle_polls: int = 20) -> tuple[list, FakeConsumer]:
    reader = ReadRanges(KafkaSettings("unused:1"), max_batch=100, idle_polls=idle_polls)
    reader.client = FakeConsumer(answers)
    return list(reader.process(tuple(ranges))), reader.client


def test_offset_gaps_are_not_missing_records_and_the_end_of_log_past_the_plan_ends_the_range() -> None:
    answers = [[Message(0, Record(0, 5)), Message(0, Record(1, 5))], [Message(0, Record(4, 5)), Message(0, Record(5, 5))],
               [Message(0, eof=10)]]  # 2-3 and 6-9: transaction markers or compacted records
    batches, client = read(answers, PartitionRange("events", 0, 0, 10, 0))
    assert [int(o) for b in batches for o in b.offsets] == [0, 1, 4, 5]
    assert client.assigned is None  # done: unassigned, nothing waited for beyond the end of log


def test_partitions_are_read_together_and_nothing_past_a_planned_end_is_emitted() -> None:
    answers = [[Message(0, Record(3, 1)), Message(1, Record(7, 2)), Message(0, Record(4, 3)), Message(1, Record(8, 4))],
               [Message(0, Record(5, 5)), Message(1, Record(9, 6)), Message(1, Record(10, 7))],  # 10: past partition 1's end
               [Message(0, Record(6, 8))]]
    reader = ReadRanges(KafkaSettings("unused:1"), max_batch=100)
    reader.client = client = FakeConsumer(answers)
    batches = reader.process((PartitionRange("events", 0, 3, 7, 5), PartitionRange("events", 1, 7, 10, 7)))
    first = next(batches)
    assert client.assigned == [(0, 3), (1, 7)]  # one consumer, both partitions from their planned start
    rest = list(batches)
    got = {(b.partition, int(o)): int(t) for b in [first, *rest] for o, t in zip(b.offsets, b.timestamps)}
    assert got == {(0, 3): 1, (0, 4): 3, (0, 5): 5, (0, 6): 8, (1, 7): 2, (1, 8): 4, (1, 9): 6}
    assert {b.partition: b.new_from for b in [first, *rest]} == {0: 5, 1: 7}  # offsets below new_from: replayed


def test_a_stalled_group_is_a_retriable_error_naming_the_partitions_below_their_end() -> None:
    with pytest.raises(PartitionStalled, match=r"\('events', 1\)") as raised:
        read([[Message(0, Record(0, 1))]], PartitionRange("events", 0, 0, 1, 0), PartitionRange("events", 1, 0, 5, 0),
             idle_polls=3)
    assert raised.value.retriable


def test_broker_trouble_is_ridden_out_by_librdkafka_but_never_counts_as_progress() -> None:
    transport = [Message(0, eof=-1, code=KafkaError._TRANSPORT)]
    batches, _ = read([transport, transport, [Message(0, Record(0, 1))]], PartitionRange("events", 0, 0, 1, 0),
                      idle_polls=3)
    assert [int(o) for b in batches for o in b.offsets] == [0]  # the read went on after two error events
    with pytest.raises(PartitionStalled):
        read([transport] * 5, PartitionRange("events", 0, 0, 1, 0), idle_polls=3)


def test_empty_ranges_assign_nothing() -> None:
    batches, client = read([], PartitionRange("events", 0, 4, 4, 4))
    assert batches == [] and client.assigned is None


def test_progress_trusts_neither_a_clock_ahead_nor_a_step_back() -> None:
    now = 1_000_000
    stamps = np.array([now - 1_000, now + 3 * 3_600_000, now - 500, now - 5_000])  # one producer 3 h ahead
    assert trusted_progress(stamps, now, max_skew_ms=60_000) == now - 500
    assert trusted_progress(np.array([now + 3 * 3_600_000]), now, 60_000) is None


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

    def seek_to_end(self, *partitions) -> None:
        self.at = self.end

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

    monkeypatch.setattr(kafka_io, "consumer", lambda settings, **overrides: log)
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
