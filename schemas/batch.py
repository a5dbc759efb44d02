"""Decode a batch of JSON messages into one Arrow table, vectorized, with the codec's exact verdicts.

The fast path parses the batch with pyarrow's JSON reader against the record's
Arrow schema and screens the columns with the field specs and the record's
:attr:`~schemas.base.Record.RULES`, all vectorized. A message the reader cannot
parse is isolated by bisection, so it costs O(log n) parses and leaves the rest
of its batch on the fast path. The screen is conservative: any message it cannot
clear (parse failure, null, non-ASCII id, huge integer, ...) is re-decoded alone
by :func:`schemas.codec.from_json`, which gives the verdict and the exact error. So a batch accepts exactly the messages
``from_json`` accepts (a property test holds the two together), at a few
microseconds per message instead of tens.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from schemas.arrow import arrow_schema, to_arrow
from schemas.base import MAX_ID_CHARS, Kind, Record, specs
from schemas.codec import MAX_MESSAGE_BYTES, VERSION_FIELD, from_json
from schemas.errors import ValidationError

_EXACT_FLOAT = 2.0**53


@dataclass(frozen=True)
class DecodedBatch:
    """The valid records as a table in input order, and each invalid message's position and error."""

    table: pa.Table  # arrow_schema(cls)
    positions: np.ndarray  # (rows,) position in the input of each table row
    errors: list[tuple[int, ValidationError]]


def decode_batch(cls: type[Record], messages: Sequence[bytes]) -> DecodedBatch:
    """Decode and validate ``messages`` as ``cls`` records (see the module docstring)."""
    parsed, rows = _parse(arrow_schema(cls), messages)
    return _verdicts(cls, parsed, rows, len(messages), lambda position: from_json(cls, messages[position]))


def validate_table(cls: type[Record], table: pa.Table) -> DecodedBatch:
    """Validate rows that arrive as Arrow (e.g. Parquet) the same way; other columns are ignored."""
    body = table.select([name for name, _ in specs(cls) if name in table.column_names])
    columns = {name: body[name] if name in body.column_names else pa.nulls(body.num_rows) for name, _ in specs(cls)}
    columns[VERSION_FIELD] = pa.array(np.full(body.num_rows, cls.SCHEMA_VERSION, dtype=np.int64))
    try:
        parsed = pa.table(columns).cast(arrow_schema(cls).append(pa.field(VERSION_FIELD, pa.int64())))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        parsed = None
    return _verdicts(cls, parsed, np.arange(body.num_rows), body.num_rows,
                     lambda position: cls.from_dict(body.slice(position, 1).to_pylist()[0]))


def _verdicts(cls: type[Record], parsed: pa.Table | None, rows: np.ndarray, count: int,
              exact: Callable[[int], Record]) -> DecodedBatch:
    """Rows the screen clears come from ``parsed`` (whose rows are the messages at ``rows``); every other
    position gets ``exact``'s verdict."""
    schema = arrow_schema(cls)
    cleared = np.zeros(count, dtype=bool)
    table = None
    if parsed is not None:
        passed = _screen(cls, parsed)
        cleared[rows[passed]] = True
        table = parsed.filter(pa.array(passed)).select(schema.names).cast(schema)
    records, errors, unclear = [], [], np.flatnonzero(~cleared)
    for position in unclear.tolist():
        try:
            records.append(exact(position))
        except ValidationError as error:
            errors.append((position, error))
    failed = {p for p, _ in errors}
    valid_exact = np.array([p for p in unclear.tolist() if p not in failed], dtype=np.int64)
    parts = [t for t in (table, to_arrow(cls, records) if records else None) if t is not None]
    joined = pa.concat_tables(parts) if parts else schema.empty_table()
    positions = np.concatenate([np.flatnonzero(cleared), valid_exact])
    order = np.argsort(positions, kind="stable")
    return DecodedBatch(joined.take(order), positions[order], errors)


def _parse(schema: pa.Schema, messages: Sequence[bytes]) -> tuple[pa.Table | None, np.ndarray]:
    """(one table of the messages the reader parses, the positions of its rows): messages that do not parse, or
    that cannot be one line of a JSON-lines batch, are left out, found by bisection."""
    explicit = schema.append(pa.field(VERSION_FIELD, pa.int64()))
    options = pj.ParseOptions(explicit_schema=explicit, unexpected_field_behavior="error")
    lines = [k for k, m in enumerate(messages) if len(m) <= MAX_MESSAGE_BYTES and b"\n" not in m and b"\r" not in m]
    parts = _parse_lines(options, messages, np.asarray(lines, np.int64))
    if not parts:
        return None, np.zeros(0, np.int64)
    return pa.concat_tables([table for table, _ in parts]), np.concatenate([rows for _, rows in parts])


def _parse_lines(options: pj.ParseOptions, messages: Sequence[bytes], rows: np.ndarray
                 ) -> list[tuple[pa.Table, np.ndarray]]:
    """The messages at ``rows`` parsed as JSON lines; a part that fails is split in two until its bad messages
    stand alone (and are left out)."""
    if not len(rows):
        return []
    data = b"\n".join(messages[k] for k in rows.tolist())
    try:
        table = pj.read_json(io.BytesIO(data), parse_options=options,
                             read_options=pj.ReadOptions(use_threads=False, block_size=max(len(data) + 1, 1 << 16)))
        if table.num_rows == len(rows):
            return [(table, rows)]
    except (pa.ArrowInvalid, UnicodeDecodeError, ValueError):
        pass
    if len(rows) == 1:
        return []
    half = len(rows) // 2
    return _parse_lines(options, messages, rows[:half]) + _parse_lines(options, messages, rows[half:])


def _screen(cls: type[Record], table: pa.Table) -> np.ndarray:
    """Rows the vectorized checks clear; everything else goes to the exact decoder."""
    ok = pc.fill_null(pc.equal(table[VERSION_FIELD], cls.SCHEMA_VERSION), False).to_numpy(zero_copy_only=False)
    columns = {}
    for name, spec in specs(cls):
        column = table[name]
        if not spec.nullable:
            ok &= ~column.is_null().to_numpy(zero_copy_only=False)
        if spec.kind is Kind.ID:
            clean = _clean_ids(column, spec.max_len or MAX_ID_CHARS)
            ok &= clean | column.is_null().to_numpy(zero_copy_only=False) if spec.nullable else clean
            columns[name] = column.to_numpy(zero_copy_only=False)
            continue
        if spec.kind is Kind.FLOAT:
            magnitude = pc.fill_null(pc.abs(column), 0.0).to_numpy(zero_copy_only=False)
            ok &= np.isfinite(magnitude) & (magnitude < _EXACT_FLOAT)
        for bound, holds in ((spec.ge, pc.greater_equal), (spec.gt, pc.greater), (spec.le, pc.less_equal)):
            if bound is not None:  # compared in the column's own type (int64 stays exact)
                ok &= pc.fill_null(holds(column, bound), True).to_numpy(zero_copy_only=False)
        columns[name] = pc.cast(column, pa.float64(), safe=False).to_numpy(zero_copy_only=False)  # null -> NaN
    row = SimpleNamespace(**columns)
    for rule in cls.RULES:
        ok &= ~np.asarray(rule.violated(row), dtype=bool)
    return ok


def _clean_ids(column: pa.ChunkedArray, limit: int) -> np.ndarray:
    """Ids that are non-empty, within the length limit, printable ASCII and not space-padded."""
    values = pc.fill_null(column, "")
    length = pc.utf8_length(values).to_numpy(zero_copy_only=False)
    printable = pc.and_(pc.string_is_ascii(values), pc.ascii_is_printable(values))
    trimmed = pc.equal(pc.utf8_trim_whitespace(values), values)
    return (length > 0) & (length <= limit) & pc.and_(printable, trimmed).to_numpy(zero_copy_only=False)
