"""Publish a simulated run to Kafka: events keyed by collaborator, device status keyed by device.

Each message is the record's JSON wire form (validated on the way) with
``schema_version`` and ``record`` headers, stamped with the record's event time
(the pipeline's source reports watermarks from these stamps). ``rate`` paces events per second;
None sends as fast as the producer allows. Delivery failures are counted and
raised on close, never swallowed.
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa

from exporters.kafka import KafkaSink, message
from schemas import CollaborationEvent, DeviceStatus, Record
from exporters.kafka_client import KafkaSettings, Topics

_ROUTES: dict[str, tuple[type[Record], str, str]] = {  # record, key field, event-time field
    "events": (CollaborationEvent, "collaborator", "event_time_ms"),
    "status": (DeviceStatus, "device", "time_ms"),
}


class KafkaPublisher:
    """A simulator sink that produces the wire records to their topics (through exporters.kafka.KafkaSink)."""

    def __init__(self, settings: KafkaSettings, topics: Topics = Topics(), rate: float | None = None,
                 **producer: Any) -> None:
        """``producer``: librdkafka settings over the sink's (:class:`exporters.kafka.KafkaSink`)."""
        if rate is not None and rate <= 0:
            raise ValueError(f"rate: must be > 0 events/s or None (got {rate!r})")
        self.topics = {"events": topics.events, "status": topics.status}
        self.rate = rate
        self.sink = KafkaSink(settings, **producer)
        self.sent = {"events": 0, "status": 0}
        self._started = time.monotonic()

    def write(self, kind: str, table: pa.Table) -> None:
        if kind not in _ROUTES:
            return  # devices and truth are files, not wire records
        cls, key_field, time_field = _ROUTES[kind]
        names = [name for name in table.column_names if name != "slot"]
        for row in table.select(names).to_pylist():
            record = cls.from_dict(row)
            self._pace(kind)
            self.sink.send(message(self.topics[kind], record, key_field), timestamp_ms=getattr(record, time_field))
            self.sent[kind] += 1

    def _pace(self, kind: str) -> None:
        if self.rate is None or kind != "events":
            return
        ahead = self._started + self.sent["events"] / self.rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)

    def close(self) -> None:
        self.sink.close()

    def counts(self) -> dict[str, Any]:
        return {"events_published": self.sent["events"], "status_published": self.sent["status"],
                "delivery_failures": self.sink.failed}
