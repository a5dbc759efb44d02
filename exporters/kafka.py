"""The Kafka sink every trustbeam producer goes through: the pipeline's outputs and dead letters, and
the simulator's events.

* Messages are keyed by the record's owner (device for statuses, collaborator for events), so one
  owner's records stay in order in one partition; the JSON wire form is the value, and
  ``schema_version`` and ``record`` headers let consumers route and evolve (:func:`message`).
* The producer is idempotent with acks=all and bounded retries and delivery timeout
  (:func:`exporters.kafka_client.make_producer`).
* Delivery errors are never swallowed: each is counted, the first is logged, and :meth:`KafkaSink.flush`
  raises :class:`DeliveryError` naming how many failed, so a Beam bundle fails and is retried.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from kafka import KafkaProducer
from kafka.errors import KafkaError, KafkaTimeoutError

from schemas import Record, to_json
from exporters.kafka_client import KafkaSettings, make_producer

log = logging.getLogger(__name__)

Message = tuple[str, bytes, bytes, list[tuple[str, bytes]]]  # topic, key, value, headers


class DeliveryError(RuntimeError):
    """Messages were not delivered (broker unreachable, rejected, timed out). Retriable: a Beam bundle, or a
    cycle, that fails with it is done again."""

    retriable = True


def message(topic: str, record: Record, key_field: str = "owner") -> Message:
    """(topic, key, value, headers) of a record: keyed by ``key_field``, schema version and record name in headers."""
    headers = [("schema_version", str(record.SCHEMA_VERSION).encode()), ("record", record.NAME.encode())]
    return topic, str(getattr(record, key_field)).encode(), to_json(record), headers


class KafkaSink:
    """Sends messages and accounts for every one: ``sent`` to the producer, then ``delivered`` (acknowledged)
    or ``failed`` (rejected, or still unconfirmed when a flush gave up)."""

    def __init__(self, settings: KafkaSettings, producer: KafkaProducer | None = None,
                 on_failure: Callable[[int], None] | None = None) -> None:
        self.producer = producer or make_producer(settings)
        self.on_failure = on_failure
        self.sent = 0
        self.delivered = 0
        self.failed = 0
        self._unreported = 0
        self._first_error: Exception | None = None

    def send(self, item: Message, timestamp_ms: int | None = None) -> None:
        topic, key, value, headers = item
        try:
            future = self.producer.send(topic, key=key, value=value, headers=headers, timestamp_ms=timestamp_ms)
        except KafkaError as error:  # metadata unavailable within max_block_ms, buffer full, too large, ...
            self._failed(error)
            raise DeliveryError(f"cannot produce to {topic!r}: {error}") from error
        future.add_callback(self._delivered)
        future.add_errback(self._failed)
        self.sent += 1

    def _delivered(self, _metadata: Any) -> None:
        self.delivered += 1

    def _failed(self, error: Exception, count: int = 1) -> None:
        self.failed += count
        self._unreported += count
        if self.on_failure is not None:
            self.on_failure(count)
        if self._first_error is None:
            self._first_error = error
            log.error("Kafka delivery failed: %s", error)

    def flush(self) -> None:
        """Wait for every message sent so far; raise DeliveryError if any failed since the last flush."""
        timeout_s = self.producer.config["delivery_timeout_ms"] / 1000 + 5
        try:
            self.producer.flush(timeout=timeout_s)
        except KafkaTimeoutError as error:
            pending = self.sent - self.delivered - self.failed  # unconfirmed: counted as failed
            self._failed(error, pending)
            self._unreported = 0
            raise DeliveryError(f"{pending} messages still undelivered after {timeout_s:.0f} s; "
                                f"broker unreachable?") from None
        if self._unreported:
            count, self._unreported = self._unreported, 0
            raise DeliveryError(f"{count} messages were not delivered; first error: {self._first_error}")

    def close(self) -> None:
        """Flush (raising as flush does), then close the producer."""
        try:
            self.flush()
        finally:
            try:
                self.producer.close(timeout=5)
            except KafkaError as error:
                log.warning("Kafka producer did not close cleanly: %s", error)

    def counts(self) -> dict[str, Any]:
        return {"sent": self.sent, "delivered": self.delivered, "failed": self.failed}
