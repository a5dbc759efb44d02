"""Validation rules, encodings and the JSON Schema files, on hand-made records."""

from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pyarrow as pa
import pytest

from schemas import (
    MAX_MESSAGE_BYTES,
    WIRE_RECORDS,
    CollaborationEvent,
    CollaboratorRanking,
    RankedCandidate,
    TrustScore,
    ValidationError,
    arrow_schema,
    from_arrow,
    from_json,
    to_arrow,
    to_json,
)
from schemas.base import MAX_ID_CHARS
from schemas.jsonschema import render, schema_path
from tests.records import VALID, event, ranking


def wire(record=None, **changes) -> bytes:
    body = json.loads(to_json(record or event()))
    body.update(changes)
    return json.dumps(body).encode()


def rejected(data: bytes | str, cls=CollaborationEvent) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        from_json(cls, data)
    return caught.value


@pytest.mark.parametrize(
    "data, field, rule",
    [
        (b"\xff\xfe", "<record>", "not UTF-8"),
        (b"{not json", "<record>", "not JSON"),
        (b"[1, 2]", "<record>", "expected a JSON object"),
        (b"[" * 100_000, "<record>", "nested too deeply"),
        (b'{"schema_version": 1, "schema_version": 1}', "schema_version", "duplicate key"),
        (wire(schema_version=2), "schema_version", "unknown version"),
        (wire(schema_version=True), "schema_version", "unknown version"),
        (wire(schema_version="1"), "schema_version", "unknown version"),
        (wire(color="red"), "color", "unknown field"),
        (wire(event_time_ms="yesterday"), "event_time_ms", "expected an integer"),
        (wire(event_time_ms=1.5), "event_time_ms", "expected an integer"),
        (wire(event_time_ms=2**64), "event_time_ms", "int64"),
        (wire(event_time_ms=-1), "event_time_ms", ">= 0"),
        (wire(tr_success=1), "tr_success", "expected true or false"),
        (wire(task_size_bits=-5.0), "task_size_bits", "> 0"),
        (wire(task_size_bits=0), "task_size_bits", "> 0"),
        (wire(task_size_bits=True), "task_size_bits", "expected a number"),
        (wire(trust_threshold=1.5), "trust_threshold", "<= 1"),
        (wire(owner="dev-2"), "collaborator", "must differ from owner"),
        (wire(reporter="dev-7"), "reporter", "must name the owner or a monitor"),
        (wire(reporter="monitors:gw"), "reporter", "must name the owner or a monitor"),
        (wire(owner=None), "owner", "required field is null"),
        (wire(owner=""), "owner", "must not be empty"),
        (wire(owner="x" * (MAX_ID_CHARS + 1)), "owner", f"longer than {MAX_ID_CHARS}"),
        (wire(owner="dev\x001"), "owner", "non-printable character U+0000"),
        (wire(owner="dev\u200b1"), "owner", "non-printable character U+200B"),
        (wire(owner=" dev"), "owner", "whitespace"),
        (wire(owner=7), "owner", "expected a string"),
        (wire(com_success=None), "com_success", "come together"),
        (wire(tr_success=False, com_success=True), "com_success", "without transmission"),
        (wire(tr_success=None, com_success=None), "reliability", "outcome is required"),
        (wire(reliability=1.01), "reliability", "<= 1"),
    ],
)
def test_each_rule_names_field_value_and_rule(data: bytes, field: str, rule: str) -> None:
    error = rejected(data)
    assert error.field == field
    assert rule in error.rule
    assert field in str(error) and rule in str(error)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_numbers_fail_on_their_field(literal: str) -> None:
    data = wire().replace(b'"task_size_bits": 40000000.0', f'"task_size_bits": {literal}'.encode())
    error = rejected(data)
    assert (error.field, error.rule) == ("task_size_bits", "must be finite (no NaN or infinity)")


def test_missing_field_and_missing_version() -> None:
    body = json.loads(to_json(event()))
    del body["owner"]
    assert rejected(json.dumps(body)).rule == "required field is missing"
    del body["schema_version"]
    assert rejected(json.dumps(body)).field == "schema_version"


def test_an_older_version_is_read_without_the_fields_added_since() -> None:
    """Trust scores gained the task's size and the size slope in version 2, the size split and step in version 3, the
    CPU the collaborator was read at in version 4, the chance of success in version 5 and its step by size in version
    6 (nullable, as every field a version adds): version-1 to version-5 records still decode strictly, and still match
    their versions' JSON Schemas; versions outside 1 to the current one do not decode."""
    body = json.loads(to_json(VALID[TrustScore]()))
    assert body["schema_version"] == TrustScore.SCHEMA_VERSION == 6 and body["success_step"] == -0.06
    del body["success_step"]
    body["schema_version"] = 5
    fifth = from_json(TrustScore, json.dumps(body))
    assert fifth.success_step is None and fifth.p_success == 0.3
    jsonschema.validate(body, json.loads((schema_path(TrustScore).parent / "trust_score.v5.schema.json").read_text()))
    del body["p_success"]
    body["schema_version"] = 4
    fourth = from_json(TrustScore, json.dumps(body))
    assert fourth.p_success is None and fourth.cpu_hz == 2.1e9
    jsonschema.validate(body, json.loads((schema_path(TrustScore).parent / "trust_score.v4.schema.json").read_text()))
    del body["cpu_hz"]
    body["schema_version"] = 3
    third = from_json(TrustScore, json.dumps(body))
    assert third.cpu_hz is None and third.size_step == VALID[TrustScore]().size_step
    jsonschema.validate(body, json.loads((schema_path(TrustScore).parent / "trust_score.v3.schema.json").read_text()))
    del body["size_split_bits"], body["size_step"]
    body.update(schema_version=2, size_slope=-0.03)
    second = from_json(TrustScore, json.dumps(body))
    assert second.size_slope == -0.03 and second.size_step is None and second.size_split_bits is None
    jsonschema.validate(body, json.loads((schema_path(TrustScore).parent / "trust_score.v2.schema.json").read_text()))
    del body["task_size_bits"], body["size_slope"]
    body["schema_version"] = 1
    older = from_json(TrustScore, json.dumps(body))
    assert older.size_slope is None and older.task_size_bits is None and older.trust == VALID[TrustScore]().trust
    jsonschema.validate(body, json.loads((schema_path(TrustScore).parent / "trust_score.v1.schema.json").read_text()))
    for version in (0, 7):
        assert rejected(json.dumps({**body, "schema_version": version}), TrustScore).rule.startswith("unknown version")


def test_oversized_message_is_rejected_before_parsing() -> None:
    error = rejected(b" " * (MAX_MESSAGE_BYTES + 1))
    assert "larger than" in error.rule


def test_optional_fields_may_be_absent_and_graded_outcome_suffices() -> None:
    data = b'{"schema_version":1,"event_id":"b-1","event_time_ms":5,"owner":"a","collaborator":"b","reliability":0.25}'
    record = from_json(CollaborationEvent, data)
    assert record.reliability == 0.25 and record.tr_success is None and record.task_size_bits is None


def test_a_reporter_is_the_owner_a_monitor_or_unsaid_in_one_record_and_in_a_batch() -> None:
    from schemas.batch import decode_batch

    said = [None, "dev-1", "monitor:gw-3", "dev-9", "monitor", "monitor:"]
    messages = [to_json(event(event_id=f"e-{k}")).replace(b'"reporter":null', b'"reporter":' + json.dumps(r).encode())
                for k, r in enumerate(said)]
    decoded = decode_batch(CollaborationEvent, messages)
    assert decoded.table["reporter"].to_pylist() == [None, "dev-1", "monitor:gw-3"]
    assert decoded.positions.tolist() == [0, 1, 2]
    assert [(p, e.field, e.value) for p, e in decoded.errors] == [(3, "reporter", "dev-9"), (4, "reporter", "monitor"),
                                                                   (5, "reporter", "monitor:")]
    assert event(reporter="dev-1").reporter == "dev-1"
    with pytest.raises(ValidationError, match="reporter: must name the owner or a monitor"):
        event(reporter="dev-2")  # the collaborator does not report its own outcome


def test_ints_are_accepted_for_floats_and_normalized() -> None:
    record = from_json(CollaborationEvent, wire(task_size_bits=40))
    assert record.task_size_bits == 40.0 and isinstance(record.task_size_bits, float)


def test_ranking_rules_report_the_candidate_path() -> None:
    low = ranking(candidates=[RankedCandidate(collaborator="dev-2", trust=0.9, voc=0.8)]).to_dict()
    low["candidates"][0]["trust"] = 0.1
    with pytest.raises(ValidationError) as caught:
        CollaboratorRanking.from_dict(low)
    assert caught.value.field == "candidates.0.trust" and "below the threshold" in caught.value.rule
    with pytest.raises(ValidationError, match="candidates.1.voc: candidates must be in descending VoC"):
        ranking(candidates=[{"collaborator": "a", "trust": 0.9, "voc": 0.1}, {"collaborator": "b", "trust": 0.9, "voc": 0.5}])
    with pytest.raises(ValidationError, match="candidates.1.collaborator: listed twice"):
        ranking(candidates=[{"collaborator": "a", "trust": 0.9, "voc": 0.5}] * 2)
    with pytest.raises(ValidationError, match="candidates.0.voc: expected a number"):
        ranking(candidates=[{"collaborator": "a", "trust": 0.9, "voc": "high"}])
    with pytest.raises(ValidationError, match="slot_end_ms: must be after slot_start_ms"):
        ranking(slot_end_ms=180_000)


def test_constructing_a_record_in_code_validates_it() -> None:
    with pytest.raises(ValidationError, match="owner: must not be empty"):
        event(owner="")


@pytest.mark.parametrize("cls", WIRE_RECORDS, ids=lambda c: c.NAME)
def test_round_trip_json_and_arrow(cls) -> None:
    record = VALID[cls]()
    assert from_json(cls, to_json(record)) == record
    table = to_arrow(cls, [record, record])
    assert table.schema.equals(arrow_schema(cls))
    assert from_arrow(cls, table) == [record, record]


def test_arrow_schema_carries_nullability_units_and_version() -> None:
    schema = arrow_schema(CollaborationEvent)
    assert not schema.field("owner").nullable and schema.field("reliability").nullable
    assert schema.field("task_size_bits").metadata[b"unit"] == b"bit"
    assert schema.metadata[b"schema_version"] == b"1"
    assert arrow_schema(CollaboratorRanking).field("candidates").type == pa.list_(
        pa.struct([pa.field("collaborator", pa.string(), nullable=False),
                   pa.field("trust", pa.float64(), nullable=False),
                   pa.field("voc", pa.float64(), nullable=False),
                   pa.field("size_slope", pa.float64(), nullable=True),
                   pa.field("size_step", pa.float64(), nullable=True),
                   pa.field("cpu_hz", pa.float64(), nullable=True),
                   pa.field("p_success", pa.float64(), nullable=True),
                   pa.field("success_step", pa.float64(), nullable=True)]))
    assert arrow_schema(CollaboratorRanking).metadata[b"schema_version"] == b"6"


def test_from_arrow_names_bad_rows_and_columns() -> None:
    table = to_arrow(CollaborationEvent, [event(), event(event_id="e-2")])
    with pytest.raises(ValidationError, match="owner: column missing"):
        from_arrow(CollaborationEvent, table.drop(["owner"]))
    broken = table.set_column(table.schema.get_field_index("owner"), "owner", pa.array(["dev-1", "dev-2"]))
    with pytest.raises(ValidationError, match="row1.collaborator: must differ from owner"):
        from_arrow(CollaborationEvent, broken)
    wrong = table.set_column(table.schema.get_field_index("slot") if "slot" in table.column_names else 1,
                             "event_time_ms", pa.array([1.0, 2.0]))
    with pytest.raises(ValidationError, match="event_time_ms: expected int64"):
        from_arrow(CollaborationEvent, wrong)


@pytest.mark.parametrize("cls", WIRE_RECORDS, ids=lambda c: c.NAME)
def test_json_schema_files_are_current_and_accept_valid_records(cls) -> None:
    path = schema_path(cls)
    assert path.read_text() == render(cls), f"{path} is stale: run `make schemas`"
    schema = json.loads(path.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(json.loads(to_json(VALID[cls]())), schema)


@pytest.mark.parametrize("change", [{"owner": "x" * 200}, {"owner": "a\nb"}, {"task_size_bits": -1},
                                    {"schema_version": 2}, {"color": 1}, {"tr_success": "yes"}])
def test_json_schema_rejects_what_the_validator_rejects(change) -> None:
    schema = json.loads(schema_path(CollaborationEvent).read_text())
    body = {**json.loads(to_json(event())), **change}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, schema)
    with pytest.raises(ValidationError):
        from_json(CollaborationEvent, json.dumps(body))


@pytest.mark.parametrize("bad", [b"\x00\xffnot json", b'{"schema_version":1,"event_id":', b"{}\n{}", b"[1, 2]"])
def test_one_bad_message_leaves_the_rest_of_its_batch_on_the_fast_path(bad: bytes, monkeypatch) -> None:
    import schemas.batch as batch
    from schemas import CollaborationEvent, to_json
    from tests.records import event

    exact = []
    original = batch.from_json
    monkeypatch.setattr(batch, "from_json", lambda cls, data: exact.append(data) or original(cls, data))
    good = [to_json(event(event_id=f"e-{k}")) for k in range(500)]
    messages = good[:250] + [bad] + good[250:]
    decoded = batch.decode_batch(CollaborationEvent, messages)
    assert decoded.table.num_rows == 500 and [p for p, _ in decoded.errors] == [250]
    assert exact == [bad]  # only the bad message was decoded one by one
    assert decoded.positions.tolist() == [*range(250), *range(251, 501)]
