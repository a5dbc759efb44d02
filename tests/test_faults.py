"""Faults on the real broker: SIGKILL mid-cycle and mid-publication, a broker outage in --follow mode."""

from __future__ import annotations


import pytest

from bench.fault_harness import kill_restart

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("kill", ["first-output", "delay:4"])
def test_a_killed_run_restarts_without_losing_or_repeating_a_slot(broker, tmp_path, kill: str) -> None:
    trial = kill_restart(broker.settings, tmp_path, kill)
    assert trial["killed"] == 1 or trial["attempts"] == 2  # the kill landed (or the run ended just before it)
    assert trial["slots_lost"] == 0 and trial["records_missing"] == 0 and trial["duplicates_published"] == 0
    assert trial["equal_to_uninterrupted"]
