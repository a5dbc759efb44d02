"""Pipeline assembly: the bounded catch-up cycle (local runners) and the streaming job (``--kafka_io=xlang``).

Both wrap the same :class:`~beam_pipeline.transforms.ScoreSlots`; they differ only in how records
come in and go out:

* :func:`cycle_pipeline` reads the planned offset ranges with the kafka-python source and publishes
  the closed, unpublished slots of the cycle in slot order (:mod:`beam_pipeline.run` drives it).
* :func:`streaming_pipeline` reads with Beam's cross-language KafkaIO (Java; Flink or Dataflow,
  where its jars are available), offsets committed when the runner finalizes a checkpoint, and
  publishes each slot as the watermark closes it, late updates marked ``is_update``. Its jars
  cannot be fetched on the development machine, so it is built but not run there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
from kafka.partitioner.default import murmur2

from beam_pipeline.kafka_io import PartitionRange, ProduceRecords, RawBatch, ReadKafka
from beam_pipeline.options import JobConfig, TrustbeamOptions
from beam_pipeline.parquet_io import ReadParquet
from beam_pipeline.transforms import ScoreSlots, outputs, wire_records
from exporters.kafka import message
from exporters.parquet import ParquetResults
from model.scoring import EvidenceSnapshot, SlotScores
from trustbeam.kafka import KafkaSettings

XLANG_BATCH = 5000
CLOSED = "closed"  # PublishClosed's side output: the SlotScores it publishes


def identity(body: dict[str, Any]) -> tuple:
    """Order of output records within a partition: (slot, owner, collaborator)."""
    return body["slot"], body["owner"], body.get("collaborator", "")


class PublishClosed(beam.DoFn):
    """All SlotScores of a cycle -> the wire records of the closed, unpublished slots, in identity order
    (slot, owner, collaborator).

    ``marks`` are the identities of the last record in each output partition: records at or
    before them were sent by a cycle that died before saving its ledger, and are not sent again.
    """

    def __init__(self, config: JobConfig, published_through: int, final: bool, partitions: dict[str, int],
                 marks: dict[tuple[str, int], tuple], out_dir: str) -> None:
        self.config, self.published_through, self.final = config, published_through, final
        self.partitions, self.marks, self.out_dir = partitions, marks, out_dir

    def process(self, results: list, newest_ms: int) -> Iterator[Any]:
        clock = self.config.stages()[0].config.clock
        lateness_ms = self.config.lateness_slots * clock.slot_ms
        published = []
        for result in sorted(results, key=lambda r: r.slot):
            closed = self.final or int(clock.end_ms(result.slot)) + lateness_ms <= newest_ms
            if result.slot <= self.published_through or not closed:
                continue
            published.append(result.slot)
            yield beam.pvalue.TaggedOutput(CLOSED, result)
            # identity order within each partition, so that a partition's tail marks a prefix of the slot
            for topic, record in sorted(outputs(result, self.config.topics), key=lambda o: identity(vars(o[1]))):
                partition = (murmur2(record.owner.encode()) & 0x7FFFFFFF) % self.partitions[topic]
                mark = self.marks.get((topic, partition))
                if mark is not None and identity(vars(record)) <= mark:
                    continue
                yield message(topic, record)
        Path(self.out_dir, "published.json").write_text(json.dumps(published))


class WriteParquet(beam.DoFn):
    """Each slot's results to Parquet (exporters.parquet): atomic, one file per slot and table."""

    def __init__(self, root: str) -> None:
        self.results = ParquetResults(root)
        self.files = Metrics.counter("trustbeam", "parquet_files")

    def process(self, result: SlotScores) -> None:
        self.files.inc(len(self.results.write(result)))


class WriteJson(beam.DoFn):
    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, items: list) -> None:
        Path(self.path).write_text(json.dumps(items))


class WriteEvidence(beam.DoFn):
    """The shards' final evidence, merged into one snapshot file (the driver keeps it for the next cycle)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, shards: list) -> None:
        if shards:
            EvidenceSnapshot.merge([snapshot for _, snapshot in shards]).save(self.path)


class WriteStatuses(beam.DoFn):
    """The cycle's valid statuses, as one Parquet file (the driver keeps what the next cycle needs)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, tables: list) -> None:
        if tables:
            pq.write_table(pa.concat_tables(tables), self.path)


def cycle_pipeline(options: PipelineOptions, settings: KafkaSettings, config: JobConfig,
                   ranges: list[PartitionRange], published_through: int, final: bool, partitions: dict[str, int],
                   marks: dict[tuple[str, int], tuple], work: str, status_snapshot: str | None = None,
                   evidence_snapshot: str | None = None, max_batch: int = 5000) -> beam.Pipeline:
    """One bounded cycle; writes ``published.json``, ``offsets.json`` (min offset per slot),
    ``status.parquet`` (the statuses it read) and ``evidence.npz`` (the shards' final evidence) to
    ``work``. ``status_snapshot`` carries the statuses an earlier cycle kept, read as already-seen
    input; ``evidence_snapshot`` the final evidence an earlier cycle kept, seeding the shards."""
    topics = config.topics
    p = beam.Pipeline(options=options)
    ahead_ms = config.max_future_s * 1000
    raw_events = p | "ReadEvents" >> ReadKafka(settings, [r for r in ranges if r.topic == topics.events], max_batch,
                                               ahead_ms)
    raw_status = p | "ReadStatus" >> ReadKafka(settings, [r for r in ranges if r.topic == topics.status], max_batch,
                                               ahead_ms)
    if status_snapshot:
        kept = p | "KeptStatus" >> ReadParquet([status_snapshot], seen=True)
        raw_status = (raw_status, kept) | "AllStatus" >> beam.Flatten()
    inputs = (raw_events, raw_status)
    if evidence_snapshot:
        snapshot = EvidenceSnapshot.load(evidence_snapshot)
        seeds = [(k, ("evidence", snapshot.select(k, config.shards))) for k in range(config.shards)]
        inputs += (p | "KeptEvidence" >> beam.Create(seeds),)
    out = inputs | "Score" >> ScoreSlots(config, published_through)
    newest = out["newest"] | "Newest" >> beam.CombineGlobally(max).without_defaults()
    closed = (out["scores"] | "AllSlots" >> beam.combiners.ToList()
              | "Closed" >> beam.ParDo(PublishClosed(config, published_through, final, partitions, marks, work),
                                       newest_ms=beam.pvalue.AsSingleton(newest, default_value=-1))
              .with_outputs(CLOSED, main="records"))
    records = closed.records
    if config.parquet_out:
        closed[CLOSED] | "Parquet" >> beam.ParDo(WriteParquet(config.parquet_out))
    records | "Publish" >> beam.ParDo(ProduceRecords(settings, "published"))
    out["dead"] | "DeadLetter" >> beam.ParDo(ProduceRecords(settings, "dead_letters"))
    (out["offsets"] | "MinOffset" >> beam.CombinePerKey(min) | "Offsets" >> beam.combiners.ToList()
     | "WriteOffsets" >> beam.ParDo(WriteJson(str(Path(work, "offsets.json")))))
    (out["statuses"] | "Statuses" >> beam.combiners.ToList()
     | "WriteStatuses" >> beam.ParDo(WriteStatuses(str(Path(work, "status.parquet")))))
    (out["evidence"] | "LastFold" >> beam.CombinePerKey(lambda kept: max(kept, key=lambda s: s.folded_through))
     | "Evidence" >> beam.combiners.ToList() | "WriteEvidence" >> beam.ParDo(WriteEvidence(str(Path(work, "evidence.npz")))))
    return p


def _batches(topic: str) -> beam.PTransform:
    """Beam KafkaIO records (with metadata) -> RawBatch per partition."""

    def to_batch(element: tuple[int, list]) -> RawBatch:
        partition, records = element
        records = sorted(records, key=lambda r: r.offset)
        return RawBatch(topic, partition, np.array([r.offset for r in records], np.int64),
                        np.array([r.timestamp for r in records], np.int64), [r.value for r in records], 0)

    return (beam.Map(lambda r: (r.partition, r)) | beam.GroupIntoBatches(XLANG_BATCH, max_buffering_duration_secs=1)
            | beam.Map(to_batch))


def streaming_pipeline(options: PipelineOptions, settings: KafkaSettings, config: JobConfig) -> beam.Pipeline:
    """The unbounded job on Beam's Java KafkaIO (Flink/Dataflow)."""
    from apache_beam.io.kafka import ReadFromKafka, WriteToKafka

    topics = config.topics
    consumer_config = {**settings.java_config(), "group.id": "trustbeam-run", "auto.offset.reset": "earliest"}
    producer_config = {**settings.java_config(), "enable.idempotence": "true", "acks": "all"}
    expansion = options.view_as(TrustbeamOptions).kafka_expansion_service  # None: Beam starts one from its jar
    p = beam.Pipeline(options=options)
    raw = {}
    for name, topic in (("Events", topics.events), ("Status", topics.status)):
        raw[name] = (p | f"Read{name}" >> ReadFromKafka(consumer_config, [topic], with_metadata=True,
                                                         commit_offset_in_finalize=True, timestamp_policy="CreateTime",
                                                         expansion_service=expansion)
                     | f"Batch{name}" >> _batches(topic))
    out = (raw["Events"], raw["Status"]) | "Score" >> ScoreSlots(config)
    records = out["scores"] | "Wire" >> beam.FlatMap(wire_records, config.topics)
    if config.parquet_out:
        out["scores"] | "Parquet" >> beam.ParDo(WriteParquet(config.parquet_out))
    letters = out["dead"]
    for name, pcoll, topic in (("Scores", records, topics.scores), ("Rankings", records, topics.rankings),
                               ("DeadLetter", letters, topics.dead_letter)):
        (pcoll | f"Only{name}" >> beam.Filter(lambda r, t=topic: r[0] == t)
         | f"Row{name}" >> beam.Map(lambda r: beam.Row(key=r[1], value=r[2],
                                                       headers=[beam.Row(key=k, value=v) for k, v in r[3]]))
         | f"Write{name}" >> WriteToKafka(producer_config, topic, with_headers=True, expansion_service=expansion))
    return p
