"""Fuzz the pipeline's parse step: whatever bytes arrive, ParseEvents never raises, and every message is
either a valid row or a dead letter with a reason (counted), exactly once."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_pipeline.kafka_io import RawBatch
from beam_pipeline.transforms import DEAD, ParseEvents
from bench.fault_harness import hostile_messages
from tests.pipeline_fixtures import SIM, job, run_tables, write_checkpoint


@pytest.fixture(scope="module")
def parser(tmp_path_factory: pytest.TempPathFactory) -> ParseEvents:
    parse = ParseEvents(job(write_checkpoint(tmp_path_factory.mktemp("ckpt") / "model")))
    parse.setup()
    return parse


VALID = run_tables()[0].slice(0, 30).drop_columns(["slot"]).to_pylist()
FIELDS = sorted(VALID[0])


def valid_bytes(row: dict) -> bytes:
    return json.dumps({"schema_version": 1, **row}).encode()


def mutated(draw) -> bytes:
    row = dict(draw(st.sampled_from(VALID)))
    kind = draw(st.sampled_from(["field", "drop", "bytes", "cut", "extra", "valid"]))
    if kind == "field":
        row[draw(st.sampled_from(FIELDS))] = draw(st.one_of(
            st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
            st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=200), st.lists(st.integers(), max_size=3)))
    elif kind == "drop":
        row.pop(draw(st.sampled_from(FIELDS)))
    elif kind == "extra":
        row[draw(st.text(max_size=20))] = 1
    data = json.dumps({"schema_version": 1, **row}, allow_nan=True).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "cut":
        return data[: draw(st.integers(min_value=0, max_value=len(data)))]
    return data


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(data=st.data())
def test_every_message_is_a_row_or_a_dead_letter(parser: ParseEvents, data) -> None:
    values = data.draw(st.lists(st.composite(lambda draw: mutated(draw))(), min_size=1, max_size=40))
    values += list(hostile_messages(VALID[0]).values()) if data.draw(st.booleans()) else []
    n = len(values)
    batch = RawBatch("events", 0, np.arange(n, dtype=np.int64), np.full(n, SIM.clock.origin_ms, np.int64), values, 0)
    parser.start_bundle()
    outputs = [*parser.process(batch), *parser.finish_bundle()]
    letters = [o.value for o in outputs if getattr(o, "tag", None) == DEAD]
    rows = sum(table.num_rows for o in outputs if getattr(o, "tag", None) is None
               for _, table in [o.value])
    lettered = {int(dict(headers)["source_offset"]) for _, _, _, headers in letters}
    assert len(lettered) == len(letters), "a message was dead-lettered twice"
    assert rows + len(letters) == n
    assert all(dict(headers)["reason"] for _, _, _, headers in letters)
