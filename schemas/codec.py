"""JSON wire encoding: compact UTF-8 JSON objects carrying ``schema_version``.

Decoding is strict: the bytes must be UTF-8 JSON of at most MAX_MESSAGE_BYTES,
an object without duplicate keys, with a known
``schema_version`` and exactly the record's fields. Every failure is a
:class:`ValidationError`. ``NaN``/``Infinity`` literals parse, then fail the
field's finiteness rule, so the error names the field.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from schemas.base import Record
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
    if isinstance(version, bool) or version != cls.SCHEMA_VERSION:
        raise ValidationError(
            VERSION_FIELD, version, f"unknown version for {cls.NAME} (known: {cls.SCHEMA_VERSION})"
        )
    return cls.from_dict(body)  # type: ignore[return-value]


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
