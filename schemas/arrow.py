"""Arrow schemas of the records and conversion between records and Arrow tables."""

from __future__ import annotations

import json
from typing import Iterable, TypeVar

import pyarrow as pa

from schemas.base import Kind, Record, Spec, specs
from schemas.errors import ValidationError

R = TypeVar("R", bound=Record)

_SCALARS = {Kind.ID: pa.string(), Kind.INT: pa.int64(), Kind.FLOAT: pa.float64(), Kind.BOOL: pa.bool_()}


def arrow_type(spec: Spec) -> pa.DataType:
    if spec.kind is Kind.RECORDS:
        assert spec.item is not None
        return pa.list_(pa.struct(list(arrow_schema(spec.item))))
    return _SCALARS[spec.kind]


def arrow_schema(cls: type[Record]) -> pa.Schema:
    """The Arrow schema of a record; docs and units travel as field metadata."""
    fields = []
    for name, spec in specs(cls):
        meta = {"doc": spec.doc, **({"unit": spec.unit} if spec.unit else {})}
        fields.append(pa.field(name, arrow_type(spec), nullable=spec.nullable, metadata=meta))
    meta = {"record": cls.NAME, "schema_version": str(cls.SCHEMA_VERSION), "doc": json.dumps(cls.__doc__)}
    return pa.schema(fields, metadata=meta)


def events_file_schema(extra_metadata: dict[bytes, bytes] | None = None) -> pa.Schema:
    """``events.parquet``: the CollaborationEvent columns plus ``slot`` (under the clock in the metadata)."""
    from schemas.records import CollaborationEvent

    base = arrow_schema(CollaborationEvent)
    slot = pa.field("slot", pa.int64(), nullable=False, metadata={"doc": "slot index under the file's clock"})
    return base.append(slot).with_metadata({**base.metadata, **(extra_metadata or {})})


def to_arrow(cls: type[R], rows: Iterable[R]) -> pa.Table:
    """A table of records (all of class ``cls``)."""
    return pa.Table.from_pylist([row.to_dict() for row in rows], schema=arrow_schema(cls))


def from_arrow(cls: type[R], table: pa.Table) -> list[R]:
    """Validate every row of a table into records; the table must hold the record's columns."""
    expected = arrow_schema(cls)
    missing = [name for name in expected.names if name not in table.column_names]
    if missing:
        raise ValidationError(missing[0], None, f"column missing from the {cls.NAME} table")
    table = table.select(expected.names)
    for field in expected:
        if not table.schema.field(field.name).type.equals(field.type):
            raise ValidationError(field.name, str(table.schema.field(field.name).type), f"expected {field.type}")
    out = []
    for index, row in enumerate(table.to_pylist()):
        try:
            out.append(cls.from_dict(row))
        except ValidationError as error:
            raise error.under(f"row{index}") from None
    return out
