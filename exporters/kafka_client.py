"""Kafka connection settings, topic names, topic creation and the producer every part uses.

Brokers come from an explicit ``--bootstrap``, else ``KAFKA_BOOTSTRAP``, else
the local broker. Security settings (SASL, TLS) come only from the environment
(``KAFKA_SECURITY_PROTOCOL``, ``KAFKA_SASL_MECHANISM``, ``KAFKA_SASL_USERNAME``,
``KAFKA_SASL_PASSWORD``, ``KAFKA_SSL_CAFILE``, ``KAFKA_SSL_CERTFILE``,
``KAFKA_SSL_KEYFILE``), never from arguments that land in logs, and the
settings' repr hides them. ``KAFKA_DELIVERY_TIMEOUT_S`` (default 60) bounds how long a produced record
may wait for the brokers' acknowledgement: a publish during a broker outage fails after it, and the
job's cycle is retried.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from kafka import KafkaAdminClient, KafkaProducer
from kafka.errors import KafkaError, TopicAlreadyExistsError

LOCAL_BOOTSTRAP = "127.0.0.1:19092"

_SECURITY_ENV = {
    "KAFKA_SECURITY_PROTOCOL": "security_protocol",
    "KAFKA_SASL_MECHANISM": "sasl_mechanism",
    "KAFKA_SASL_USERNAME": "sasl_plain_username",
    "KAFKA_SASL_PASSWORD": "sasl_plain_password",
    "KAFKA_SSL_CAFILE": "ssl_cafile",
    "KAFKA_SSL_CERTFILE": "ssl_certfile",
    "KAFKA_SSL_KEYFILE": "ssl_keyfile",
}


@dataclass(frozen=True)
class Topics:
    """The topic names trustbeam reads and writes."""

    events: str = "collab-events"
    status: str = "device-status"
    scores: str = "trust-scores"
    rankings: str = "collaborator-rankings"
    dead_letter: str = "dead-letter"

    def partitions(self) -> dict[str, int]:
        """Default partition counts: events and outputs spread by key, dead letters in one."""
        return {self.events: 8, self.status: 4, self.scores: 8, self.rankings: 8, self.dead_letter: 1}


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap: str
    security: Mapping[str, str] = field(default_factory=dict)
    delivery_timeout_s: float = 60.0  # how long a produced record may wait for its acknowledgement

    def __post_init__(self) -> None:
        if not self.delivery_timeout_s >= 1.0:
            raise ValueError(f"KafkaSettings.delivery_timeout_s: must be >= 1 s (got {self.delivery_timeout_s!r})")

    @property
    def delivery_timeout_ms(self) -> int:
        return int(self.delivery_timeout_s * 1000)

    @property
    def request_timeout_ms(self) -> int:
        """A broker request's own limit: at most 15 s, and half the delivery time, so a record gets a retry."""
        return min(15_000, self.delivery_timeout_ms // 2)

    @classmethod
    def resolve(cls, bootstrap: str | None = None, env: Mapping[str, str] = os.environ) -> "KafkaSettings":
        chosen = bootstrap or env.get("KAFKA_BOOTSTRAP") or LOCAL_BOOTSTRAP
        security = {key: env[name] for name, key in _SECURITY_ENV.items() if env.get(name)}
        timeout = env.get("KAFKA_DELIVERY_TIMEOUT_S", "60")
        try:
            delivery_timeout_s = float(timeout)
        except ValueError:
            raise ValueError(f"KAFKA_DELIVERY_TIMEOUT_S: not a number of seconds: {timeout!r}") from None
        return cls(chosen, security, delivery_timeout_s)

    @property
    def is_local(self) -> bool:
        return self.bootstrap == LOCAL_BOOTSTRAP

    def client_args(self) -> dict[str, Any]:
        """Keyword arguments for any kafka-python client."""
        return {"bootstrap_servers": self.bootstrap.split(","), **self.security}

    def java_config(self) -> dict[str, str]:
        """The same settings for Java Kafka clients (Beam's cross-language KafkaIO on Flink/Dataflow).

        SASL credentials become ``sasl.jaas.config`` (PLAIN or SCRAM login module); TLS files are PEM
        (``ssl.truststore.*`` from the CA file; ``ssl.keystore.*`` needs the certificate and key in one
        PEM file, as Java clients read them)."""
        s = self.security
        out = {"bootstrap.servers": self.bootstrap}
        if "security_protocol" in s:
            out["security.protocol"] = s["security_protocol"]
        if "sasl_mechanism" in s:
            out["sasl.mechanism"] = s["sasl_mechanism"]
        if "sasl_plain_username" in s or "sasl_plain_password" in s:
            module = ("org.apache.kafka.common.security.scram.ScramLoginModule"
                      if s.get("sasl_mechanism", "PLAIN").startswith("SCRAM") else
                      "org.apache.kafka.common.security.plain.PlainLoginModule")
            user, password = (json.dumps(s.get(k, "")) for k in ("sasl_plain_username", "sasl_plain_password"))
            out["sasl.jaas.config"] = f"{module} required username={user} password={password};"
        if "ssl_cafile" in s:
            out.update({"ssl.truststore.type": "PEM", "ssl.truststore.location": s["ssl_cafile"]})
        if "ssl_certfile" in s or "ssl_keyfile" in s:
            if s.get("ssl_certfile") != s.get("ssl_keyfile"):
                raise ValueError("KAFKA_SSL_CERTFILE/KAFKA_SSL_KEYFILE: Java clients need the certificate and key "
                                 "in one PEM file; point both variables at it")
            out.update({"ssl.keystore.type": "PEM", "ssl.keystore.location": s["ssl_certfile"]})
        return out

    def librdkafka_config(self) -> dict[str, str]:
        """The same settings for librdkafka clients (confluent-kafka: the local cycles' source)."""
        names = {"security_protocol": "security.protocol", "sasl_mechanism": "sasl.mechanism",
                 "sasl_plain_username": "sasl.username", "sasl_plain_password": "sasl.password",
                 "ssl_cafile": "ssl.ca.location", "ssl_certfile": "ssl.certificate.location",
                 "ssl_keyfile": "ssl.key.location"}
        return {"bootstrap.servers": self.bootstrap, **{names[k]: v for k, v in self.security.items()}}

    def __repr__(self) -> str:
        return (f"KafkaSettings(bootstrap={self.bootstrap!r}, security={sorted(self.security)!r}, "
                f"delivery_timeout_s={self.delivery_timeout_s!r})")


def admin(settings: KafkaSettings, timeout_s: float = 10.0) -> KafkaAdminClient:
    return KafkaAdminClient(**settings.client_args(), request_timeout_ms=int(timeout_s * 1000))


def wait_until_answering(settings: KafkaSettings, timeout_s: float = 10.0) -> None:
    """Block until the brokers answer a metadata request, or raise TimeoutError."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        if not _accepts_connections(settings.bootstrap):
            time.sleep(0.05)
            continue
        try:
            client = admin(settings, timeout_s=2.0)
            try:
                client.list_topics()
                return
            finally:
                client.close()
        except (KafkaError, OSError) as error:
            last = error
            time.sleep(0.1)
    raise TimeoutError(f"Kafka at {settings.bootstrap} did not answer within {timeout_s} s: {last}")


def _accepts_connections(bootstrap: str) -> bool:
    """Whether any bootstrap address accepts a TCP connection (checked before a Kafka client logs errors)."""
    for address in bootstrap.split(","):
        host, _, port = address.strip().rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=0.5):
                return True
        except (OSError, ValueError):
            continue
    return False


def ensure_topics(settings: KafkaSettings, partitions: Mapping[str, int]) -> list[str]:
    """Create the topics that do not exist yet; returns the names created."""
    from kafka.admin import NewTopic

    client = admin(settings)
    try:
        existing = set(client.list_topics())
        missing = [name for name in partitions if name not in existing]
        for name in missing:
            try:
                client.create_topics([NewTopic(name, partitions[name], 1)])
            except TopicAlreadyExistsError:
                pass
        return missing
    finally:
        client.close()


def check_topics(settings: KafkaSettings, topics: Topics) -> None:
    """Raise ValueError naming the option of each topic the brokers do not have (checked before submission)."""
    client = admin(settings)
    try:
        existing = set(client.list_topics())
    finally:
        client.close()
    missing = [f"--{name}_topic: topic {getattr(topics, name)!r}" for name in ("events", "status", "scores",
                                                                            "rankings", "dead_letter")
               if getattr(topics, name) not in existing]
    if missing:
        raise ValueError(f"{'; '.join(missing)}: not found at {settings.bootstrap} (create them, e.g. "
                         "`trustbeam broker start` locally, or name existing topics)")


def producer_config(settings: KafkaSettings, **overrides: Any) -> dict[str, Any]:
    """librdkafka's settings for trustbeam's producers (:class:`exporters.kafka.KafkaSink`): idempotent, acks=all,
    bounded retries and delivery time, and keyed records partitioned by murmur2 as Java's clients and kafka-python
    partition them (librdkafka's own default hashes differently), so one owner's records land where consumers and
    the job's tail reads expect them."""
    return {**settings.librdkafka_config(), "enable.idempotence": True, "acks": "all", "linger.ms": 20,
            "batch.size": 262_144, "max.in.flight.requests.per.connection": 5,
            "request.timeout.ms": settings.request_timeout_ms, "message.timeout.ms": settings.delivery_timeout_ms,
            "partitioner": "murmur2_random", **overrides}


def make_producer(settings: KafkaSettings, **overrides: Any) -> KafkaProducer:
    """A kafka-python producer, idempotent with acks=all and bounded retries, for sending single records by hand
    (tools and tests); trustbeam's own output goes through :class:`exporters.kafka.KafkaSink` (librdkafka)."""
    config: dict[str, Any] = dict(
        acks="all",
        enable_idempotence=True,
        retries=5,
        linger_ms=20,
        batch_size=262_144,
        max_in_flight_requests_per_connection=5,
        request_timeout_ms=settings.request_timeout_ms,
        delivery_timeout_ms=settings.delivery_timeout_ms,
        compression_type=None,
    )
    config.update(overrides)
    return KafkaProducer(**settings.client_args(), **config)


def read_to_end(settings: KafkaSettings, topic: str, timeout_s: float = 30.0) -> list[Any]:
    """Every record of a topic, from the beginning to the end offsets seen at the call, in partition order."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**settings.client_args(), enable_auto_commit=False, consumer_timeout_ms=1000)
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise KeyError(f"topic {topic!r} does not exist at {settings.bootstrap}")
        assigned = [TopicPartition(topic, p) for p in sorted(partitions)]
        ends = end_offsets(consumer, assigned)
        consumer.assign(assigned)
        consumer.seek_to_beginning(*assigned)
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < ends[tp] for tp in assigned):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic!r}: {len(records)} records after {timeout_s} s, not at the end")
            for tp, batch in consumer.poll(timeout_ms=500).items():
                records.extend(r for r in batch if r.offset < ends[tp])
        return records
    finally:
        consumer.close()


def end_offsets(consumer: Any, partitions: list[Any], timeout_s: float = 10.0) -> dict[Any, int]:
    """The offset after each partition's last record.

    Tansu 0.6 answers ListOffsets(latest) with the base offset of the last record batch, not the high
    watermark; its fetch responses carry the right one. So each partition with records is read from the
    reported end through the high watermark its fetches report, and its end is the larger of that and
    the last record read + 1: a wait on that condition (bounded by ``timeout_s``), not a fixed pause;
    on Apache Kafka the reported end and the high watermark agree. Changes the consumer's assignment.
    """
    reported = consumer.end_offsets(partitions)
    ends = dict(reported)
    pending = {tp for tp in partitions if reported[tp]}
    if not pending:
        return ends
    consumer.assign(sorted(pending))
    for tp in pending:
        consumer.seek(tp, reported[tp])
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        for tp, records in consumer.poll(timeout_ms=100).items():  # what lies past the reported end counts too
            if records:
                ends[tp] = max(ends[tp], records[-1].offset + 1)
        for tp in list(pending):
            highwater = consumer.highwater(tp)
            if highwater is not None and consumer.position(tp) >= highwater:  # read through to it
                ends[tp] = max(ends[tp], highwater)
                pending.discard(tp)
    if pending:
        raise TimeoutError(f"no fetch answered for {sorted(f'{tp.topic}/{tp.partition}' for tp in pending)} within "
                           f"{timeout_s} s")
    return ends
