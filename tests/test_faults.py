"""Faults on the real broker: SIGKILL mid-cycle and mid-publication, a broker outage in --follow mode."""

from __future__ import annotations


import logging

import pytest

from bench.fault_harness import hostile, kill_restart, outage
from deploy.local.broker import free_port

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("kill", ["first-output", pytest.param("delay:4", marks=pytest.mark.slow)])
def test_a_killed_run_restarts_without_losing_or_repeating_a_slot(broker, tmp_path, kill: str) -> None:
    trial = kill_restart(broker.settings, tmp_path, kill)
    assert trial["killed"] == 1 and trial["attempts"] == 2  # the kill landed mid-run, and one restart finished
    assert trial["slots_lost"] == 0 and trial["records_missing"] == 0 and trial["duplicates_published"] == 0
    assert trial["equal_to_uninterrupted"]


def test_follow_mode_rides_out_a_broker_outage(tmp_path, caplog) -> None:
    caplog.set_level(logging.ERROR, logger="beam_pipeline.run")
    result = outage(tmp_path, free_port(), pause_s=6.0)
    assert not result["crashed"], result["error"]
    assert result["slots_before"] > 0 and result["slots_after_recovery"] == result["slots_expected_after"]
    assert result["republished_before_outage_slots"] == 0
    assert result["retries"] >= 1 and any("cycle failed" in r.getMessage() for r in caplog.records)
    assert result["log_replaced"]  # the memory broker came back empty: detected, and the job started over


def test_every_kind_of_hostile_input_is_dead_lettered_and_counted(broker, tmp_path) -> None:
    result = hostile(broker.settings, tmp_path)
    reasons = result["reasons"]
    missing = [kind for kind, reason in reasons.items() if kind != "duplicate" and not reason]
    assert not missing, f"not in dead-letter: {missing}"
    assert reasons["duplicate"] == "" and result["duplicates_dropped"] == 1
    assert "larger than" in reasons["oversized"] and "unknown version" in reasons["unknown_schema_version"]
    assert "in the future" in reasons["far_future"] and "before the clock's origin" in reasons["before_origin"]
    assert "non-printable" in reasons["control_characters"] and "trust_threshold" in reasons["nan"]
    assert "reporter: must name the owner or a monitor" in reasons["foreign_reporter"]
    assert result["letters_without_pointer"] == 0  # every letter says where its record came from
    assert result["read"] == result["accounted"] == result["valid_events"] + result["kinds"]
    assert result["outputs_equal_clean_run"] and result["duplicates_published"] == 0
