"""Against the real local broker: start/stop, topics, and a simulated run published and read back."""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import replace

import pytest
from kafka import KafkaConsumer

from deploy.local.broker import LocalBroker
from exporters.kafka import DeliveryError, KafkaSink, message
from schemas import CollaborationEvent, DeviceStatus, TrustScore, from_json
from simulator.config import SimConfig
from simulator.engine import Simulator
from simulator.publish import KafkaPublisher
from deploy.local.broker import free_port
from trustbeam.cli import main
from exporters.kafka_client import LOCAL_BOOTSTRAP, KafkaSettings, Topics, ensure_topics, producer_config, read_to_end

pytestmark = pytest.mark.kafka


def test_settings_resolution_and_secrets_stay_out_of_repr() -> None:
    env = {"KAFKA_BOOTSTRAP": "k1:9092,k2:9092", "KAFKA_SASL_PASSWORD": "hunter2", "KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}
    settings = KafkaSettings.resolve(env=env)
    assert settings.client_args() == {"bootstrap_servers": ["k1:9092", "k2:9092"],
                                      "sasl_plain_password": "hunter2", "security_protocol": "SASL_SSL"}
    assert "hunter2" not in repr(settings) and "hunter2" not in str(settings)
    assert KafkaSettings.resolve("b:1", env=env).bootstrap == "b:1"
    assert KafkaSettings.resolve(env={}).bootstrap == LOCAL_BOOTSTRAP
    assert KafkaSettings.resolve(env={}).delivery_timeout_s == 60.0
    short = KafkaSettings.resolve(env={"KAFKA_DELIVERY_TIMEOUT_S": "4"})
    assert producer_config(short)["message.timeout.ms"] == 4000 and producer_config(short)["request.timeout.ms"] == 2000
    with pytest.raises(ValueError, match="KAFKA_DELIVERY_TIMEOUT_S.*'soon'"):
        KafkaSettings.resolve(env={"KAFKA_DELIVERY_TIMEOUT_S": "soon"})
    with pytest.raises(ValueError, match="delivery_timeout_s.*0.5"):
        KafkaSettings.resolve(env={"KAFKA_DELIVERY_TIMEOUT_S": "0.5"})


def test_topics_are_created_with_their_partitions(broker: LocalBroker) -> None:
    topics = Topics(events="t-events", status="t-status", scores="t-scores", rankings="t-rankings",
                    dead_letter="t-dead")
    created = ensure_topics(broker.settings, topics.partitions())
    assert sorted(created) == sorted(topics.partitions())
    assert ensure_topics(broker.settings, topics.partitions()) == []
    consumer = KafkaConsumer(**broker.settings.client_args())
    try:
        assert {name: len(consumer.partitions_for_topic(name)) for name in topics.partitions()} == topics.partitions()
    finally:
        consumer.close()


def test_simulated_run_is_published_complete_and_valid(broker: LocalBroker) -> None:
    topics = Topics(events="sim-events", status="sim-status")
    ensure_topics(broker.settings, topics.partitions())
    config = SimConfig(devices=60, tasks=1500, slots=10, seed=11, status_every=5)

    class Expect:
        events: list = []

        def write(self, kind, table):
            if kind == "events":
                self.events.extend(table.to_pylist())

        def close(self):
            pass

    expect = Expect()
    publisher = KafkaPublisher(broker.settings, topics)
    Simulator(config).run([publisher, expect])
    assert publisher.counts() == {"events_published": 1500, "status_published": 120, "delivery_failures": 0}

    records = read_to_end(broker.settings, topics.events)
    events = [from_json(CollaborationEvent, r.value) for r in records]
    assert sorted(e.event_id for e in events) == sorted(e["event_id"] for e in expect.events)
    assert all(r.key.decode() == e.collaborator for r, e in zip(records, events))
    assert all(dict(r.headers) == {"schema_version": b"1", "record": b"collaboration_event"} for r in records)
    by_id = {e["event_id"]: e for e in expect.events}
    assert all(by_id[e.event_id]["tr_success"] == e.tr_success and by_id[e.event_id]["voc"] == e.voc for e in events)
    # one collaborator's events land on one partition, in event-time order
    for partition in {r.partition for r in records}:
        times: dict[str, list[int]] = {}
        for r, e in zip(records, events):
            if r.partition == partition:
                times.setdefault(e.collaborator, []).append(e.event_time_ms)
        assert all(t == sorted(t) for t in times.values())
    status = [from_json(DeviceStatus, r.value) for r in read_to_end(broker.settings, topics.status)]
    assert len(status) == 120 and {s.device for s in status} == {f"dev-{i:06d}" for i in range(60)}


def test_broker_lifecycle_start_status_stop(tmp_path) -> None:
    broker = LocalBroker(port=free_port(), state_dir=tmp_path)
    assert broker.status().pid is None
    started = broker.start()
    assert started.answering and started.pid and broker.pid_file.exists()
    assert broker.start().pid == started.pid  # idempotent: a running broker is reused
    # a second handle (as a new CLI process would have) sees and stops it by PID
    other = LocalBroker(port=broker.port, state_dir=tmp_path)
    assert other.status().answering
    assert other.stop() is True
    assert other.status().pid is None and not broker.pid_file.exists()
    assert other.stop() is False


def test_cli_broker_and_publish(tmp_path, capsys, monkeypatch) -> None:
    port = free_port()
    monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path))
    try:
        assert main(["broker", "start", "--port", str(port)]) == 0
        assert "topics created: collab-events" in capsys.readouterr().out
        assert main(["broker", "status", "--port", str(port)]) == 0
        assert main(["simulate", "--devices", "20", "--tasks", "100", "--slots", "4", "--publish",
                     "--bootstrap", f"127.0.0.1:{port}"]) == 0
        assert '"events_published": 100' in capsys.readouterr().out
        assert len(read_to_end(KafkaSettings(f"127.0.0.1:{port}"), "collab-events")) == 100
        # stopped under another state directory: say what answers on the port and how to stop it
        monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path / "elsewhere"))
        assert main(["broker", "stop", "--port", str(port)]) == 3
        said = capsys.readouterr().out
        assert f"not running under {tmp_path / 'elsewhere'}" in said and "a Tansu broker" in said
        assert f"TRUSTBEAM_STATE_DIR={tmp_path} trustbeam broker stop --port {port}" in said and "kill -INT" in said
        monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path))
    finally:
        assert main(["broker", "stop", "--port", str(port)]) == 0
    assert main(["broker", "status", "--port", str(port)]) == 3
    assert main(["broker", "stop", "--port", str(port)]) == 0  # nothing answers: nothing to say but that


def test_delivery_failures_are_raised_not_swallowed(tmp_path) -> None:
    broker = LocalBroker(port=free_port(), state_dir=tmp_path)
    broker.start()
    ensure_topics(broker.settings, Topics().partitions())
    publisher = KafkaPublisher(replace(broker.settings, delivery_timeout_s=3.0))
    os.kill(broker.pid(), signal.SIGKILL)
    with pytest.raises(RuntimeError, match="not delivered|undelivered|cannot publish"):
        Simulator(SimConfig(devices=10, tasks=20, slots=1)).run([publisher])
    broker.stop()


def test_the_sink_keys_by_owner_and_labels_the_schema(broker: LocalBroker) -> None:
    topic = "sink-check"
    ensure_topics(broker.settings, {topic: 4})
    score = TrustScore(owner="dev-000007", collaborator="dev-000009", slot=3, slot_start_ms=180_000,
                       slot_end_ms=240_000, t_beh=0.5, t_res=0.9, trust=0.45, model_version="bm-x", is_update=False)
    sink = KafkaSink(broker.settings)
    sink.send(message(topic, score))
    sink.close()
    (record,) = read_to_end(broker.settings, topic)
    assert record.key == b"dev-000007" and from_json(TrustScore, record.value) == score
    assert dict(record.headers) == {"schema_version": str(TrustScore.SCHEMA_VERSION).encode(), "record": b"trust_score"}
    assert sink.counts() == {"sent": 1, "delivered": 1, "failed": 0}


def test_sink_delivery_failures_are_counted_and_raised(tmp_path) -> None:
    broker = LocalBroker(port=free_port(), state_dir=tmp_path)
    broker.start()
    ensure_topics(broker.settings, {"doomed": 1})
    failures: list[int] = []
    sink = KafkaSink(replace(broker.settings, delivery_timeout_s=3.0), on_failure=failures.append)
    os.kill(broker.pid(), signal.SIGKILL)
    with pytest.raises(DeliveryError, match="not delivered|undelivered|cannot produce"):
        for n in range(5):
            sink.send(("doomed", b"k", b"v%d" % n, []))
        sink.flush()
    assert sink.failed == 5 and sum(failures) == 5 and sink.delivered == 0
    with pytest.raises(DeliveryError):  # nothing was delivered since: a send now fails at the flush of close
        sink.send(("doomed", b"k", b"late", []))
        sink.close()
    broker.stop()


def test_secrets_never_reach_logs_or_errors(monkeypatch, capsys, caplog, tmp_path) -> None:
    secret = "hunter2-very-secret"
    monkeypatch.setenv("KAFKA_SASL_PASSWORD", secret)
    monkeypatch.setenv("KAFKA_SASL_USERNAME", "trustbeam")
    monkeypatch.setenv("KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path))
    caplog.set_level(logging.DEBUG)
    settings = KafkaSettings.resolve(f"127.0.0.1:{free_port()}")  # nobody listens there
    assert settings.java_config()["sasl.jaas.config"].endswith(f'password="{secret}";')  # handed to clients only
    assert main(["run", "--until-end", "--bootstrap", settings.bootstrap, "--checkpoint", str(tmp_path)]) == 2
    assert main(["simulate", "--devices", "5", "--tasks", "5", "--slots", "1", "--publish", "--bootstrap",
                 settings.bootstrap, "--out", str(tmp_path / "sim")]) == 2
    out = capsys.readouterr()
    seen = out.out + out.err + "\n".join(f"{r.getMessage()} {r.args}" for r in caplog.records)
    assert "error" in out.err and secret not in seen and secret not in repr(settings)
