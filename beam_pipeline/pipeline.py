"""Pipeline assembly of the streaming job (``--kafka_io=xlang``) and what it shares with the local cycles.

:func:`streaming_pipeline` wraps :class:`~beam_pipeline.transforms.ScoreSlots` with Beam's cross-language
KafkaIO (Java; Flink or Dataflow, where its jars are available), offsets committed when the runner
finalizes a checkpoint, and publishes each slot as the watermark closes it, late updates marked
``is_update``. Its jars cannot be fetched on the development machine, so it is built but not run there.
The local runners' bounded catch-up cycle, with its ledger and the files it hands its driver, lives
apart in :mod:`beam_pipeline.cycle`: nothing here knows of it.
"""

from __future__ import annotations

from typing import Callable

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.kafka_io import RawBatch
from beam_pipeline.options import JobConfig
from beam_pipeline.pipeline_options import TrustbeamOptions
from beam_pipeline.transforms import ScoreSlots, wire_records
from exporters.kafka_client import KafkaSettings
from exporters.parquet import ParquetResults
from model.published import SlotScores

XLANG_BATCH = 5000
JOB_HEADER = "trustbeam-job"  # the header naming the job (group@generation) that published an output record


class WriteParquet(beam.DoFn):
    """Each slot's results to Parquet (exporters.parquet): atomic, one file per slot and table."""

    def __init__(self, root: str) -> None:
        self.results = ParquetResults(root)
        self.files = Metrics.counter("trustbeam", "parquet_files")

    def process(self, result: SlotScores) -> None:
        self.files.inc(len(self.results.write(result)))


def _batches(topic: str) -> beam.PTransform:
    """Beam KafkaIO records (with metadata) -> RawBatch per partition."""

    def to_batch(element: tuple[int, list]) -> RawBatch:
        partition, records = element
        records = sorted(records, key=lambda r: r.offset)
        return RawBatch(topic, partition, np.array([r.offset for r in records], np.int64),
                        np.array([r.timestamp for r in records], np.int64), [r.value for r in records], 0)

    return (beam.Map(lambda r: (r.partition, r)) | beam.GroupIntoBatches(XLANG_BATCH, max_buffering_duration_secs=1)
            | beam.Map(to_batch))


Source = Callable[[beam.Pipeline], tuple[beam.PCollection, beam.PCollection]]  # -> (events, status) RawBatches
Sink = Callable[[str, str, beam.PCollection], None]  # (label, topic, messages) -> writes them


def kafka_source(settings: KafkaSettings, config: JobConfig, options: PipelineOptions) -> Source:
    """Beam's Java KafkaIO (Flink/Dataflow): committed offsets in the job's own group, record timestamps as event
    time, read_committed."""
    from apache_beam.io.kafka import ReadFromKafka

    consumer_config = {**settings.java_config(), "group.id": config.group_id, "auto.offset.reset": "earliest",
                       "isolation.level": "read_committed"}
    expansion = options.view_as(TrustbeamOptions).kafka_expansion_service  # None: Beam starts one from its jar

    def read(p: beam.Pipeline) -> tuple[beam.PCollection, beam.PCollection]:
        return tuple(p | f"Read{name}" >> ReadFromKafka(consumer_config, [topic], with_metadata=True,
                                                          commit_offset_in_finalize=True, timestamp_policy="CreateTime",
                                                          expansion_service=expansion)
                     | f"Batch{name}" >> _batches(topic)
                     for name, topic in (("Events", config.topics.events), ("Status", config.topics.status)))

    return read


def kafka_sink(settings: KafkaSettings, options: PipelineOptions) -> Sink:
    """Beam's Java KafkaIO writer: an idempotent producer (acks=all), records keyed by owner with headers."""
    from apache_beam.io.kafka import WriteToKafka

    producer_config = {**settings.java_config(), "enable.idempotence": "true", "acks": "all"}
    expansion = options.view_as(TrustbeamOptions).kafka_expansion_service

    def write(label: str, topic: str, messages: beam.PCollection) -> None:
        (messages | f"Row{label}" >> beam.Map(lambda r: beam.Row(key=r[1], value=r[2],
                                                                 headers=[beam.Row(key=k, value=v) for k, v in r[3]]))
         | f"Write{label}" >> WriteToKafka(producer_config, topic, with_headers=True, expansion_service=expansion))

    return write


def streaming_pipeline(options: PipelineOptions, settings: KafkaSettings, config: JobConfig,
                       source: Source | None = None, sink: Sink | None = None) -> beam.Pipeline:
    """The unbounded job: each slot published as the watermark closes it, updates (late events within the
    allowed lateness) published again with a higher ``revision``. Kafka in and out through Beam's Java
    KafkaIO on Flink/Dataflow by default; ``source`` and ``sink`` replace them (the tests use a
    TestStream and files). Every output record carries the job's ``trustbeam-job`` header."""
    topics = config.topics
    p = beam.Pipeline(options=options)
    events, status = (source or kafka_source(settings, config, options))(p)
    write = sink or kafka_sink(settings, options)
    out = (events, status) | "Score" >> ScoreSlots(config)
    job = config.group_id.encode()
    records = (out["scores"] | "Wire" >> beam.FlatMap(wire_records, config.topics)
               | "Job" >> beam.Map(lambda m: (*m[:3], [*m[3], (JOB_HEADER, job)])))
    if config.parquet_out:
        out["scores"] | "Parquet" >> beam.ParDo(WriteParquet(config.parquet_out))
    for label, pcoll, topic in (("Scores", records, topics.scores), ("Rankings", records, topics.rankings),
                                ("DeadLetter", out["dead"], topics.dead_letter)):
        write(label, topic, pcoll | f"Only{label}" >> beam.Filter(lambda r, t=topic: r[0] == t))
    return p
