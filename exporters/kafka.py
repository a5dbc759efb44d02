"""The Kafka sink every trustbeam producer goes through: the pipeline's outputs and dead letters, and
the simulator's events.

* Messages are keyed by the record's owner (device for statuses, collaborator for events), so one
  owner's records stay in order in one partition; the JSON wire form is the value, and
  ``schema_version`` and ``record`` headers let consumers route and evolve (:func:`message`).
* The producer is librdkafka's (confluent-kafka), idempotent with acks=all, bounded retries and delivery
  timeout, keyed records partitioned by murmur2 as Java's clients do (:func:`exporters.kafka_client.producer_config`):
  a call to send costs microseconds in C, where kafka-python's pure-Python producer spent a fifth of a cycle.
* Delivery errors are never swallowed: each is counted, the first is logged, and :meth:`KafkaSink.flush`
  raises :class:`DeliveryError` naming how many failed, so a Beam bundle fails and is retried.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import threading
import time
from confluent_kafka import KafkaException, Producer

from schemas import Columns, Record, to_json
from schemas.columnar import Render, python_render
from exporters.kafka_client import KafkaSettings, producer_config

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


def messages(topic: str, records: Columns, key_field: str = "owner", render: Render = python_render
             ) -> list[Message]:
    """:func:`message` of every record of a batch, each value encoded from the columns (the same bytes; ``render``:
    :meth:`Columns.json`'s)."""
    record = records.record
    headers = [("schema_version", str(record.SCHEMA_VERSION).encode()), ("record", record.NAME.encode())]
    keys = records.column(key_field).tolist()
    encoded = {key: str(key).encode() for key in set(keys)}
    return [(topic, encoded[key], value, headers) for key, value in zip(keys, records.json(render=render))]


_SHARED: dict[tuple, Producer] = {}  # the process's long-lived producers, by their settings
_SHARED_LOCK = threading.Lock()


def _producer(config: dict[str, Any], shared: bool) -> Producer:
    """A librdkafka producer of ``config`` (its log lines through Python logging); ``shared``: the process's one for
    these settings, made once (an idempotent producer's start, a round trip for its id, cost 0.5 s here)."""
    if not shared:
        return Producer({**config, "logger": log})
    with _SHARED_LOCK:
        key = _key(config)
        if key not in _SHARED:
            _SHARED[key] = Producer({**config, "logger": log})
        return _SHARED[key]


def _key(config: dict[str, Any]) -> tuple:
    return tuple(sorted((name, str(value)) for name, value in config.items()))


class KafkaSink:
    """Sends messages and accounts for every one: ``sent`` to the producer, then ``delivered`` (acknowledged)
    or ``failed`` (rejected, or still unconfirmed when a flush gave up). ``overrides``: librdkafka settings over
    :func:`exporters.kafka_client.producer_config`'s (``message.timeout.ms``: how long a message may take).

    ``shared``: the sink sends through the process's long-lived producer for these settings, so a job's local cycles
    (each a new pipeline) do not start a producer each; the sink still accounts for its own messages only, and a
    failure retires that producer so the next sink starts afresh."""

    POLL_EVERY = 1000  # sends between servings of the delivery reports

    def __init__(self, settings: KafkaSettings, on_failure: Callable[[int], None] | None = None, shared: bool = False,
                 **overrides: Any) -> None:
        self.config = producer_config(settings, **overrides)
        self.shared = shared
        self.producer = _producer(self.config, shared)
        self.on_failure = on_failure
        self.sent = 0
        self.delivered = 0
        self.failed = 0
        self._unreported = 0
        self._first_error: Exception | None = None

    def send(self, item: Message, timestamp_ms: int | None = None) -> None:
        topic, key, value, headers = item
        deadline = None  # set at the first full queue
        while True:
            try:
                self.producer.produce(topic, value=value, key=key, headers=headers, timestamp=timestamp_ms or 0,
                                      on_delivery=self._report)
                break
            except BufferError as error:  # the local queue is full: serve the delivery reports, then again
                deadline = deadline or time.monotonic() + self.config["message.timeout.ms"] / 1000
                if time.monotonic() > deadline:
                    self._failed(error)
                    raise DeliveryError(f"cannot produce to {topic!r}: the local queue stayed full") from error
                self.producer.poll(0.1)
            except KafkaException as error:  # too large, unknown topic, ...
                self._failed(error)
                raise DeliveryError(f"cannot produce to {topic!r}: {error}") from error
        self.sent += 1
        if self.sent % self.POLL_EVERY == 0:
            self.producer.poll(0)

    def _report(self, error: Any, _message: Any) -> None:
        if error is None:
            self.delivered += 1
        else:
            self._failed(KafkaException(error))

    def _failed(self, error: Exception, count: int = 1) -> None:
        self.failed += count
        self._unreported += count
        if self.shared:  # a producer that failed is not handed to the next sink
            with _SHARED_LOCK:
                if _SHARED.get(_key(self.config)) is self.producer:
                    del _SHARED[_key(self.config)]
        if self.on_failure is not None:
            self.on_failure(count)
        if self._first_error is None:
            self._first_error = error
            log.error("Kafka delivery failed: %s", error)

    def flush(self) -> None:
        """Wait for every message sent so far; raise DeliveryError if any failed since the last flush."""
        timeout_s = self.config["message.timeout.ms"] / 1000 + 5
        pending = self.producer.flush(timeout_s)
        if pending:  # unconfirmed: counted as failed, and dropped so that no late report counts them again
            self._failed(TimeoutError(f"undelivered after {timeout_s:.0f} s"), pending)
            self.producer.purge()
            self.producer.flush(0)
            self._unreported = 0
            raise DeliveryError(f"{pending} messages still undelivered after {timeout_s:.0f} s; broker unreachable?")
        if self._unreported:
            count, self._unreported = self._unreported, 0
            raise DeliveryError(f"{count} messages were not delivered; first error: {self._first_error}")

    def close(self) -> None:
        """Flush (raising as flush does); what is still queued after a failed flush is dropped (a shared producer
        that failed is no longer shared: only this sink's messages were in it since)."""
        try:
            self.flush()
        finally:
            if not self.shared or self.failed:
                self.producer.purge()
                self.producer.flush(0)

    def counts(self) -> dict[str, Any]:
        return {"sent": self.sent, "delivered": self.delivered, "failed": self.failed}
