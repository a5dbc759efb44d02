"""JSON Schema (draft 2020-12) files for consumers in other languages.

The files in ``schemas/json/`` are generated from the record definitions;
``python -m schemas.jsonschema`` rewrites them and a test checks they are current.
Cross-field rules that JSON Schema cannot state (owner != collaborator, VoC
order of rankings) are in each schema's description; the Python validator
enforces them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from schemas.base import MAX_ID_CHARS, Kind, Record, Spec, specs
from schemas.codec import VERSION_FIELD
from schemas.records import WIRE_RECORDS

JSON_DIR = Path(__file__).parent / "json"
# No control (C0, DEL, C1) characters, no leading/trailing whitespace; the
# Python validator (str.isprintable) also rejects other non-printable characters.
ID_PATTERN = r"^(?!\s)[^\u0000-\u001f\u007f-\u009f]*(?<!\s)$"

_TYPES = {Kind.ID: "string", Kind.INT: "integer", Kind.FLOAT: "number", Kind.BOOL: "boolean"}
_RULES = {
    "collaboration_event": "owner != collaborator; tr_success and com_success come together; "
    "an outcome (the two flags or reliability) is required; com_success implies tr_success.",
    "trust_score": "owner != collaborator; slot_end_ms > slot_start_ms.",
    "collaborator_ranking": "slot_end_ms > slot_start_ms; candidates distinct, != owner, "
    "trust >= threshold, in descending voc.",
}


def _property(spec: Spec) -> dict[str, Any]:
    if spec.kind is Kind.RECORDS:
        assert spec.item is not None
        prop: dict[str, Any] = {"type": "array", "items": _object(spec.item), "maxItems": spec.max_len}
    else:
        prop = {"type": _TYPES[spec.kind]}
    if spec.kind is Kind.ID:
        prop.update(minLength=1, maxLength=MAX_ID_CHARS, pattern=ID_PATTERN)
    for key, bound in (("minimum", spec.ge), ("exclusiveMinimum", spec.gt), ("maximum", spec.le)):
        if bound is not None:
            prop[key] = bound
    if spec.kind is Kind.INT:
        prop.setdefault("minimum", -(2**63))
        prop["maximum"] = 2**63 - 1
    if spec.nullable:
        prop["type"] = [prop["type"], "null"]
    prop["description"] = spec.doc + (f" [{spec.unit}]" if spec.unit else "")
    return prop


def _object(cls: type[Record]) -> dict[str, Any]:
    fields = list(specs(cls))
    return {
        "type": "object",
        "properties": {name: _property(spec) for name, spec in fields},
        "required": [name for name, spec in fields if not spec.nullable],
        "additionalProperties": False,
    }


def json_schema(cls: type[Record]) -> dict[str, Any]:
    """The JSON Schema of a record's wire form, ``schema_version`` included."""
    body = _object(cls)
    body["properties"] = {VERSION_FIELD: {"const": cls.SCHEMA_VERSION}, **body["properties"]}
    body["required"] = [VERSION_FIELD, *body["required"]]
    doc = " ".join((cls.__doc__ or "").split())
    rules = _RULES.get(cls.NAME)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"urn:trustbeam:{cls.NAME}:v{cls.SCHEMA_VERSION}",
        "title": cls.NAME,
        "description": doc + (f" Rules across fields: {rules}" if rules else ""),
        **body,
    }


def schema_path(cls: type[Record]) -> Path:
    return JSON_DIR / f"{cls.NAME}.v{cls.SCHEMA_VERSION}.schema.json"


def render(cls: type[Record]) -> str:
    return json.dumps(json_schema(cls), indent=2, ensure_ascii=False) + "\n"


def main() -> None:
    JSON_DIR.mkdir(exist_ok=True)
    for cls in WIRE_RECORDS:
        schema_path(cls).write_text(render(cls))
        print(schema_path(cls))


if __name__ == "__main__":
    main()
