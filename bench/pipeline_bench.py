"""The streaming job's speed: batched versus one element per event, from Kafka and from Parquet.

Side by side in one run, each case in its own process (its own peak RSS):

* ``raw consume``: kafka-python alone reading the events topic (the reference for ``vs raw consume``).
* ``raw consume librdkafka``: confluent-kafka alone, the client of the job's local source.
* ``kafka ingest batched`` / ``kafka ingest per-event``: the job's event path (Kafka source, parse and
  validate, dedup, slot close: T_col edges, slot graph, GNN embeddings), record batches of up to
  5,000 or of one record (FnApiRunner).
* ``parquet ingest batched`` / ``parquet ingest per-event``: the same path fed from the Parquet file.
* ``kafka end to end``: one ``trustbeam run --until-end`` cycle: the above plus statuses, shard
  state, BiMamba, pair head, ranking and publishing to the output topics, the model on PyTorch's default
  threads (every core; ``--model_threads 0``, the default); ``kafka end to end, model threads 1`` the same with
  the model on one thread, as deployments with a worker per core run it. With ``--busy``, both again while
  another process keeps every core busy (PyTorch GEMMs on its default threads: a training run, say).
* ``follow latency``: ``--follow`` cycles while a publisher sends slot after slot; the time from
  the event that closes a slot (the first one past its end + the allowed lateness) being sent to
  the slot's rankings being on the topic; ``per_slot_s`` lists it slot by slot, in order.

The per-event cases run on the first ``--per-event`` events (their rate is what compares).
Scoring costs the same per slot whatever the event count (it scales with devices x S); the end-to-end
row reports it as ``scoring_s``: the shards' frames (evidence, and the sequence encoder where the model reads it)
plus the pairs (candidates and head), without the ranking and records. Run:
``python -m bench.pipeline_bench [--sizes 100000 1000000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from bench.report import emit, peak_rss_kb

DEVICES, SLOTS = 500, 100


def sim_config(events: int):
    from simulator.config import SimConfig

    return SimConfig(devices=DEVICES, tasks=events, slots=SLOTS, status_every=10, seed=1)


def prepare(work: Path, events: int, per_event: int) -> dict:
    """Simulate to Parquet (full run and the per-event prefix) and write an untrained checkpoint."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import torch

    from model.bm import BM, BMConfig
    from model.checkpoint import save
    from model.graphs import DeviceIndex
    from simulator.engine import Simulator
    from simulator.parquet_sink import ParquetSink
    from simulator.world import device_ids

    config = sim_config(events)
    Simulator(config).run([ParquetSink(work / "full")])
    (work / "prefix").mkdir(exist_ok=True)
    table = pq.read_table(work / "full" / "events.parquet")
    pq.write_table(table.slice(0, per_event), work / "prefix" / "events.parquet")
    status = pq.read_table(work / "full" / "status.parquet")
    last = int(pc.max(table.slice(0, per_event)["slot"]).as_py())
    pq.write_table(status.filter(pc.less(status["time_ms"], config.clock.end_ms(last))),
                   work / "prefix" / "status.parquet")
    torch.manual_seed(0)
    features = np.random.default_rng(0).normal(size=(DEVICES, BMConfig().node2vec.dim)).astype(np.float32)
    save(BM(replace(BMConfig(), clock=config.clock), features),
         DeviceIndex(tuple(device_ids(DEVICES).to_pylist())), work / "model")
    return {"events": table.num_rows, "status_rows": status.num_rows}


def publish(bootstrap: str, topics, directory: Path) -> float:
    """Produce a run's Parquet rows with the simulator's publisher (keyed, event-time stamped); returns msg/s."""
    import pyarrow.parquet as pq

    from simulator.publish import KafkaPublisher
    from exporters.kafka_client import KafkaSettings

    publisher = KafkaPublisher(KafkaSettings(bootstrap), topics)
    started = time.perf_counter()
    for kind in ("status", "events"):
        publisher.write(kind, pq.read_table(directory / f"{kind}.parquet"))
    publisher.close()
    return sum(publisher.sent.values()) / (time.perf_counter() - started)


def case(kind: str, work: Path, bootstrap: str, tag: str) -> dict:
    """Child process: one measured case."""
    from exporters.kafka_client import KafkaSettings, Topics

    topics = Topics(*(f"{n}-{tag}" for n in ("events", "status", "scores", "rankings", "dead")))
    settings = KafkaSettings(bootstrap)
    if kind == "raw consume":
        from kafka import KafkaConsumer, TopicPartition

        from exporters.kafka_client import end_offsets

        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        tps = [TopicPartition(topics.events, p) for p in sorted(consumer.partitions_for_topic(topics.events))]
        ends = end_offsets(consumer, tps)
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        started, count = time.perf_counter(), 0
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            count += sum(len(r) for r in consumer.poll(timeout_ms=500, max_records=5000).values())
        consumer.close()
        return {"events": count, "seconds": time.perf_counter() - started}
    if kind == "raw consume librdkafka":
        return raw_librdkafka(settings, topics.events)
    imported = time.perf_counter()  # every case times its work, not importing its modules (Beam, PyTorch: ~4 s)
    import beam_pipeline.transforms  # noqa: F401
    from beam_pipeline.options import JobConfig
    from beam_pipeline.run import Ledger, run_cycle

    started, import_s = time.perf_counter(), time.perf_counter() - imported
    config = JobConfig(str(work / "model"), topics=topics, model_threads=1 if "threads 1" in kind else 0)
    if kind.startswith("kafka end to end"):
        _, report = run_cycle(settings, config, Ledger(), final=True,
                              snapshot_dir=work / f"snap-{tag}-{config.model_threads}")
        c = report.counters
        return {"events": c.get("events_read", 0), "seconds": time.perf_counter() - started, "import_s": import_s,
                "scoring_s": (c.get("scoring_ms", 0) + c.get("sequence_ms", 0)) / 1000,
                "records_published": report.records_published}
    counters = ingest(config, settings, kind, work, 1 if kind.endswith("per-event") else None)
    return {"events": counters.get("events_read", 0), "seconds": time.perf_counter() - started, "import_s": import_s,
            "slots": counters.get("slots_closed", 0)}


def raw_librdkafka(settings, topic: str) -> dict:
    """confluent-kafka alone (the job's local source's client) reading every partition to its end."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({**settings.librdkafka_config(), "group.id": "bench", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    started, count, left = time.perf_counter(), 0, set(partitions)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    while left:
        for m in consumer.consume(5000, timeout=0.5):
            if m.error() is None:
                count += 1
                m.value(), m.offset(), m.timestamp()
            elif m.error().code() == KafkaError._PARTITION_EOF:
                left.discard(m.partition())
    consumer.close()
    return {"events": count, "seconds": time.perf_counter() - started}


def ingest(config, settings, kind: str, work: Path, max_batch: int | None) -> dict:
    """The event path alone: source -> ParseEvents -> CloseSlot (slot parts), counted."""
    import apache_beam as beam

    from beam_pipeline.cycle import CycleOptions, local_runner_settings
    from beam_pipeline.kafka_io import ReadKafka, plan
    from beam_pipeline.parquet_io import ReadParquet
    from beam_pipeline.transforms import DEAD, CloseSlot, ParseEvents

    local_runner_settings()  # as the job's cycles run
    p = beam.Pipeline(options=CycleOptions(runner="FnApiRunner"))
    if kind.startswith("kafka"):
        ranges = plan(settings, [config.topics.events], {}, {}).ranges
        raw = p | ReadKafka(settings, ranges, max_batch or 5000)
    else:
        directory = work / ("prefix" if max_batch == 1 else "full")
        raw = p | ReadParquet([str(directory / "events.parquet")], max_batch or 20_000)
    slots = raw | beam.ParDo(ParseEvents(config)).with_outputs(DEAD, main="slots")
    parts = slots.slots | beam.ParDo(CloseSlot(config)).with_outputs(DEAD, main="parts")
    parts.parts | beam.combiners.Count.Globally()
    result = p.run()
    result.wait_until_finish()
    return {m.key.metric.name: m.committed for m in result.metrics().query()["counters"]}


def follow_latency(work: Path, bootstrap: str, tag: str, slots: int = 22, pace_s: float = 3.0) -> dict:
    """Publish slot after slot while --follow cycles run; latency from a slot's closing event to its rankings."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from kafka import KafkaConsumer

    from beam_pipeline.options import JobConfig
    from beam_pipeline.run import run
    from simulator.publish import KafkaPublisher
    from exporters.kafka_client import KafkaSettings, Topics, ensure_topics

    settings = KafkaSettings(bootstrap)
    topics = Topics(*(f"{n}-{tag}" for n in ("events", "status", "scores", "rankings", "dead")))
    ensure_topics(settings, topics.partitions())
    config = JobConfig(str(work / "model"), topics=topics)
    events = pq.read_table(work / "full" / "events.parquet")
    status = pq.read_table(work / "full" / "status.parquet")
    os.environ["TRUSTBEAM_STATE_DIR"] = str(work / f"state-{tag}")
    stop = threading.Event()
    seen: dict[int, float] = {}
    failed: list[BaseException] = []

    def job() -> None:
        try:
            for _ in run(settings, config, "bench", follow=True, poll_s=0.5):
                if stop.is_set():
                    return
        except BaseException as error:  # noqa: BLE001 - reported by the main thread
            failed.append(error)

    def watch() -> None:
        consumer = KafkaConsumer(topics.rankings, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
        while not stop.is_set():
            for records in consumer.poll(timeout_ms=200).values():
                for record in records:
                    seen.setdefault(json.loads(record.value)["slot"], time.perf_counter())
        consumer.close()

    threads = [threading.Thread(target=job, daemon=True), threading.Thread(target=watch, daemon=True)]
    for thread in threads:
        thread.start()
    publisher = KafkaPublisher(settings, topics)
    clock = config.stages()[0].config.clock
    sent: dict[int, float] = {}
    for slot in range(slots):
        publisher.write("status", status.filter(pc.equal(status["time_ms"], clock.start_ms(slot))))
        publisher.write("events", events.filter(pc.equal(events["slot"], slot)))
        publisher.sink.flush()
        sent[slot] = time.perf_counter()
        time.sleep(pace_s)
    publisher.close()
    deadline = time.perf_counter() + 120
    closable = [s for s in range(slots) if s + 2 < slots]  # lateness 1: slot s closes with slot s + 2
    while time.perf_counter() < deadline and not all(s in seen for s in closable) and not failed:
        time.sleep(0.5)
    stop.set()
    # the job stops after its cycle in flight: wait for it, so the process never exits with a Beam pipeline
    # running in a daemon thread (on a loaded machine that exit failed with status 1)
    for thread in threads:
        thread.join(timeout=600)
    if failed:
        raise RuntimeError(f"the --follow job failed: {failed[0]!r}") from failed[0]
    latencies = np.array([seen[s] - sent[s + 2] for s in closable if s in seen])  # in slot order: a trend shows
    if len(latencies) < len(closable):
        raise RuntimeError(f"only slots {sorted(seen)} of {closable} were published within 120 s of the last one")
    return {"slots_measured": len(latencies), "p50_s": round(float(np.percentile(latencies, 50)), 2),
            "p95_s": round(float(np.percentile(latencies, 95)), 2), "max_s": round(float(latencies.max()), 2),
            "per_slot_s": [round(float(x), 2) for x in latencies]}


def child(args: argparse.Namespace) -> None:
    figures = (follow_latency(Path(args.work), args.bootstrap, args.tag) if args.case == "follow latency"
               else case(args.case, Path(args.work), args.bootstrap, args.tag))
    figures["peak_rss_mb"] = round(peak_rss_kb() / 1024, 1)
    print(json.dumps(figures))


BUSY = "import torch\na = torch.randn(1024, 1024)\nwhile True:\n    a @ a"  # every core, until killed


def spawn(kind: str, work: Path, bootstrap: str, tag: str) -> dict:
    """Run one case in a child process (beside a process that keeps every core busy, for a "busy machine" case)."""
    command = [sys.executable, "-m", "bench.pipeline_bench", "--child", kind, "--work", str(work),
               "--bootstrap", bootstrap, "--tag", tag]
    load = subprocess.Popen([sys.executable, "-c", BUSY]) if kind.endswith("busy machine") else None
    try:
        out = subprocess.run(command, capture_output=True, text=True)
    finally:
        if load is not None:
            load.kill()
            load.wait()
    if out.returncode != 0:
        raise RuntimeError(f"case {kind!r} exited {out.returncode}: {out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--per-event", type=int, default=10_000, help="events for the per-event cases")
    parser.add_argument("--busy", action="store_true",
                        help="also the end-to-end cases while another process keeps every core busy")
    parser.add_argument("--latency-only", action="store_true",
                        help="only the follow-latency case (the data of the first size is still prepared)")
    parser.add_argument("--child", default=None)
    parser.add_argument("--work", default=None)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--tag", default=None)
    args = parser.parse_args()
    if args.child:
        args.case = args.child
        child(args)
        return

    from deploy.local.broker import LocalBroker
    from exporters.kafka_client import KafkaSettings, Topics, ensure_topics

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = LocalBroker(port=port, state_dir=Path(tmp) / "broker")
        broker.start()
        try:
            for size in args.sizes:
                work = Path(tmp) / f"n{size}"
                work.mkdir()
                made = prepare(work, size, args.per_event)
                for tag, directory in ((f"full{size}", work / "full"), (f"prefix{size}", work / "prefix")):
                    topics = Topics(*(f"{n}-{tag}" for n in ("events", "status", "scores", "rankings", "dead")))
                    ensure_topics(KafkaSettings(broker.bootstrap), topics.partitions())
                    produce_rate = publish(broker.bootstrap, topics, directory)
                raw = None
                for kind, tag in () if args.latency_only else (("raw consume", f"full{size}"),
                                                                ("raw consume librdkafka", f"full{size}"),
                                                                ("kafka ingest batched", f"full{size}"),
                                  ("kafka ingest per-event", f"prefix{size}"),
                                  ("parquet ingest batched", f"full{size}"),
                                  ("parquet ingest per-event", f"prefix{size}"), ("kafka end to end", f"full{size}"),
                                  ("kafka end to end, model threads 1", f"full{size}"),
                                  *((("kafka end to end, busy machine", f"full{size}"),
                                     ("kafka end to end, model threads 1, busy machine", f"full{size}"))
                                    if args.busy else ())):
                    figures = spawn(kind, work, broker.bootstrap, tag)
                    rate = figures["events"] / figures["seconds"]
                    raw = rate if kind == "raw consume" else raw
                    row = {"events_total": made["events"], "case": kind, "events": figures["events"],
                           "seconds": round(figures["seconds"], 2), "events_per_s": round(rate),
                           "vs_raw_consume": round(rate / raw, 3) if kind.startswith(("kafka", "raw consume librdkafka")) else "",
                           "import_s": round(figures.get("import_s", 0), 2) or "",
                           "scoring_s": figures.get("scoring_s", ""),
                           "records_published": figures.get("records_published", ""),
                           "peak_rss_mb": figures["peak_rss_mb"]}
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
            work = Path(tmp) / f"n{args.sizes[0]}"
            latency = spawn("follow latency", work, broker.bootstrap, "latency")
            rows.append({"case": "follow latency (slot close -> rankings)", **latency})
        finally:
            broker.stop()
    emit("pipeline", rows, {"machine": platform.machine(), "cpus": os.cpu_count(), "devices": DEVICES,
                            "slots": SLOTS, "produce_msgs_per_s": round(produce_rate)})


if __name__ == "__main__":
    main()
