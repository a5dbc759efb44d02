"""Records of one type held as checked columns: validated, JSON-encoded and stored without a Python object per record.

A scoring job publishes thousands of records a slot. Making each one a :class:`~schemas.base.Record` (construct,
check, ``to_dict``, ``json.dumps``, pickle between pipeline stages) cost more than scoring them; :class:`Columns`
keeps the same guarantees column by column:

* :meth:`Columns.of` checks every column once, vectorized (ids by a few calls over the whole column), and every
  rule across fields on whole columns (:meth:`Record.batch_violations`); a bad record raises the ValidationError its
  construction would (field, value, rule), and no batch is made;
* :meth:`Columns.json` encodes each record to the bytes :func:`schemas.codec.to_json` gives it, from the columns
  (numbers and plain ids written by the record's template, other values' JSON text made once per distinct value);
* it is a sequence of records: indexing or iterating makes them (once), for readers that want objects;
* it pickles as numpy columns.

A list field (a ranking's candidates) is a :class:`Nested` column: every record's items as one :class:`Columns`
of the item type, with offsets.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from schemas.base import INT64_MAX, INT64_MIN, MAX_ID_CHARS, Kind, Record, Spec, specs
from schemas.codec import VERSION_FIELD
from schemas.errors import ValidationError


TextColumn = list[str] | np.ndarray  # a column as a renderer takes it: texts inserted as they are, or numbers
Render = Callable[[list[str], list[TextColumn], int], tuple[bytes, np.ndarray]]  # python_render's contract


def python_render(pieces: list[str], columns: list[TextColumn], count: int) -> tuple[bytes, np.ndarray]:
    """``count`` records' JSON by Python: record r is pieces[0] + its value of columns[0] + pieces[1] + ... +
    pieces[k], a text as it is, a number (int64, or finite float64) by its repr, as ``json.dumps`` writes it. ->
    (every record's UTF-8 text, one after another; (count,) int64 where each ends).
    ``model.json_records.render_records`` gives the same bytes ~3x faster."""
    pattern = "%s".join(piece.replace("%", "%%") for piece in pieces)
    values = [column if isinstance(column, list) else list(map(repr, column.tolist())) for column in columns]
    texts = list(map(pattern.__mod__, zip(*values))) if columns else [pattern.replace("%%", "%")] * count
    encoded = list(map(str.encode, texts))
    return b"".join(encoded), np.cumsum(np.fromiter(map(len, encoded), np.int64, count))


@dataclass(frozen=True, eq=False)
class Nested:
    """A list field's column: record r's items are ``items[offsets[r]:offsets[r + 1]]``."""

    items: "Columns"
    offsets: np.ndarray  # (count + 1,) int64, non-decreasing from 0 to len(items)

    @classmethod
    def of(cls, items: "Columns", lengths: Sequence[int] | np.ndarray) -> "Nested":
        return cls(items, np.concatenate([[0], np.cumsum(np.asarray(lengths, np.int64))]))

    def parents(self) -> np.ndarray:
        """(items,) the record each item belongs to."""
        return np.repeat(np.arange(len(self.offsets) - 1), np.diff(self.offsets))


class Columns(Sequence):
    """``count`` records of ``record`` as checked columns: per field a (count,) numpy array (ids as objects), a
    :class:`Nested` column, or one value every record shares. Make one with :meth:`of`."""

    def __init__(self, record: type[Record], count: int, values: dict[str, Any]) -> None:
        self.record, self.count, self.values = record, count, values
        self._records: list[Record] | None = None

    @classmethod
    def of(cls, record: type[Record], count: int, **columns: Any) -> "Columns":
        """Check ``columns`` (each a numpy array or list of ``count`` values, a :class:`Nested` column for a list
        field, or one value for every record; absent: null, for a nullable field) and every record's rules."""
        known = dict(specs(record))
        for key in columns:
            if key not in known:
                raise ValidationError(key, columns[key], f"unknown field for {record.NAME}")
        batch = cls(record, count, {name: _check_column(spec, name, columns.get(name), count)
                                    for name, spec in known.items()})
        bad = np.flatnonzero(record.batch_violations(batch))
        for row in bad:  # the record's own construction names the field, the value and the rule
            record(**batch.row(int(row)))
        return batch

    @classmethod
    def concat(cls, parts: Sequence["Columns"]) -> "Columns":
        """Parts of one record type as one batch, in order (each part was checked when made)."""
        if not parts:
            raise ValueError("Columns.concat: no parts")
        record = parts[0].record
        if any(part.record is not record for part in parts):
            raise ValueError("Columns.concat: parts of different record types")
        values = {}
        for name, spec in specs(record):
            columns = [part.column(name) for part in parts]
            if spec.kind is Kind.RECORDS:
                ends = np.cumsum([0] + [len(c.items) for c in columns[:-1]])
                offsets = np.concatenate([[0]] + [c.offsets[1:] + end for c, end in zip(columns, ends)])
                values[name] = Nested(cls.concat([c.items for c in columns]), offsets.astype(np.int64))
            else:
                values[name] = np.concatenate(columns)
        return cls(record, sum(part.count for part in parts), values)

    def column(self, name: str) -> Any:
        """Field ``name`` per record: a (count,) array (a shared value repeated), or a :class:`Nested` column."""
        value = self.values[name]
        if isinstance(value, (np.ndarray, Nested)):
            return value
        column = np.empty(self.count, object if value is None or isinstance(value, str) else type(value))
        column[:] = value
        return column

    def row(self, position: int) -> dict[str, Any]:
        """One record's fields as Python values (list fields as lists of records)."""
        out = {}
        for name, value in self.values.items():
            if isinstance(value, Nested):
                out[name] = list(value.items[int(value.offsets[position]): int(value.offsets[position + 1])])
            elif isinstance(value, np.ndarray):
                out[name] = value[position] if value.dtype == object else value[position].item()
            else:
                out[name] = value
        return out

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, position: Any) -> Any:
        return self._made()[position]

    def __iter__(self) -> Iterator[Record]:
        return iter(self._made())

    def __repr__(self) -> str:
        return f"Columns({self.record.__name__}, {self.count} records)"

    def _made(self) -> list[Record]:
        """The records as objects, made once (checked already: no construction checks again)."""
        if self._records is None:
            names = list(self.values)
            per_record = [self._python(name) for name in names]
            made = []
            for row in zip(*per_record):
                record = object.__new__(self.record)
                record.__dict__.update(zip(names, row))  # a frozen dataclass's fields live in its __dict__
                made.append(record)
            self._records = made
        return self._records

    def _python(self, name: str) -> list[Any]:
        value = self.values[name]
        if isinstance(value, Nested):
            items, ends = list(value.items), value.offsets.tolist()
            return [tuple(items[a:b]) for a, b in zip(ends[:-1], ends[1:])]
        if isinstance(value, np.ndarray):
            return value.tolist()
        return [value] * self.count

    def json(self, versioned: bool = True, render: Render = python_render) -> list[bytes]:
        """Each record as :func:`schemas.codec.to_json` encodes it (``versioned``: with ``schema_version`` first, as
        on the wire; nested items go without). ``render``: who writes the text (the same bytes either way)."""
        data, ends = self._rendered(versioned, "", render)
        starts = [0, *ends[:-1].tolist()]
        return [data[a:b] for a, b in zip(starts, ends.tolist())]

    def json_lines(self, render: Render = python_render) -> bytes:
        """The versioned records as JSON Lines (each :meth:`json`'s bytes and a newline), encoded at once."""
        return self._rendered(True, "\n", render)[0]

    def _rendered(self, versioned: bool, after: str, render: Render) -> tuple[bytes, np.ndarray]:
        """(every record's JSON followed by ``after``, one after another; (count,) where each ends), by ``render``
        from the record's pieces of fixed text and the columns' values between them."""
        pieces, columns = ["{" + (f'"{VERSION_FIELD}":{self.record.SCHEMA_VERSION},' if versioned else "")], []
        for name, spec in specs(self.record):
            pieces[-1] += json.dumps(name) + ":"
            value = self.values[name]
            if isinstance(value, (np.ndarray, Nested)):
                quote, column = self._json_column(spec, value, render)
                pieces[-1] += quote
                columns.append(column)
                pieces.append(quote)
            else:
                pieces[-1] += _json_value(value)
            pieces[-1] += ","
        pieces[-1] = pieces[-1][:-1] + "}" + after
        return render(pieces, columns, self.count)

    @staticmethod
    def _json_column(spec: Spec, column: np.ndarray | Nested, render: Render) -> tuple[str, TextColumn]:
        """(the quote around one column's values in a record's JSON, the values as ``render`` takes them): finite
        floats and ints as numbers (written by their repr, as ``json.dumps``), an id that needs no escape between
        quotes as itself, anything else as its JSON text (made once per distinct value)."""
        if isinstance(column, Nested):
            data, ends = column.items._rendered(False, ",", render)
            bounds = np.r_[0, ends][column.offsets].tolist()  # each record's items, each followed by a comma
            return "", ["[" + data[a:b - 1].decode() + "]" if b > a else "[]" for a, b in zip(bounds[:-1], bounds[1:])]
        if column.dtype == np.int64 or (column.dtype.kind == "f" and np.isfinite(column).all()):
            return "", column
        values = column.tolist()
        if spec.kind is Kind.ID and _plain_strings(values):
            return '"', values
        if spec.kind is Kind.ID or column.dtype == object:
            texts = {value: _json_value(value) for value in set(values)}
            return "", list(map(texts.__getitem__, values))
        if spec.kind is Kind.BOOL:
            return "", _JSON_BOOLS[column.astype(np.intp)].tolist()
        return "", list(map(repr, values))  # json.dumps writes numbers by their repr

    def __getstate__(self) -> dict[str, Any]:
        return {"record": self.record, "count": self.count, "values": self.values}  # the columns, not the objects

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["record"], state["count"], state["values"])


def _valid_ids(spec: Spec, values: list[Any]) -> bool:
    """Whether every value passes the id check (:func:`schemas.base.Spec.check`), tested on the whole column at once:
    strings, none empty or longer than the limit, all printable (so a space is the only whitespace one can hold),
    none starting or ending with a space. False sends the column to the value-by-value check, which names the
    failing value and its rule."""
    joined = _joined(values)
    if joined is None or not joined.isprintable():
        return False
    lengths = np.fromiter(map(len, values), np.int64, len(values))
    if len(lengths) and (lengths.min() == 0 or lengths.max() > (spec.max_len or MAX_ID_CHARS)):
        return False
    return _SPACE_AT_AN_END.search("\n".join(values)) is None


_SPACE_AT_AN_END = re.compile(r"(?m)^ | $")  # a line (one value) that starts or ends with a space


_DTYPES = {Kind.INT: np.int64, Kind.FLOAT: np.float64, Kind.BOOL: bool}
_JSON_BOOLS = np.array(["false", "true"], object)
_JSON_ESCAPED = re.compile(r'[\x00-\x1f\\"]')  # what json.dumps(..., ensure_ascii=False) escapes in a string


def _joined(values: list[Any]) -> str | None:
    """The values as one string, to test them all at once; None where one is not a string (a null among them)."""
    try:
        return "".join(values)
    except TypeError:
        return None


def _plain_strings(values: list[Any]) -> bool:
    """Whether every value is a string that JSON writes as itself between quotes (no quote, backslash or control)."""
    joined = _joined(values)
    return joined is not None and _JSON_ESCAPED.search(joined) is None


def _json_value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def _check_column(spec: Spec, name: str, column: Any, count: int) -> Any:
    """A column checked: a numpy array (ints int64, floats float64, flags bool, ids and nullable values as objects),
    a :class:`Nested` column, or one checked value; raises the ValidationError of its first failing value."""
    if isinstance(column, Nested):
        if spec.kind is not Kind.RECORDS or column.items.record is not spec.item:
            raise ValidationError(name, column.items.record.NAME, "a nested column of the wrong record type")
        if len(column.offsets) != count + 1:
            raise ValueError(f"{name}: a nested column for {len(column.offsets) - 1} records, not {count}")
        lengths = np.diff(column.offsets)
        if spec.max_len is not None and len(lengths) and lengths.max() > spec.max_len:
            raise ValidationError(name, int(lengths.max()), f"more than {spec.max_len} items")
        return column
    if spec.kind is Kind.RECORDS:
        raise ValidationError(name, type(column).__name__, "a list field's column must be Nested")
    if not isinstance(column, (np.ndarray, list)):
        return spec.check(name, column)
    if len(column) != count:
        raise ValueError(f"{name}: a column of {len(column)} values for {count} records")
    array = np.asarray(column) if spec.kind in (Kind.INT, Kind.FLOAT) else None
    if array is not None and array.dtype.kind in "iuf" and (spec.kind is Kind.FLOAT or array.dtype.kind in "iu"):
        values = array.astype(np.float64) if spec.kind is Kind.FLOAT else array
        bad = ~np.isfinite(values) if spec.kind is Kind.FLOAT else np.zeros(len(values), bool)
        for bound, fails in ((spec.ge, lambda v, b: ~(v >= b)), (spec.gt, lambda v, b: ~(v > b)),
                             (spec.le, lambda v, b: ~(v <= b))):
            if bound is not None:
                bad |= fails(values, bound)
        if spec.kind is Kind.INT:
            bad |= (values < INT64_MIN) | (values > INT64_MAX)
        if bad.any():  # the one-value check names the rule
            spec.check(name, values[np.argmax(bad)].item())
        return values if spec.kind is Kind.FLOAT else values.astype(np.int64)
    if spec.kind is Kind.ID and _valid_ids(spec, column.tolist() if isinstance(column, np.ndarray) else column):
        return np.asarray(column, object)
    checked = [spec.check(name, value.item() if isinstance(value, np.generic) else value) for value in column]
    out = np.empty(count, object if spec.nullable or spec.kind is Kind.ID else _DTYPES[spec.kind])
    out[:] = checked
    return out
