"""The job's transforms: thin Beam adapters that key, hold state and call :mod:`model.scoring`.

    RawBatch/TableBatch ─ ParseEvents ─► (slot, events table) ─ CloseSlot ─► (shard, slot part) ─┐
    RawBatch ─ ParseStatus ─► (shard, statuses) ──────────────────────────────────────┴─ ShardState
        ─► ((slot, piece), shard frame) ─ GatherSlot ─► PairScores ─┐
    CloseSlot ─► the slot's observed pairs ─────────────────────────┴─ PublishSlots ─► SlotScores (one per piece)

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
from apache_beam.coders import BytesCoder
from apache_beam.metrics import Metrics
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.utils.timestamp import Timestamp
from apache_beam.utils.windowed_value import WindowedValue

from beam_pipeline.kafka_io import RawBatch, trusted_progress
from beam_pipeline.parquet_io import TableBatch
from beam_pipeline.options import JobConfig
from model.config import SlotClock
from model.json_records import render_records
from model.publisher import SlotPublisher
from model.recalibration import OnlineShift
from model.scoring import (DeviceFrame, DeviceHistory, EvidenceSnapshot, first_occurrences, score_pairs,
                           shard_of, slot_outcomes, slot_part, slots_read_back, status_arrays, status_horizon,
                           window_read)
from model.status import StatusLog
from exporters.kafka import Message, messages
from schemas import CollaborationEvent, Columns, DeviceStatus, Record, from_arrow, to_json
from schemas.batch import decode_batch, validate_table

DEAD = "dead"
EVENTS = "events"
EVIDENCE = "evidence"
ONLINE = "online"
OUTCOMES = "outcomes"
PAIRS = "pairs"
PROGRESS = "progress"
STATUSES = "statuses"


def millis(ms: int) -> Timestamp:
    return Timestamp(micros=int(ms) * 1000)


def load(state: Any, default: Any) -> Any:
    """Read a value kept as pickled bytes (see :func:`store`)."""
    blob = state.read()
    return default if blob is None else pickle.loads(blob)


def store(state: Any, value: Any) -> int:
    """Keep large state values as pickled bytes: the runner's state cache then sizes a bytes object
    instead of walking every array and string of the value (measured: most of a cycle's time). Returns
    the bytes kept."""
    blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    state.write(blob)
    return len(blob)


def _counter(name: str) -> Any:
    return Metrics.counter("trustbeam", name)


COALESCE_ROWS = 200_000  # ParseEvents holds at most this many events of a bundle before sending them on
DEAD_LETTER_MAX_BYTES = 256 << 10  # below any producer's request limit, whatever arrived
# columns ParseEvents adds for CloseSlot: the row was read by an earlier cycle; where it came from
REPLAYED, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET = "_replayed", "_topic", "_partition", "_offset"
EXTRA_COLUMNS = [REPLAYED, SOURCE_TOPIC, SOURCE_PARTITION, SOURCE_OFFSET]


def closed_at(clock: SlotClock, lateness_slots: int, slot: int, progress_ms: int) -> bool:
    """Whether ``slot`` is closed at ``progress_ms``: its end plus the allowed lateness lies at or before it."""
    return int(clock.end_ms(slot)) + lateness_slots * clock.slot_ms <= progress_ms


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

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        self.replay_through = -1 if config.replay_through is None else config.replay_through  # published earlier
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
    """RawBatch -> (slot, events table) per slot and bundle (at most COALESCE_ROWS events held), timestamped at
    the slot start; dead letters out of ``dead``.

    Side outputs: ``events``, the valid events (the local runner keeps the recent ones for its next
    cycle), and ``progress``, per source partition the newest event time of its new records that
    lies at most ``max_skew_s`` past the processing time (a producer whose clock runs ahead does not
    advance it)."""

    RECORD, KIND = CollaborationEvent, "events"

    def process(self, batch: RawBatch, window=beam.DoFn.WindowParam) -> Iterator[Any]:
        table, positions, letters = self.decode(batch)
        times = table["event_time_ms"].to_numpy()
        slots = self.clock.slot_of(times)
        new = batch.offsets[positions] >= batch.new_from  # replayed records were dead-lettered when new
        before_origin = slots < 0
        now_ms = time.time() * 1000
        ahead = times > now_ms + self.config.max_future_s * 1000
        future = new & ahead
        late = new & ~future & (before_origin | (slots <= self.replay_through))
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
        progress = trusted_progress(times[keep & new], now_ms, self.config.max_skew_s * 1000)
        if progress is not None:
            yield beam.pvalue.TaggedOutput(PROGRESS, (f"{batch.topic}/{batch.partition}", progress))
        valid = table.filter(pa.array(keep))
        if valid.num_rows:
            yield beam.pvalue.TaggedOutput(EVENTS, valid)
        table = (table.append_column(REPLAYED, pa.array(~new))  # so CloseSlot counts only new duplicates
                 .append_column(SOURCE_TOPIC, pa.array([batch.topic] * table.num_rows, pa.string()))
                 .append_column(SOURCE_PARTITION, pa.array(np.full(table.num_rows, batch.partition, np.int64)))
                 .append_column(SOURCE_OFFSET, pa.array(batch.offsets[positions])))
        table, slots = table.filter(pa.array(keep)), slots[keep]
        for slot in np.unique(slots).tolist():
            self.pending.setdefault((window, slot), []).append(table.take(np.flatnonzero(slots == slot)))
        self.pending_rows += table.num_rows
        if self.pending_rows >= COALESCE_ROWS:
            yield from self.flush()

    def start_bundle(self) -> None:
        self.pending: dict[tuple[Any, int], list[pa.Table]] = {}  # (window, slot) -> the bundle's tables of it
        self.pending_rows = 0

    def finish_bundle(self) -> Iterator[WindowedValue]:
        yield from self.flush()

    def flush(self) -> Iterator[WindowedValue]:
        """One (slot, table) per slot for what the bundle read so far: a stateful step downstream pays per
        element, and a batch of one partition spans many slots."""
        for (window, slot), tables in self.pending.items():
            table = tables[0] if len(tables) == 1 else pa.concat_tables(tables).combine_chunks()
            yield WindowedValue((slot, table), millis(self.clock.start_ms(slot)), [window])
        self.pending, self.pending_rows = {}, 0


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

    closes: int = 0  # closes that sent parts: the next one is this version (0 = first, later ones are updates)
    distinct: int = 0  # distinct events at the last close (a close that would add none sends nothing)
    duplicates: int = 0  # new duplicates counted so far
    expired: bool = False  # the allowed lateness has passed: a tombstone until FORGET


def provenance(table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source topics, partitions, offsets) of events that ParseEvents tagged with their source."""
    return (table[SOURCE_TOPIC].to_numpy(zero_copy_only=False), table[SOURCE_PARTITION].to_numpy(),
            table[SOURCE_OFFSET].to_numpy())


@beam.typehints.with_input_types(Tuple[int, Any])
@beam.typehints.with_output_types(Tuple[int, Any])
class CloseSlot(beam.DoFn):
    """Keyed by slot: gathers the slot's events and closes the slot when the watermark passes its end.

    Each batch of events is appended to the slot's bag as it comes (no per-batch rewrite of a seen
    set); duplicates are dropped at close (the first occurrence of each ``event_id`` counts) and
    counted once. On close every shard gets its devices' part of the slot (embeddings, owner
    profiles, evidence), and ``outcomes`` gets the slot's observed pairs for the online recalibration
    (:class:`PublishSlots`); the slot's designated shard (slot mod shards) also gets the events' source
    pointers, so that a part the shards refuse as late can be dead-lettered with its evidence.
    Events within the allowed lateness re-close the slot as the next version (an update), unless
    they were all duplicates. After the lateness the slot expires: its events are dropped and it
    stays a tombstone for ``tombstone_slots`` slots, during which any event for it goes to
    dead-letter as late; then its state is forgotten (the shards refuse what comes later).
    """

    SLOT = ReadModifyWriteStateSpec("slot", BytesCoder())  # OpenSlot, pickled (see store)
    EVENTS = BagStateSpec("events", BytesCoder())  # the slot's event batches as they came: pickled tables
    CLOSE = TimerSpec("close", TimeDomain.WATERMARK)  # at the slot's end
    EXPIRE = TimerSpec("expire", TimeDomain.WATERMARK)  # at the end of the allowed lateness
    FORGET = TimerSpec("forget", TimeDomain.WATERMARK)  # tombstone_slots after the expiry

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        self.duplicates, self.late = _counter("events_duplicate"), _counter("events_late")
        self.closed, self.updates = _counter("slots_closed"), _counter("slots_updated")

    def setup(self) -> None:
        self.stages, _ = self.config.stages()
        self.clock = self.stages.config.clock
        self.lateness_ms = self.config.lateness_slots * self.clock.slot_ms

    def process(self, element: tuple[int, pa.Table], state=beam.DoFn.StateParam(SLOT),
                events=beam.DoFn.StateParam(EVENTS), close=beam.DoFn.TimerParam(CLOSE),
                expire=beam.DoFn.TimerParam(EXPIRE)) -> Iterator[Any]:
        slot, table = element
        current = load(state, None) or OpenSlot()
        if current.expired:
            yield from self.dead_late(slot, table, f"slot {slot} expired (allowed lateness passed)")
            return
        events.add(pickle.dumps(table))  # ParseEvents' take(): the table owns its buffers
        end = int(self.clock.end_ms(slot))
        close.set(millis(end))
        expire.set(millis(end + self.lateness_ms + 1))
        store(state, current)

    def dead_late(self, slot: int, table: pa.Table, why: str) -> Iterator[Any]:
        new = ~table[REPLAYED].to_numpy(zero_copy_only=False)
        self.late.inc(int(new.sum()))
        topics, partitions, offsets = provenance(table)
        records = from_arrow(CollaborationEvent, table.drop_columns(EXTRA_COLUMNS))
        for k in np.flatnonzero(new):
            yield beam.pvalue.TaggedOutput(DEAD, dead_letter(
                self.config.topics.dead_letter, str(topics[k]), int(partitions[k]), int(offsets[k]),
                to_json(records[k]), f"{CollaborationEvent.NAME}: late: {why}"))

    @on_timer(CLOSE)
    def on_close(self, key=beam.DoFn.KeyParam, state=beam.DoFn.StateParam(SLOT),
                 events=beam.DoFn.StateParam(EVENTS)) -> Iterator[Any]:
        current = load(state, None)
        if current is not None and not current.expired:
            yield from self.close(key, current, events)
            store(state, current)

    @on_timer(EXPIRE)
    def on_expire(self, key=beam.DoFn.KeyParam, fired=beam.DoFn.TimestampParam, state=beam.DoFn.StateParam(SLOT),
                  events=beam.DoFn.StateParam(EVENTS), forget=beam.DoFn.TimerParam(FORGET)) -> Iterator[Any]:
        current = load(state, None) or OpenSlot()
        if not current.expired:
            yield from self.close(key, current, events)  # runners may fire both timers in one go
        events.clear()
        store(state, OpenSlot(closes=current.closes, expired=True))
        forget.set(millis(fired.micros // 1000 + self.config.tombstone_slots * self.clock.slot_ms))

    @on_timer(FORGET)
    def on_forget(self, state=beam.DoFn.StateParam(SLOT)) -> None:
        state.clear()

    def close(self, slot: int, current: OpenSlot, events: Any) -> Iterator[Any]:
        """Send each shard its part of the slot if the slot holds events not sent before."""
        table = pa.concat_tables([pickle.loads(b) for b in events.read()])
        replayed = table[REPLAYED].to_numpy(zero_copy_only=False)
        order = np.argsort(~replayed, kind="stable")  # replayed copies first: a new copy of one is the duplicate
        table = table.take(order)
        first = first_occurrences(table)
        duplicates = int((~replayed[order]).sum()) - int((~replayed[order][first]).sum())
        self.duplicates.inc(duplicates - current.duplicates)
        current.duplicates = duplicates
        if not len(first) or (current.closes and len(first) == current.distinct):
            return
        unique = table.take(first)
        part = slot_part(self.stages, unique.drop_columns(EXTRA_COLUMNS), slot)
        pointers = (unique["event_id"].to_numpy(zero_copy_only=False), *provenance(unique))
        (self.updates if current.closes else self.closed).inc()
        yield beam.pvalue.TaggedOutput(OUTCOMES, (0, (OUTCOMES, slot, current.closes, *slot_outcomes(part))))
        for shard in range(self.config.shards):
            mine = pointers if shard == slot % self.config.shards else None
            yield shard, ("part", part.select(shard, self.config.shards), current.closes, mine)
        current.closes += 1
        current.distinct = len(first)


@dataclass
class ShardBook:
    """ShardState's bookkeeping of slots beside the history: part versions, frames sent, frames due."""

    versions: dict[int, int] = field(default_factory=dict)  # slot -> the version of its part held
    emitted: dict[int, int] = field(default_factory=dict)  # slot -> the frame version sent for it
    pending: dict[int, int] = field(default_factory=dict)  # slot -> the frame version to send
    pointers: dict[int, tuple] = field(default_factory=dict)  # slot -> its events' sources (designated shard)
    watermark_ms: int = -(2**62)  # the latest EMIT firing: the input watermark was at least this
    # a bounded re-run's evidence as of its replay_through (what it hands on), kept before its frames fold further
    handed_on: EvidenceSnapshot | None = None

    def frame_version(self, slot: int, lateness: int) -> int:
        """A frame's version: the sum of the part versions of the slots an update could still change, the same
        on every shard (they all receive the same parts)."""
        return sum(self.versions.get(u, 0) for u in range(slot - lateness, slot + 1))

    def forget_before(self, slot: int) -> None:
        for book in (self.versions, self.emitted, self.pending, self.pointers):
            for old in [s for s in book if s < slot]:
                del book[old]


@beam.typehints.with_input_types(Tuple[int, Any])
@beam.typehints.with_output_types(Tuple[Tuple[int, int], Any])
class ShardState(beam.DoFn):
    """Keyed by shard: its devices' history in state; at each closed slot, their frame for scoring.

    A slot's frame is computed when the watermark passes the slot's end, so the shard has every
    earlier slot's part and every status before it. An update of slot u (late events within the
    allowed lateness) changes the frames of the slots [u, u + lateness] already sent: they are sent
    again, with a new version (:meth:`ShardBook.frame_version`). The streaming job knows a lower
    bound of the watermark (its EMIT timers' firings) and refuses a slot's first part that arrives
    past it plus the allowed lateness (a slot CloseSlot had forgotten): a late event never triggers
    scoring. A slot's evidence becomes final once the allowed lateness has passed it by a slot.
    Memory: the shard's devices x S slot embeddings at most, and their evidence.

    No input rewrites the history: a part is appended to a bag and the small book records it, a status batch is
    appended to another bag; both are folded into the history (read and written once) when the shard next emits.
    In a bounded re-run the timer waits for the latest pending slot's end, so the run's end of input emits every
    slot in one firing (one read and one write of the history per shard, not one per slot), and its frames fold
    evidence as a streaming job's do (each slot's frame then sums a few pending parts, not every slot since the
    run's start), while the evidence it hands on stays folded through ``replay_through`` only (a copy taken as
    the folding passes it).
    """

    HISTORY = ReadModifyWriteStateSpec("history", BytesCoder())  # DeviceHistory without statuses, pickled
    BOOK = ReadModifyWriteStateSpec("book", BytesCoder())  # ShardBook, pickled (small)
    NEW_PARTS = BagStateSpec("new_parts", BytesCoder())  # (version, part, pointers) since the last emission
    STATUS = ReadModifyWriteStateSpec("status", BytesCoder())  # (StatusLog, (keys, ids) it names), compacted
    NEW_STATUS = BagStateSpec("new_status", BytesCoder())  # status batches since: appended, never rewritten
    EMIT = TimerSpec("emit", TimeDomain.WATERMARK)  # at the earliest pending slot's end (bounded: the latest's)

    def __init__(self, config: JobConfig) -> None:
        """``config.replay_through``, in a bounded re-run: the last slot an earlier run published (its slots give
        history only, no frames; and the last slot whose evidence is final, since a bounded run's end of input
        says nothing of what comes later). None in a streaming job: a slot is final once the allowed lateness
        passed it, and a slot whose lateness the watermark passed is refused."""
        self.config = config
        self.bounded = config.replay_through is not None
        self.busy = _counter("sequence_ms")
        self.refused = _counter("slots_refused_late")
        self.reset = _counter("state_reset_model_changed")
        # a shard's kept history after each emission (max: the largest shard; the runner's UI shows it)
        self.state_size = Metrics.distribution("trustbeam", "shard_state_bytes")

    def setup(self) -> None:
        self.stages, self.version = self.config.stages()
        self.clock = self.stages.config.clock

    def _history(self, history: Any) -> DeviceHistory:
        """The shard's history, made this model's (state restored under another model drops its embeddings)."""
        kept = load(history, None) or DeviceHistory(self.stages.config.evidence, self.clock, model_version=self.version)
        if kept.adopt(self.version, self.stages.config.evidence):
            self.reset.inc()
        return kept

    def _due(self, book: ShardBook) -> Timestamp:
        """When the EMIT timer fires: at the earliest pending slot's end (streaming), or at the latest's (a bounded
        re-run: all of them at the end of its input)."""
        return millis(self.clock.end_ms((max if self.bounded else min)(book.pending)))

    def process(self, element: tuple[int, tuple], history=beam.DoFn.StateParam(HISTORY),
                book_state=beam.DoFn.StateParam(BOOK), new_parts=beam.DoFn.StateParam(NEW_PARTS),
                new_status=beam.DoFn.StateParam(NEW_STATUS), emit=beam.DoFn.TimerParam(EMIT)) -> Iterator[Any]:
        shard, payload = element
        if payload[0] == "evidence":  # final evidence an earlier run kept (the local runner's cycles)
            kept = self._history(history)
            kept.seed(payload[1])
            store(history, kept)
            return
        if payload[0] == "status":  # O(batch): the shard's statuses are compacted when it next emits
            new_status.add(pickle.dumps(payload[1:], protocol=pickle.HIGHEST_PROTOCOL))
            return
        book = load(book_state, ShardBook())
        _, part, version, pointers = payload
        slot, lateness = part.slot, self.config.lateness_slots
        end = int(self.clock.end_ms(slot))
        # past the watermark's known bound by more than the lateness: a slot CloseSlot forgot (an update within
        # the lateness cannot be: CloseSlot's pending expiry holds this shard's watermark below end + lateness)
        if not self.bounded and end + lateness * self.clock.slot_ms < book.watermark_ms:
            self.refused.inc()
            yield (slot, 0), (shard, version, None, pointers)  # GatherSlot dead-letters it; nothing is scored
            return
        if version <= book.versions.get(slot, -1):
            return  # an older version than the one held
        new_parts.add(pickle.dumps((version, part, pointers), protocol=pickle.HIGHEST_PROTOCOL))
        book.versions[slot] = version
        for t in [slot, *(t for t in book.emitted if slot < t <= slot + lateness)]:
            book.pending[t] = book.frame_version(t, lateness)
        store(book_state, book)
        emit.set(self._due(book))

    @on_timer(EMIT)
    def on_emit(self, key=beam.DoFn.KeyParam, fired=beam.DoFn.TimestampParam, history=beam.DoFn.StateParam(HISTORY),
                book_state=beam.DoFn.StateParam(BOOK), new_parts=beam.DoFn.StateParam(NEW_PARTS),
                status=beam.DoFn.StateParam(STATUS), new_status=beam.DoFn.StateParam(NEW_STATUS),
                emit=beam.DoFn.TimerParam(EMIT)) -> Iterator[Any]:
        kept, book = self._history(history), load(book_state, ShardBook())
        for version, part, pointers in sorted((pickle.loads(b) for b in new_parts.read()),
                                             key=lambda entry: (entry[1].slot, entry[0])):
            if version == book.versions.get(part.slot):  # the newest version of each slot
                kept.add_part(part)
                if pointers is not None:
                    book.pointers[part.slot] = pointers
        new_parts.clear()
        log, names = load(status, (StatusLog(), (np.zeros(0, np.int64), np.zeros(0, object))))
        batches = [pickle.loads(b) for b in new_status.read()]
        for keys, _, times, values in batches:
            log.add(keys, times, values)
        names = tuple(np.concatenate([names[k], *(b[k] for b in batches)]) for k in range(2))
        new_status.clear()
        kept.status = log
        kept.name(*names)
        book.watermark_ms = max(book.watermark_ms, int(fired.micros // 1000))
        ready = sorted(s for s in book.pending if millis(self.clock.end_ms(s)) <= fired)
        busy = 0.0  # the frames' making, not what runs downstream of each yield (a fused runner runs it there)
        for slot in ready:
            started = time.perf_counter()
            version = book.pending.pop(slot)
            pieces = []
            if not self.bounded or slot > self.config.replay_through:
                book.emitted[slot] = version
                pieces = kept.frame(self.stages, slot, self.config.ranking).pieces(
                    self.config.pieces, self.config.ranking.range_m, self.stages.config.evidence.identity_m)
            busy += time.perf_counter() - started
            for piece, part in enumerate(pieces):
                yield (slot, piece), (key, version, part, book.pointers.get(slot) if piece == 0 else None)
            started = time.perf_counter()
            self._retire(kept, book, slot)
            busy += time.perf_counter() - started
        self.busy.inc(int(busy * 1000))
        if ready:
            handed_on = book.handed_on or EvidenceSnapshot(kept.folded_through, kept.evidence)
            yield beam.pvalue.TaggedOutput(EVIDENCE, (key, handed_on))
        named, first = np.unique(names[0], return_index=True)
        held = np.isin(named, kept.status.keys)  # the statuses' names, once each, for the devices they still hold
        status_bytes = store(status, (kept.status, (named[held], names[1][first[held]])))
        kept.status = StatusLog()
        self.state_size.update(status_bytes + store(history, kept) + store(book_state, book))
        if book.pending:
            emit.set(self._due(book))

    def _retire(self, kept: DeviceHistory, book: ShardBook, slot: int) -> None:
        """Once ``slot``'s frame is out: fold what no update can reach any more, forget what no later frame reads."""
        lateness = self.config.lateness_slots
        final = slot - lateness - 1  # no update can reach these slots any more
        if self.bounded and book.handed_on is None and final > self.config.replay_through:
            kept.fold(self.config.replay_through)  # what the run hands on: final as of its replay_through
            book.handed_on = EvidenceSnapshot(kept.folded_through, {r: e.copy() for r, e in kept.evidence.items()})
        window = window_read(self.stages)  # 1 where the model reads no encoder: no window to keep
        keep = slots_read_back(window, self.config.ranking) + lateness
        kept.fold(final)
        first_kept = min(slot - keep + 1, final + 1)
        kept.prune(first_kept, status_horizon(self.clock, slot - lateness, window))
        book.forget_before(min(first_kept, final - lateness))


@beam.typehints.with_input_types(Tuple[Tuple[int, int], Any])
@beam.typehints.with_output_types(Tuple[int, Any])
class GatherSlot(beam.DoFn):
    """Keyed by (slot, piece): once every shard's frame of the piece of a version is in, score the piece's pairs (an
    update if version > 0) for :class:`PublishSlots`. A slot is scored in ``--score_pieces`` pieces by space (its
    owners by cell, with the devices within range of them: :class:`model.candidates.Pieces`), so no slot sits on
    one key.

    A shard that refused a slot's part as late answers None instead of a frame: nothing of that part
    is scored, and the designated shard's refusal, which carries the events' pointers, sends them to
    dead-letter at once. The state is forgotten once no frame of the slot can come any more.
    """

    FRAMES = BagStateSpec("frames", BytesCoder())  # pickled (shard, version, frame) in since the last scoring
    BOOK = ReadModifyWriteStateSpec("book", BytesCoder())  # ({shard: newest version in}, last done, publications)
    FORGET = TimerSpec("forget", TimeDomain.WATERMARK)  # when no update of the slot can come

    def __init__(self, config: JobConfig) -> None:
        self.config = config
        self.scored = _counter("slots_scored")
        self.busy = _counter("scoring_ms")
        self.late = _counter("events_late")

    def setup(self) -> None:
        self.stages, self.version = self.config.stages()
        self.clock = self.stages.config.clock

    def process(self, element: tuple[int, tuple], frames=beam.DoFn.StateParam(FRAMES),
                book=beam.DoFn.StateParam(BOOK), forget=beam.DoFn.TimerParam(FORGET),
                progress_ms: int | None = None) -> Iterator[Any]:
        (slot, piece), (shard, version, frame, pointers) = element
        if frame is None:  # refused as late by a shard
            yield from self.dead_late(slot, pointers)
            return
        if progress_ms is not None and not closed_at(self.clock, self.config.lateness_slots, slot, progress_ms):
            return  # a bounded cycle publishes only closed slots: this one is scored by the cycle that closes it
        versions, last, published = load(book, ({}, -1, 0))
        forget.set(millis(self.clock.end_ms(slot + self.config.lateness_slots + 2)))
        if versions.get(shard, -1) > version:
            return  # an older frame than the shard's newest in
        versions[shard] = version
        frames.add(pickle.dumps((shard, version, frame), protocol=pickle.HIGHEST_PROTOCOL))  # each frame pickled once
        newest = max(versions.values())
        if len(versions) < self.config.shards or any(v != newest for v in versions.values()) or newest <= last:
            store(book, (versions, last, published))
            return
        have = {}  # each shard's newest frame (an equal version later replaces an earlier one)
        for answer in map(pickle.loads, frames.read()):
            if answer[1] == versions[answer[0]]:
                have[answer[0]] = answer[2]
        frames.clear()
        store(book, ({}, newest, published + 1))
        started = time.perf_counter()
        joined = DeviceFrame.concat(list(have.values()))
        pairs = score_pairs(self.stages, joined, slot, self.config.ranking, self.config.params, published, piece)
        self.busy.inc(int((time.perf_counter() - started) * 1000))
        self.scored.inc()
        yield 0, (PAIRS, pairs)

    def dead_late(self, slot: int, pointers: tuple | None) -> Iterator[Any]:
        if pointers is None:
            return
        for event_id, topic, partition, offset in zip(*pointers):
            self.late.inc()
            value = json.dumps({"event_id": str(event_id), "slot": slot}).encode()
            yield beam.pvalue.TaggedOutput(DEAD, dead_letter(
                self.config.topics.dead_letter, str(topic), int(partition), int(offset), value,
                f"{CollaborationEvent.NAME}: late: slot {slot} is past the allowed lateness (a slot already "
                f"forgotten; the original is at the source pointer)"))

    @on_timer(FORGET)
    def on_forget(self, frames=beam.DoFn.StateParam(FRAMES), book=beam.DoFn.StateParam(BOOK)) -> None:
        frames.clear()
        book.clear()


@beam.typehints.with_input_types(Tuple[int, Any])
class PublishSlots(beam.DoFn):
    """On one key: the scored pieces of each slot published in slot order, with the online recalibration
    (:class:`model.publisher.SlotPublisher`, as ``score_log`` offline): before slot s is published, its observed
    pairs (from CloseSlot) are set against the raw forecasts of the slot published before it.

    A slot is published when the watermark passes its end, as the shards send its pieces. A piece that comes after
    (another piece of a published slot, or an update after late events within the allowed lateness) recomputes the
    shifts from its slot on and publishes again what changed. In a bounded run the recalibration starts from
    ``kept`` (an earlier run's, :meth:`OnlineShift.save`), and the state after the run leaves through the ``online``
    output.
    """

    PUBLISHER = ReadModifyWriteStateSpec("publisher", BytesCoder())  # SlotPublisher, pickled
    PENDING = BagStateSpec("pending", BytesCoder())  # pickled (PAIRS, PairScores) and (OUTCOMES, ...) payloads
    DUE = ReadModifyWriteStateSpec("due", BytesCoder())  # the slots with payloads pending, pickled
    PUBLISH = TimerSpec("publish", TimeDomain.WATERMARK)  # at the earliest pending slot's end (bounded: the latest's)

    def __init__(self, config: JobConfig, kept: str | None = None) -> None:
        self.config, self.kept = config, kept
        self.bounded = config.replay_through is not None
        self.records = _counter("records_scored")

    def setup(self) -> None:
        self.stages, self.version = self.config.stages()
        self.clock = self.stages.config.clock

    def _due(self, slots: set[int]) -> Timestamp:
        return millis(self.clock.end_ms((max if self.bounded else min)(slots)))

    def process(self, element: tuple[int, tuple], pending=beam.DoFn.StateParam(PENDING),
                due_state=beam.DoFn.StateParam(DUE), publish=beam.DoFn.TimerParam(PUBLISH)) -> None:
        _, payload = element
        pending.add(pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
        due = load(due_state, set())  # outcomes too: those after their slot's publication publish it again
        due.add(payload[1].slot if payload[0] == PAIRS else payload[1])
        store(due_state, due)
        publish.set(self._due(due))

    def _publisher(self, state: Any) -> SlotPublisher:
        publisher = load(state, None)
        if publisher is None:
            recalibration = self.config.recalibration
            online = (OnlineShift.load(self.kept, recalibration) if self.kept and recalibration
                      else OnlineShift.start(recalibration))
            publisher = SlotPublisher(online)
        return publisher

    @on_timer(PUBLISH)
    def on_publish(self, fired=beam.DoFn.TimestampParam, publisher_state=beam.DoFn.StateParam(PUBLISHER),
                   pending=beam.DoFn.StateParam(PENDING), due_state=beam.DoFn.StateParam(DUE),
                   publish=beam.DoFn.TimerParam(PUBLISH)) -> Iterator[Any]:
        publisher = self._publisher(publisher_state)
        fired_ms = int(fired.micros // 1000)
        through = int(self.clock.slot_of(np.array([fired_ms]))[0]) - 1  # the slots that end by the firing
        later, due = [], set()  # the pieces not due yet, kept as they were pickled, and their slots
        for blob in pending.read():
            payload = pickle.loads(blob)
            if payload[0] == PAIRS and payload[1].slot > through:
                later.append(blob)
                due.add(payload[1].slot)
            elif payload[0] == PAIRS:
                publisher.add_pieces([payload[1]])
            else:
                publisher.add_outcomes(payload[1], payload[2], payload[3:])
        pending.clear()
        for blob in later:
            pending.add(blob)
        for result in publisher.publish(through, self.config.ranking, self.version, self.clock,
                                        keep_slots=self.config.lateness_slots + 2):
            self.records.inc(len(result.scores) + len(result.rankings))
            yield result
        store(due_state, due)
        if due:
            publish.set(self._due(due))
        store(publisher_state, publisher)
        if self.bounded and publisher.online is not None:
            yield beam.pvalue.TaggedOutput(ONLINE, publisher.online)


class ScoreSlots(beam.PTransform):
    """(events batches, status batches[, kept evidence]) -> SlotScores, plus the dead, progress, events, statuses,
    evidence and online outputs. Kept evidence: (shard, ("evidence", EvidenceSnapshot)) elements that an earlier
    run's ``evidence`` output left, so a run that replays only recent events starts from the evidence of all before;
    ``online``: a bounded run's recalibration state after it (:class:`PublishSlots`).
    ``progress``: (partition, ms) per batch in a streaming job; in a bounded run (``config.replay_through``), the
    progress of the input's slowest partition (one element, none without new events)."""

    def __init__(self, config: JobConfig, known_progress_ms: int | None = None, kept_online: str | None = None
                 ) -> None:
        """A streaming job, or with ``config.replay_through`` a bounded re-run of a log an earlier run scored.
        ``known_progress_ms``: a bounded cycle that publishes only the slots closed at the progress (the larger of
        this, an earlier cycle's, and the input's) scores only those; None scores every slot whose frames are in.
        ``kept_online``: the recalibration state an earlier bounded run left (:meth:`OnlineShift.save`)."""
        if config.replay_through is None and (known_progress_ms is not None or kept_online is not None):
            raise ValueError("ScoreSlots: known_progress_ms and kept_online are for bounded runs "
                             "(config.replay_through)")
        super().__init__()
        self.config = config
        self.known_progress_ms, self.kept_online = known_progress_ms, kept_online

    def expand(self, inputs: tuple[beam.PCollection, ...]) -> dict[str, beam.PCollection]:
        raw_events, raw_status, *kept = inputs
        events = raw_events | "ParseEvents" >> beam.ParDo(
            ParseEvents(self.config)).with_outputs(DEAD, PROGRESS, EVENTS, main="slots")
        status = raw_status | "ParseStatus" >> beam.ParDo(
            ParseStatus(self.config)).with_outputs(DEAD, STATUSES, main="status")
        closed = (events.slots | "CloseSlot" >> beam.ParDo(CloseSlot(self.config))
                  .with_outputs(DEAD, OUTCOMES, main="parts"))
        shards = ((closed.parts, status.status, *kept) | "ToShards" >> beam.Flatten()
                  | "ShardState" >> beam.ParDo(ShardState(self.config))
                  .with_outputs(EVIDENCE, main="frames"))
        progress = events[PROGRESS]
        if self.config.replay_through is not None:
            progress = (progress | "PartitionProgress" >> beam.CombinePerKey(max) | "Progress" >> beam.Values()
                        | "SlowestPartition" >> beam.CombineGlobally(min).without_defaults())
        gather = (beam.ParDo(GatherSlot(self.config)) if self.known_progress_ms is None else
                  beam.ParDo(GatherSlot(self.config), progress_ms=beam.pvalue.AsSingleton(
                      progress | "Known" >> beam.Map(max, self.known_progress_ms),
                      default_value=self.known_progress_ms)))
        scored = shards.frames | "GatherSlot" >> gather.with_outputs(DEAD, main="pairs")
        published = ((scored.pairs, closed[OUTCOMES]) | "ToPublish" >> beam.Flatten()
                     | "PublishSlots" >> beam.ParDo(PublishSlots(self.config, self.kept_online))
                     .with_outputs(ONLINE, main="scores"))
        dead = (events[DEAD], status[DEAD], closed[DEAD], scored[DEAD]) | "Dead" >> beam.Flatten()
        return {"scores": published.scores, "dead": dead, "progress": progress, "events": events[EVENTS],
                "statuses": status[STATUSES], "evidence": shards[EVIDENCE], "online": published[ONLINE]}


def outputs(result: Any, topics: Any) -> tuple[tuple[str, Columns], ...]:
    """A SlotScores' record batches with their topics, in publication order."""
    return (topics.scores, result.scores), (topics.rankings, result.rankings)


def wire_records(result: Any, topics: Any) -> Iterator[Message]:
    """A SlotScores as Kafka messages keyed by owner (exporters.kafka)."""
    for topic, records in outputs(result, topics):
        yield from messages(topic, records, render=render_records)
