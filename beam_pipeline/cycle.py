"""The local runners' bounded catch-up cycle (:mod:`beam_pipeline.run` drives it): local-only mechanics.

:func:`cycle_pipeline` reads the planned offset ranges with the local Kafka source and what the ledger
kept, scores with the same :class:`~beam_pipeline.transforms.ScoreSlots` as the streaming job, and
publishes the closed, unpublished slots of the cycle in identity order (:class:`PublishClosed`). What
the driver needs for the next cycle (the slots published and the progress, the valid events and
statuses, the shards' final evidence) is handed back as files in the cycle's work directory, written
once per cycle by the DoFns below; none of this is part of the streaming job.
"""

from __future__ import annotations

import functools
import json
import types
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any, Iterator, TypeVar

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.options.pipeline_options import PipelineOptions
from kafka.partitioner.default import murmur2

from beam_pipeline.kafka_io import PartitionRange, ProduceRecords, ReadKafka
from beam_pipeline.options import JobConfig
from beam_pipeline.parquet_io import ReadParquet
from beam_pipeline.pipeline import JOB_HEADER, WriteParquet
from beam_pipeline.transforms import ScoreSlots, closed_at, outputs
from exporters.kafka import Message, messages
from exporters.kafka_client import KafkaSettings
from model.json_records import render_records
from model.published import SlotScores
from model.recalibration import OnlineShift
from model.scoring import EvidenceSnapshot
from schemas import Columns

CLOSED = "closed"  # PublishClosed's side output: the SlotScores it publishes
T = TypeVar("T", bound=PipelineOptions)


def identity(body: dict[str, Any]) -> tuple:
    """Order of output records within a partition: (slot, owner, collaborator)."""
    return body["slot"], body["owner"], body.get("collaborator", "")


class PublishClosed(beam.DoFn):
    """All SlotScores of a cycle (each slot's pieces) -> the wire records of the closed, unpublished slots, in
    identity order (slot, owner, collaborator), each with the job's ``trustbeam-job`` header: one batch per slot
    and topic.

    A slot is closed when the job's progress (the ledger's, or this cycle's if later) is the allowed
    lateness past its end. ``marks`` are the identities of the last record this job published (with
    this model version) in each output partition: records at or before them were sent by a cycle
    that died before saving its ledger, and are not sent again.
    """

    def __init__(self, config: JobConfig, ledger: Any, final: bool, partitions: dict[str, int],
                 marks: dict[tuple[str, int], tuple], out_dir: str, job_id: str) -> None:
        self.config, self.published_through, self.final = config, ledger.published_through, final
        self.known_progress_ms = ledger.progress_ms
        self.partitions, self.marks, self.out_dir, self.job_id = partitions, marks, out_dir, job_id

    def process(self, results: list, progress_ms: int) -> Iterator[Any]:
        clock = self.config.stages()[0].config.clock
        progress = max(progress_ms, self.known_progress_ms)
        published = []
        by_slot: dict[int, list[SlotScores]] = {}
        for piece in results:
            by_slot.setdefault(piece.slot, []).append(piece)
        for slot in sorted(by_slot):
            closed = self.final or closed_at(clock, self.config.lateness_slots, slot, progress)
            if slot <= self.published_through or not closed:
                continue
            published.append(slot)
            result = SlotScores.join(by_slot[slot])
            yield beam.pvalue.TaggedOutput(CLOSED, result)
            for topic, records in outputs(result, self.config.topics):
                yield from self.unsent(slot, topic, records)
        Path(self.out_dir, "published.json").write_text(json.dumps({"published": published, "progress_ms": progress}))

    def unsent(self, slot: int, topic: str, records: Columns) -> Iterator[list[Message]]:
        """A slot's messages of one topic as one batch, in identity order (so that a partition's tail marks a prefix of
        the slot), without those at or before their partition's mark, each with the job's header."""
        owners = records.column("owner").astype(str)  # printable ids: numpy's order is str's
        collaborators = (records.column("collaborator").astype(str) if "collaborator" in records.values
                         else np.full(len(owners), ""))  # the identity (:func:`identity`) of a ranking has none
        order = np.lexsort((collaborators, owners)).tolist()
        marks = {p: mark for (marked, p), mark in self.marks.items() if marked == topic}
        if marks:
            partitions = self.partitions[topic]
            partition = {owner: (murmur2(owner.encode()) & 0x7FFFFFFF) % partitions for owner in set(owners.tolist())}
            order = [k for k in order if (mark := marks.get(partition[owners[k]])) is None
                     or (slot, owners[k], collaborators[k]) > mark]
        wire = messages(topic, records, render=render_records)
        if order:
            headers = [*wire[0][3], (JOB_HEADER, self.job_id.encode())]  # every record's, the same list
            yield [(topic, wire[k][1], wire[k][2], headers) for k in order]


def kept_evidence(path: str, shards: int) -> Iterator[tuple[int, tuple[str, EvidenceSnapshot]]]:
    """The snapshot file, read once, as (shard, ("evidence", its part)) for every shard: what the shards start from."""
    snapshot = EvidenceSnapshot.load(path)
    for shard in range(shards):
        yield shard, ("evidence", snapshot.select(shard, shards))


class WriteEvidence(beam.DoFn):
    """The shards' final evidence, merged into one snapshot file (the driver keeps it for the next cycle)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, shards: list) -> None:
        if shards:
            EvidenceSnapshot.merge([snapshot for _, snapshot in shards]).save(self.path)


class WriteOnline(beam.DoFn):
    """The recalibration state after the cycle's last publication (the driver keeps it for the next cycle)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, states: list[OnlineShift]) -> None:
        if states:
            max(states, key=lambda online: online.slot).save(self.path)


class WriteTables(beam.DoFn):
    """The cycle's valid events or statuses, as one Parquet file (the driver keeps what the next cycle needs)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def process(self, tables: list) -> None:
        if tables:
            pq.write_table(pa.concat_tables(tables), self.path)


def without_state_cache() -> None:
    """Turn off the embedded FnApiRunner worker's state cache (process-wide).

    The cache weighs every value it keeps with objsize, which walks the globals of every loaded module
    (about 5 ms per state write with PyTorch loaded: 40% of an ingest-only cycle, measured), and the
    embedded worker keeps its state in this process anyway, so the cache saves nothing here."""
    from apache_beam.runners.portability.fn_api_runner import worker_handlers

    worker_handlers.STATE_CACHE_SIZE_MB = 0


class CycleOptions(PipelineOptions):
    """The local cycles' pipeline options, each view (:meth:`view_as`) made once.

    Beam asks the pipeline's options for a view at every transform it applies (~600 a cycle), and each view parses
    the flags again with a parser of every option Beam knows (a sixth of a follower's cycle). Views are windows on
    one dict of values (a value set through one is seen through all), so one view per class serves as well."""

    def view_as(self, cls: type[T]) -> T:
        views = self.__dict__.setdefault("_views", {})  # not an option: __setattr__ would refuse the name
        if cls not in views:
            views[cls] = super().view_as(cls)
        return views[cls]


def memoized_dofn_specs() -> None:
    """Remember each DoFn's state and timer specs (process-wide; idempotent).

    Beam looks them up (``userstate.get_dofn_specs``) about seven times per DoFn a cycle: building the graph, turning
    it into its protos and making each bundle's processor, each time inspecting the signature of every method the
    DoFn has (~37,000 signatures per follower's cycle, a quarter of its time). The specs are the default arguments
    of the class's methods, so they are remembered per class, except for a DoFn whose instance can change them
    (:func:`_specs_of_its_class`: Beam's wrappers of callables), which is remembered as long as it lives."""
    from apache_beam.transforms import userstate

    if getattr(userstate.get_dofn_specs, "memoized", False):
        return
    introspect = userstate.get_dofn_specs
    by_class: dict[type, tuple[set, set]] = {}
    by_instance: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get_dofn_specs(dofn: beam.DoFn) -> tuple[set, set]:
        if _specs_of_its_class(dofn):
            if type(dofn) not in by_class:
                by_class[type(dofn)] = introspect(dofn)
            return by_class[type(dofn)]
        try:
            if dofn not in by_instance:
                by_instance[dofn] = introspect(dofn)
            return by_instance[dofn]
        except TypeError:  # neither hashable nor weakly referable
            return introspect(dofn)

    get_dofn_specs.memoized = True  # type: ignore[attr-defined]
    get_dofn_specs.__wrapped__ = introspect  # type: ignore[attr-defined]
    userstate.get_dofn_specs = get_dofn_specs


def _specs_of_its_class(dofn: beam.DoFn) -> bool:
    """Whether a DoFn's specs are its class's: Beam reads them from the default arguments of its bound methods,
    which an instance changes only with bound methods of its own or Beam's ``_inspect_<method>`` hooks (its
    wrappers of a callable, whose ``process`` is the callable's)."""
    return (not _has_inspect_hooks(type(dofn))
            and not any(isinstance(value, types.MethodType) for value in vars(dofn).values()))


@functools.cache
def _has_inspect_hooks(cls: type) -> bool:
    return any(name.startswith("_inspect_") for name in dir(cls))


def local_runner_settings() -> None:
    """The process-wide settings every local cycle runs under (idempotent): the embedded worker without its state
    cache (:func:`without_state_cache`) and DoFns' specs remembered (:func:`memoized_dofn_specs`)."""
    without_state_cache()
    memoized_dofn_specs()


def _listed() -> beam.PTransform:
    """A PCollection as one list, none where it is empty (its writer would have nothing to write): without the
    default value's machinery (a Create and a side input each, built and run every cycle)."""
    return beam.combiners.ToList().without_defaults()


def cycle_pipeline(options: PipelineOptions, settings: KafkaSettings, config: JobConfig,
                   ranges: list[PartitionRange], ledger: Any, final: bool, partitions: dict[str, int],
                   marks: dict[tuple[str, int], tuple], work: str, job_id: str, max_batch: int = 5000
                   ) -> beam.Pipeline:
    """One bounded cycle over the new records of ``ranges`` and what the ``ledger`` (``beam_pipeline.run.Ledger``)
    kept: its events and statuses are read as already-seen input, its final evidence seeds the shards.
    Writes to ``work``: ``published.json`` (the slots published and the progress), ``events.parquet`` and
    ``status.parquet`` (the valid records it read), ``evidence.npz`` (the shards' final evidence) and ``online.npz``
    (the recalibration state after its publications)."""
    topics = config.topics
    local_runner_settings()
    p = beam.Pipeline(options=options)
    raw = {}
    for name, topic, kept in (("Events", topics.events, ledger.events_snapshot),
                              ("Status", topics.status, ledger.status_snapshot)):
        raw[name] = p | f"Read{name}" >> ReadKafka(settings, [r for r in ranges if r.topic == topic], max_batch)
        if kept:
            earlier = p | f"Kept{name}" >> ReadParquet([kept], seen=True)
            raw[name] = (raw[name], earlier) | f"With{name}" >> beam.Flatten()
    inputs = (raw["Events"], raw["Status"])
    if ledger.evidence_snapshot:  # read by the workers: a snapshot inside the graph is pickled and bz2'd whole
        inputs += (p | "EvidenceFile" >> beam.Create([ledger.evidence_snapshot])
                   | "KeptEvidence" >> beam.FlatMap(kept_evidence, config.shards),)
    scoring = ScoreSlots(replace(config, replay_through=ledger.published_through),
                         known_progress_ms=None if final else ledger.progress_ms,  # score only what is published
                         kept_online=ledger.online_snapshot)
    out = inputs | "Score" >> scoring
    closed = (out["scores"] | "AllSlots" >> beam.combiners.ToList()
              | "Closed" >> beam.ParDo(PublishClosed(config, ledger, final, partitions, marks, work, job_id),
                                       progress_ms=beam.pvalue.AsSingleton(out["progress"], default_value=-1))
              .with_outputs(CLOSED, main="records"))
    records = closed.records
    if config.parquet_out:
        closed[CLOSED] | "Parquet" >> beam.ParDo(WriteParquet(config.parquet_out))
    records | "Publish" >> beam.ParDo(ProduceRecords(settings, "published"))
    (out["dead"] | "DeadBatches" >> beam.Map(lambda message: [message])
     | "DeadLetter" >> beam.ParDo(ProduceRecords(settings, "dead_letters")))
    # what the driver keeps, each written once (_listed)
    for name in ("events", "statuses"):
        file = "events.parquet" if name == "events" else "status.parquet"
        (out[name] | f"Collect{name.title()}" >> _listed()
         | f"Write{name.title()}" >> beam.ParDo(WriteTables(str(Path(work, file)))))
    (out["online"] | "Online" >> _listed() | "WriteOnline" >> beam.ParDo(WriteOnline(str(Path(work, "online.npz")))))
    (out["evidence"] | "LastFold" >> beam.CombinePerKey(lambda kept: max(kept, key=lambda s: s.folded_through))
     | "Evidence" >> _listed() | "WriteEvidence" >> beam.ParDo(WriteEvidence(str(Path(work, "evidence.npz")))))
    return p
