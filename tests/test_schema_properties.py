"""Property-based: the decoder never fails with anything but ValidationError, and valid records round-trip."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import WIRE_RECORDS, ValidationError, from_arrow, from_json, to_arrow, to_json
from schemas.batch import decode_batch
from tests.records import valid_records

PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


def decode_or_reject(cls, data: bytes) -> None:
    try:
        record = from_json(cls, data)
    except ValidationError as error:
        assert error.field and error.rule
    else:
        assert from_json(cls, to_json(record)) == record


@pytest.mark.parametrize("cls", WIRE_RECORDS, ids=lambda c: c.NAME)
@PROFILE
@given(data=st.binary(max_size=300))
def test_random_bytes(cls, data: bytes) -> None:
    decode_or_reject(cls, data)


@pytest.mark.parametrize("cls", WIRE_RECORDS, ids=lambda c: c.NAME)
@PROFILE
@given(data=st.data())
def test_valid_records_round_trip_exactly(cls, data: st.DataObject) -> None:
    record = data.draw(valid_records(cls))
    assert from_json(cls, to_json(record)) == record
    assert from_arrow(cls, to_arrow(cls, [record])) == [record]


@st.composite
def mutations(draw: st.DrawFn, cls) -> dict[str, Any]:
    body = json.loads(to_json(draw(valid_records(cls))))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["replace", "delete", "add", "nest"]))
        key = draw(st.sampled_from(sorted(body))) if body else "x"
        if action == "replace":
            body[key] = draw(json_values)
        elif action == "delete":
            body.pop(key, None)
        elif action == "add":
            body[draw(st.text(max_size=10))] = draw(json_values)
        elif isinstance(body.get(key), list) and body[key]:
            body[key][0] = draw(json_values)
    return body


@pytest.mark.parametrize("cls", WIRE_RECORDS, ids=lambda c: c.NAME)
@PROFILE
@given(data=st.data())
def test_mutated_records_are_rejected_cleanly_or_still_valid(cls, data: st.DataObject) -> None:
    body = data.draw(mutations(cls))
    decode_or_reject(cls, json.dumps(body, allow_nan=True).encode())


BATCHED = [c for c in WIRE_RECORDS if c.NAME in ("collaboration_event", "device_status")]


def messages(cls) -> st.SearchStrategy[bytes]:
    """Valid records, mutated ones, ASCII-only ones (the fast path's case) and raw bytes, mixed."""
    mutated = mutations(cls).map(lambda body: json.dumps(body, allow_nan=True).encode())
    valid = valid_records(cls).map(to_json)
    return st.one_of(valid, valid, mutated, st.binary(max_size=60),
                     valid.map(lambda m: m.decode("utf-8").encode("ascii", "ignore")))


@pytest.mark.parametrize("cls", BATCHED, ids=lambda c: c.NAME)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(batch=st.data())
def test_batch_decoder_accepts_exactly_what_the_codec_accepts(cls, batch: st.DataObject) -> None:
    sent = batch.draw(st.lists(messages(cls), max_size=8))
    decoded = decode_batch(cls, sent)
    expected, errors = [], {}
    for position, message in enumerate(sent):
        try:
            expected.append((position, from_json(cls, message)))
        except ValidationError as error:
            errors[position] = error
    assert decoded.positions.tolist() == [p for p, _ in expected]
    assert from_arrow(cls, decoded.table) == [r for _, r in expected]
    assert {p: (e.field, e.rule) for p, e in decoded.errors} == {p: (e.field, e.rule) for p, e in errors.items()}
