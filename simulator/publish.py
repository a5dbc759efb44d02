"""Publish a simulated run to Kafka: events keyed by collaborator, device status keyed by device.

Each message is the record's JSON wire form (validated on the way) with
``schema_version`` and ``record`` headers, stamped with the record's event time
(the pipeline's source reports watermarks from these stamps). ``rate`` paces events per second;
None sends as fast as the producer allows. Delivery failures are counted and
raised on close, never swallowed.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pyarrow as pa
from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from schemas import CollaborationEvent, DeviceStatus, Record, to_json
from trustbeam.kafka import KafkaSettings, Topics, make_producer

log = logging.getLogger(__name__)

_ROUTES: dict[str, tuple[type[Record], str, str]] = {  # record, key field, event-time field
    "events": (CollaborationEvent, "collaborator", "event_time_ms"),
    "status": (DeviceStatus, "device", "time_ms"),
}


class KafkaPublisher:
    """A simulator sink that produces the wire records to their topics."""

    def __init__(self, settings: KafkaSettings, topics: Topics = Topics(), rate: float | None = None,
                 producer: KafkaProducer | None = None) -> None:
        if rate is not None and rate <= 0:
            raise ValueError(f"rate: must be > 0 events/s or None (got {rate!r})")
        self.topics = {"events": topics.events, "status": topics.status}
        self.rate = rate
        self.producer = producer or make_producer(settings)
        self.sent = {"events": 0, "status": 0}
        self.failed = 0
        self._first_error: Exception | None = None
        self._started = time.monotonic()

    def write(self, kind: str, table: pa.Table) -> None:
        if kind not in _ROUTES:
            return  # devices and truth are files, not wire records
        cls, key_field, time_field = _ROUTES[kind]
        names = [name for name in table.column_names if name != "slot"]
        for row in table.select(names).to_pylist():
            record = cls.from_dict(row)
            self._pace(kind)
            headers = [("schema_version", str(cls.SCHEMA_VERSION).encode()), ("record", cls.NAME.encode())]
            try:
                future = self.producer.send(self.topics[kind], key=getattr(record, key_field).encode(),
                                            value=to_json(record), headers=headers,
                                            timestamp_ms=getattr(record, time_field))
            except KafkaError as error:  # metadata unavailable within max_block_ms, buffer full, ...
                self._on_error(error)
                raise RuntimeError(f"cannot publish to {self.topics[kind]!r}: {error}") from error
            future.add_errback(self._on_error)
            self.sent[kind] += 1

    def _pace(self, kind: str) -> None:
        if self.rate is None or kind != "events":
            return
        ahead = self._started + self.sent["events"] / self.rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)

    def _on_error(self, error: Exception) -> None:
        self.failed += 1
        if self._first_error is None:
            self._first_error = error
            log.error("Kafka delivery failed: %s", error)

    def close(self) -> None:
        timeout_s = self.producer.config["delivery_timeout_ms"] / 1000 + 5
        try:
            self.producer.flush(timeout=timeout_s)
        except KafkaTimeoutError:
            raise RuntimeError(f"messages still undelivered after {timeout_s:.0f} s; broker unreachable?") from None
        finally:
            try:
                self.producer.close(timeout=5)
            except KafkaError as error:
                log.warning("Kafka producer did not close cleanly: %s", error)
        if self.failed:
            raise RuntimeError(f"{self.failed} messages were not delivered; first error: {self._first_error}")

    def counts(self) -> dict[str, Any]:
        return {"events_published": self.sent["events"], "status_published": self.sent["status"],
                "delivery_failures": self.failed}
