"""JSON wire encoding: compact UTF-8 JSON objects carrying ``schema_version``.

Decoding is strict: the bytes must be UTF-8 JSON of at most MAX_MESSAGE_BYTES,
an object without duplicate keys, with a known
``schema_version`` (this one or an older one: a version only adds nullable fields, which an older record lacks)
and exactly the record's fields. Every failure is a
:class:`ValidationError`. ``NaN``/``Infinity`` literals parse, then fail the
field's finiteness rule, so the error names the field. :func:`from_json_forward` is the one
lenient reader: consumers use it to keep reading records of a newer version.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from schemas.base import Kind, Record, specs
from schemas.errors import ValidationError

R = TypeVar("R", bound=Record)

MAX_MESSAGE_BYTES = 1 << 20
VERSION_FIELD = "schema_version"
_WHOLE = "<record>"


def to_json(record: Record) -> bytes:
    """Encode a record as compact JSON bytes, ``schema_version`` first."""
    body = {VERSION_FIELD: record.SCHEMA_VERSION, **record.to_dict()}
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def from_json(cls: type[R], data: bytes | str) -> R:
    """Decode and validate one message; raise ValidationError naming field, value and rule."""
    obj = parse_json(data)
    if not isinstance(obj, dict):
        raise ValidationError(_WHOLE, obj, f"expected a JSON object for {cls.NAME}")
    return from_versioned_dict(cls, obj)


def from_versioned_dict(cls: type[R], obj: dict[str, Any]) -> R:
    """Validate a decoded object that carries ``schema_version``."""
    body = dict(obj)
    if VERSION_FIELD not in body:
        raise ValidationError(VERSION_FIELD, None, "required field is missing")
    version = body.pop(VERSION_FIELD)
    if not known_version(cls, version):
        known = "1" if cls.SCHEMA_VERSION == 1 else f"1 to {cls.SCHEMA_VERSION}"
        raise ValidationError(VERSION_FIELD, version, f"unknown version for {cls.NAME} (known: {known})")
    return cls.from_dict(body)  # type: ignore[return-value]


def known_version(cls: type[Record], version: Any) -> bool:
    """Whether ``version`` is one a reader of ``cls`` decodes strictly: 1 to its own."""
    return isinstance(version, int) and not isinstance(version, bool) and 1 <= version <= cls.SCHEMA_VERSION


def from_json_forward(cls: type[R], data: bytes | str) -> tuple[R, bool]:
    """Decode a message of this version or a newer one, for consumers that must keep reading when
    producers upgrade first. Fields this version does not know (at any depth) are ignored; the rest
    is validated as usual. Returns (record, whether the message was newer). Malformed versions raise
    ValidationError."""
    obj = parse_json(data)
    if not isinstance(obj, dict):
        raise ValidationError(_WHOLE, obj, f"expected a JSON object for {cls.NAME}")
    version = obj.get(VERSION_FIELD)
    if isinstance(version, bool) or not isinstance(version, int) or version <= cls.SCHEMA_VERSION:
        return from_versioned_dict(cls, obj), False
    return cls.from_dict(_known_fields(cls, obj)), True  # type: ignore[return-value]


def _known_fields(cls: type[Record], obj: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, spec in specs(cls):
        if name not in obj:
            continue
        value = obj[name]
        if spec.kind is Kind.RECORDS and spec.item is not None and isinstance(value, list):
            value = [_known_fields(spec.item, v) if isinstance(v, dict) else v for v in value]
        out[name] = value
    return out


def parse_json(data: bytes | str) -> Any:
    """Parse JSON bytes with the wire's limits; no record rules applied."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ValidationError(_WHOLE, f"{len(data)} bytes", f"message larger than {MAX_MESSAGE_BYTES} bytes")
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as error:
            raise ValidationError(_WHOLE, bytes(data[:40]), f"not UTF-8: {error.reason}") from None
    try:
        return json.loads(data, object_pairs_hook=_unique_keys)
    except ValidationError:
        raise
    except RecursionError:
        raise ValidationError(_WHOLE, data[:40], "JSON nested too deeply") from None
    except ValueError as error:
        raise ValidationError(_WHOLE, data[:40], f"not JSON: {error}") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValidationError(key, value, "duplicate key")
        out[key] = value
    return out
