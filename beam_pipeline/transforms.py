"""The job's transforms: thin Beam adapters that key, hold state and call :mod:`model.scoring`.

    RawBatch/TableBatch ─ ParseEvents ─► (slot, events table) ─ CloseSlot ─► (shard, slot part) ─┐
    RawBatch ─ ParseStatus ─► (shard, statuses) ──────────────────────────────────────┴─ ShardState
        ─► (slot, shard frame) ─ GatherSlot ─► SlotScores

Everything invalid leaves through the ``dead`` output as a dead-letter record (original bytes,
source topic/partition/offset, reason); counters in the ``trustbeam`` namespace say how many.
"""

from __future__ import annotations

import json
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Tuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.coders import BytesCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp

from beam_pipeline.kafka_io import RawBatch
from beam_pipeline.parquet_io import TableBatch
from beam_pipeline.options import JobConfig
from model.scoring import DeviceFrame, DeviceHistory, EvidenceSnapshot, score_slot, shard_of, slot_part, status_arrays
from model.status import StatusLog
from exporters.kafka import Message, message
from schemas import CollaborationEvent, DeviceStatus, Record, from_arrow, to_json
from schemas.batch import decode_batch, validate_table

DEAD = "dead"
EVIDENCE = "evidence"
NEWEST = "newest"
OFFSETS = "offsets"
STATUSES = "statuses"


def millis(ms: int) -> Timestamp:
    return Timestamp(micros=int(ms) * 1000)


def load(state: Any, default: Any) -> Any:
    """Read a value kept as pickled bytes (see :func:`store`)."""
    blob = state.read()
    return default if blob is None else pickle.loads(blob)


def store(state: Any, value: Any) -> None:
    """Keep large state values as pickled bytes: the runner's state cache then sizes a bytes object
    instead of walking every array and string of the value (measured: most of a cycle's time)."""
    state.write(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def _counter(name: str) -> Any:
    return Metrics.counter("trustbeam", name)


DEAD_LETTER_MAX_BYTES = 256 << 10  # below any producer's request limit, whatever arrived
REPLAYED = "_replayed"  # column ParseEvents adds for CloseSlot: the row was read by an earlier cycle


def dead_letter(topic: str, source: str, partition: int, offset: int, value: bytes, reason: str) -> Message:
    """A record for the dead-letter topic: the original bytes, where they came from, and why.

    A message too large to forward is cut to its first DEAD_LETTER_MAX_BYTES, with its full size in a
    ``truncated_from`` header (the source offset still names the whole original)."""
    headers = [("reason", reason.encode()[:1000]), ("source_topic", source.encode()),
               ("source_partition", str(partition).encode()), ("source_offset", str(offset).encode())]
    if len(value) > DEAD_LETTER_MAX_BYTES:
        headers.append(("truncated_from", str(len(value)).encode()))
        value = value[:DEAD_LETTER_MAX_BYTES]
    return topic, f"{source}/{partition}/{offset}".encode(), value, headers


def original(batch: RawBatch | TableBatch, position: int) -> bytes:
    """The input as it came: the message bytes, or a Parquet row as JSON."""
    if isinstance(batch, TableBatch):
        return json.dumps(batch.table.slice(position, 1).to_pylist()[0], default=str).encode()
    return batch.values[position]


class _Parse(beam.DoFn):
    """Shared by the event and status parsers: decode a RawBatch, dead-letter what fails, count."""

    RECORD: type[Record]
    KIND: str

    def __init__(self, config: JobConfig, published_through: int = -1) -> None:
        self.config = config
        self.published_through = published_through  # slots at or below were published by an earlier run
        self.counters = {name: _counter(f"{self.KIND}_{name}")
                         for name in ("read", "valid", "invalid", "late", "future", "replayed")}

    def setup(self) -> None:
        self.stages, _ = self.config.stages()
        self.clock = self.stages.config.clock

    def decode(self, batch: RawBatch | TableBatch) -> tuple[pa.Table, np.ndarray, list]:
        """(valid rows, their positions in the batch, dead letters of the new records). A device the model does
        not know is valid: it is scored from the cold row and its own evidence (model.bm)."""
        new = batch.offsets >= batch.new_from
        self.counters["read"].inc(int(new.sum()))
        self.counters["replayed"].inc(int((~new).sum()))
        decoded = (validate_table(self.RECORD, batch.table) if isinstance(batch, TableBatch)
                   else decode_batch(self.RECORD, batch.values))
        self.counters["invalid"].inc(sum(int(new[p]) for p, _ in decoded.errors))
        letters = [dead_letter(self.config.topics.dead_letter, batch.topic, batch.partition,
                               int(batch.offsets[p]), original(batch, p), f"{self.RECORD.NAME}: {error}")
                   for p, error in decoded.errors if new[p]]
        return decoded.table, decoded.positions, letters


@beam.typehints.with_output_types(Tuple[int, Any])
class ParseEvents(_Parse):
    """RawBatch -> (slot, events table) per slot, timestamped at the slot start; dead letters out of ``dead``."""

    RECORD, KIND = CollaborationEvent, "events"

    def process(self, batch: RawBatch) -> Iterator[Any]:
        table, positions, letters = self.decode(batch)
        slots = self.clock.slot_of(table["event_time_ms"].to_numpy())
        new = batch.offsets[positions] >= batch.new_from  # replayed records were dead-lettered when new
        before_origin = slots < 0
        ahead = table["event_time_ms"].to_numpy() > time.time() * 1000 + self.config.max_future_s * 1000
        future = new & ahead
        late = new & ~future & (before_origin | (slots <= self.published_through))
        for p, s, is_future in zip(positions[late | future], slots[late | future], future[late | future]):
            reason = (f"in the future: more than {self.config.max_future_s:g} s past the processing time" if is_future
                      else "before the clock's origin" if s < 0 else f"late: slot {s} was already published")
            letters.append(dead_letter(self.config.topics.dead_letter, batch.topic, batch.partition,
                                       int(batch.offsets[p]), original(batch, p), f"{self.RECORD.NAME}: {reason}"))
        self.counters["late"].inc(int(late.sum()))
        self.counters["future"].inc(int(future.sum()))
        self.counters["valid"].inc(int((new & ~late & ~future).sum()))
        for letter in letters:
            yield beam.pvalue.TaggedOutput(DEAD, letter)
        keep = ~late & ~before_origin & ~ahead
        table = table.append_column(REPLAYED, pa.array(~new))  # so CloseSlot counts only new duplicates
        table, slots, offsets = table.filter(pa.array(keep)), slots[keep], batch.offsets[positions][keep]
        if table.num_rows:
            yield beam.pvalue.TaggedOutput(NEWEST, int(pc.max(table["event_time_ms"]).as_py()))
        for slot in np.unique(slots).tolist():
            mine = slots == slot
            yield beam.pvalue.TaggedOutput(OFFSETS, ((batch.topic, batch.partition, slot), int(offsets[mine].min())))
            yield beam.window.TimestampedValue((slot, table.take(np.flatnonzero(mine))),  # take: own buffers
                                               millis(self.clock.start_ms(slot)))


@beam.typehints.with_output_types(Tuple[int, Any])
class ParseStatus(_Parse):
    """RawBatch -> (shard, ("status", keys, ids, times, values)) for each shard with statuses."""

    RECORD, KIND = DeviceStatus, "status"

    def process(self, batch: RawBatch | TableBatch) -> Iterator[Any]:
        table, positions, letters = self.decode(batch)
        self.counters["valid"].inc(int((batch.offsets[positions] >= batch.new_from).sum()))
        for letter in letters:
            yield beam.pvalue.TaggedOutput(DEAD, letter)
        if not table.num_rows:
            return
        yield beam.pvalue.TaggedOutput(STATUSES, table)
        keys, ids, times, values = status_arrays(table)
        shards = shard_of(keys, self.config.shards)
        for shard in np.unique(shards).tolist():
            mine = shards == shard
            yield beam.window.TimestampedValue((shard, ("status", keys[mine], ids[mine], times[mine], values[mine])),
                                               millis(times[mine].min()))


@dataclass
class OpenSlot:
    """CloseSlot's state for one slot, beside the bag of its events."""

    seen: set[str] = field(default_factory=set)  # event ids: the dedup horizon
    closes: int = 0  # closes done: the next close is this version (0 = first, later ones are updates)
    dirty: bool = False  # events added since the last close
    expired: bool = False  # the allowed lateness has passed


@beam.typehints.with_input_types(Tuple[int, Any])
@beam.typehints.with_output_types(Tuple[int, Any])
class CloseSlot(beam.DoFn):
    """Keyed by slot: gathers the slot's events, deduplicated, and closes the slot when the watermark passes.

    On close it sends every shard its devices' part of the slot (embeddings, owner profiles). Events
    within the allowed lateness re-close the slot, sent as the next version (an update). After the
    lateness the slot expires: its events are dropped and any later event goes to dead-letter as late.
    """

    SLOT = ReadModifyWriteStateSpec("slot", BytesCoder())  # OpenSlot, pickled (see store)
    EVENTS = BagStateSpec("events", BytesCoder())  # the slot's events so far, deduplicated: pickled tables
    CLOSE = TimerSpec("close", TimeDomain.WATERMARK)  # at the slot's end
    EXPIRE = TimerSpec("expire", TimeDomain.WATERMARK)  # at the end of the allowed lateness

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        self.duplicates, self.late = _counter("events_duplicate"), _counter("events_late")
        self.closed, self.updates = _counter("slots_closed"), _counter("slots_updated")

    def setup(self) -> None:
        self.stages, _ = self.config.stages()
        self.clock = self.stages.config.clock

    def process(self, element: tuple[int, pa.Table], state=beam.DoFn.StateParam(SLOT),
                events=beam.DoFn.StateParam(EVENTS), close=beam.DoFn.TimerParam(CLOSE),
                expire=beam.DoFn.TimerParam(EXPIRE)) -> Iterator[Any]:
        slot, table = element
        replayed = table[REPLAYED].to_numpy(zero_copy_only=False)
        table = table.drop_columns([REPLAYED])
        current = load(state, None) or OpenSlot()
        if current.expired:
            self.late.inc(int((~replayed).sum()))
            for record in from_arrow(CollaborationEvent, table):
                yield beam.pvalue.TaggedOutput(DEAD, dead_letter(
                    self.config.topics.dead_letter, self.config.topics.events, -1, -1, to_json(record),
                    f"{CollaborationEvent.NAME}: late: slot {slot} expired (allowed lateness passed)"))
            return
        ids = table["event_id"].to_numpy(zero_copy_only=False)
        _, first = np.unique(ids, return_index=True)
        fresh = np.zeros(len(ids), dtype=bool)
        fresh[first] = True
        fresh &= np.array([i not in current.seen for i in ids], dtype=bool)
        self.duplicates.inc(int((~fresh & ~replayed).sum()))  # a replayed copy was counted when it was new
        if not fresh.any():
            return
        current.seen.update(ids[fresh].tolist())
        events.add(pickle.dumps(table.take(np.flatnonzero(fresh))))  # take: a slice would pickle its parent
        current.dirty = True
        store(state, current)
        end = int(self.clock.end_ms(slot))
        close.set(millis(end))
        expire.set(millis(end + self.config.lateness_slots * self.clock.slot_ms + 1))

    @on_timer(CLOSE)
    def on_close(self, key=beam.DoFn.KeyParam, state=beam.DoFn.StateParam(SLOT),
                 events=beam.DoFn.StateParam(EVENTS)) -> Iterator[Any]:
        current = load(state, None)
        if current is not None:
            yield from self.close(key, current, events)
            store(state, current)

    @on_timer(EXPIRE)
    def on_expire(self, key=beam.DoFn.KeyParam, state=beam.DoFn.StateParam(SLOT),
                  events=beam.DoFn.StateParam(EVENTS)) -> Iterator[Any]:
        current = load(state, None) or OpenSlot()
        yield from self.close(key, current, events)  # runners may fire both timers in one go
        events.clear()
        store(state, OpenSlot(closes=current.closes, expired=True))

    def close(self, slot: int, current: OpenSlot, events: Any) -> Iterator[Any]:
        """Send each shard its part of the slot, once per batch of new events."""
        if not current.dirty:
            return
        part = slot_part(self.stages, pa.concat_tables([pickle.loads(b) for b in events.read()]), slot)
        (self.updates if current.closes else self.closed).inc()
        for shard in range(self.config.shards):
            yield shard, ("part", part.select(shard, self.config.shards), current.closes)
        current.closes += 1
        current.dirty = False


@beam.typehints.with_input_types(Tuple[int, Any])
@beam.typehints.with_output_types(Tuple[int, Any])
class ShardState(beam.DoFn):
    """Keyed by shard: its devices' history in state; at each closed slot, their frame for scoring.

    A slot's frame is computed when the watermark passes the slot's end, so the shard has every
    earlier slot's part and every status before it. A slot's evidence becomes final once the allowed
    lateness has passed it by a slot (no update can come any more). Memory: the shard's devices x S
    slot embeddings at most, and their evidence. Parts and statuses live in separate cells so that
    neither kind of input rewrites the other.
    """

    HISTORY = ReadModifyWriteStateSpec("history", BytesCoder())  # (DeviceHistory without statuses, pending versions)
    STATUS = ReadModifyWriteStateSpec("status", BytesCoder())  # (StatusLog, (keys, ids) it names)
    EMIT = TimerSpec("emit", TimeDomain.WATERMARK)  # at the earliest pending slot's end

    def __init__(self, config: JobConfig, published_through: int = -1) -> None:
        self.config = config
        self.published_through = published_through  # replayed slots: history only, no frames
        self.busy = _counter("sequence_ms")

    def setup(self) -> None:
        self.stages, _ = self.config.stages()
        self.clock = self.stages.config.clock

    def _empty(self) -> tuple[DeviceHistory, dict[int, int]]:
        return DeviceHistory(self.stages.config.evidence), {}

    def process(self, element: tuple[int, tuple], history=beam.DoFn.StateParam(HISTORY),
                status=beam.DoFn.StateParam(STATUS), emit=beam.DoFn.TimerParam(EMIT)) -> None:
        shard, payload = element
        if payload[0] == "evidence":  # final evidence an earlier run kept (the local runner's cycles)
            kept, pending = load(history, None) or self._empty()
            kept.seed(payload[1])
            store(history, (kept, pending))
            return
        if payload[0] == "status":
            log, names = load(status, (StatusLog(), (np.zeros(0, np.int64), np.zeros(0, object))))
            keys, ids, times, values = payload[1:]
            log.add(keys, times, values)
            store(status, (log, (np.concatenate([names[0], keys]), np.concatenate([names[1], ids]))))
            return
        kept, pending = load(history, None) or self._empty()
        part, version = payload[1], payload[2]
        kept.add_part(part)
        pending[part.slot] = max(version, pending.get(part.slot, version))
        store(history, (kept, pending))
        emit.set(millis(self.clock.end_ms(min(pending))))

    @on_timer(EMIT)
    def on_emit(self, key=beam.DoFn.KeyParam, fired=beam.DoFn.TimestampParam, history=beam.DoFn.StateParam(HISTORY),
                status=beam.DoFn.StateParam(STATUS), emit=beam.DoFn.TimerParam(EMIT)) -> Iterator[Any]:
        kept, pending = load(history, None) or self._empty()
        log, names = load(status, (StatusLog(), (np.zeros(0, np.int64), np.zeros(0, object))))
        kept.status = log
        kept.name(*names)
        ready = sorted(s for s in pending if millis(self.clock.end_ms(s)) <= fired)
        started = time.perf_counter()
        for slot in ready:
            version = pending.pop(slot)
            if slot > self.published_through:
                yield slot, (key, version, kept.frame(self.stages, slot, self.config.ranking))
        self.busy.inc(int((time.perf_counter() - started) * 1000))
        if ready:
            final = ready[-1] - self.config.lateness_slots - 1  # no update can reach these slots any more
            keep = max(self.stages.config.window, self.config.ranking.owner_slots) + self.config.lateness_slots
            kept.fold(final)
            kept.prune(ready[-1] - keep + 1, int(self.clock.start_ms(ready[-1] - self.config.lateness_slots)))
            yield beam.pvalue.TaggedOutput(EVIDENCE, (key, EvidenceSnapshot(kept.folded_through, kept.evidence)))
        named = np.isin(names[0], kept.status.keys)  # the statuses' names, for the devices they still hold
        store(status, (kept.status, (names[0][named], names[1][named])))
        kept.status = StatusLog()
        store(history, (kept, pending))
        if pending:
            emit.set(millis(self.clock.end_ms(min(pending))))


@beam.typehints.with_input_types(Tuple[int, Any])
class GatherSlot(beam.DoFn):
    """Keyed by slot: once every shard's frame of a version is in, score the slot (an update if version > 0)."""

    FRAMES = ReadModifyWriteStateSpec("frames", BytesCoder())  # ({shard: (version, DeviceFrame)}, last scored)

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        self.scored = _counter("slots_scored")
        self.pairs = _counter("records_scored")
        self.busy = _counter("scoring_ms")

    def setup(self) -> None:
        self.stages, self.version = self.config.stages()

    def process(self, element: tuple[int, tuple[int, int, DeviceFrame]], frames=beam.DoFn.StateParam(FRAMES)
                ) -> Iterator[Any]:
        slot, (shard, version, frame) = element
        have, last = load(frames, ({}, -1))
        if shard not in have or have[shard][0] <= version:
            have[shard] = (version, frame)
        newest = max(v for v, _ in have.values())
        if len(have) < self.config.shards or any(v != newest for v, _ in have.values()) or newest <= last:
            store(frames, (have, last))
            return
        started = time.perf_counter()
        joined = DeviceFrame.concat([f for _, f in have.values()])
        result = score_slot(self.stages, joined, slot, self.config.ranking, self.config.params, self.version,
                            is_update=newest > 0)
        self.busy.inc(int((time.perf_counter() - started) * 1000))
        store(frames, ({}, newest))
        self.scored.inc()
        self.pairs.inc(len(result.scores) + len(result.rankings))
        yield result


class ScoreSlots(beam.PTransform):
    """(events batches, status batches[, kept evidence]) -> SlotScores, plus the dead, newest, offsets, statuses
    and evidence outputs. Kept evidence: (shard, ("evidence", EvidenceSnapshot)) elements that an earlier run's
    ``evidence`` output left, so a run that replays only recent events starts from the evidence of all before."""

    def __init__(self, config: JobConfig, published_through: int = -1) -> None:
        super().__init__()
        self.config, self.published_through = config, published_through

    def expand(self, inputs: tuple[beam.PCollection, ...]) -> dict[str, beam.PCollection]:
        raw_events, raw_status, *kept = inputs
        events = raw_events | "ParseEvents" >> beam.ParDo(
            ParseEvents(self.config, self.published_through)).with_outputs(DEAD, NEWEST, OFFSETS, main="slots")
        status = raw_status | "ParseStatus" >> beam.ParDo(
            ParseStatus(self.config, self.published_through)).with_outputs(DEAD, STATUSES, main="status")
        closed = (events.slots | "CloseSlot" >> beam.ParDo(CloseSlot(self.config)).with_outputs(DEAD, main="parts"))
        shards = ((closed.parts, status.status, *kept) | "ToShards" >> beam.Flatten()
                  | "ShardState" >> beam.ParDo(ShardState(self.config, self.published_through))
                  .with_outputs(EVIDENCE, main="frames"))
        scored = shards.frames | "GatherSlot" >> beam.ParDo(GatherSlot(self.config))
        dead = (events[DEAD], status[DEAD], closed[DEAD]) | "Dead" >> beam.Flatten()
        return {"scores": scored, "dead": dead, "newest": events[NEWEST], "offsets": events[OFFSETS],
                "statuses": status[STATUSES], "evidence": shards[EVIDENCE]}


def outputs(result: Any, topics: Any) -> Iterator[tuple[str, Record]]:
    """A SlotScores' records with their topics, in publication order."""
    for topic, records in ((topics.scores, result.scores), (topics.rankings, result.rankings)):
        for record in records:
            yield topic, record


def wire_records(result: Any, topics: Any) -> Iterator[Message]:
    """A SlotScores as Kafka messages keyed by owner (exporters.kafka)."""
    return (message(topic, record) for topic, record in outputs(result, topics))
