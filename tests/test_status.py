"""The latest status before a time: one implementation for the offline model and the streaming shards."""

from __future__ import annotations

import numpy as np

from model.status import StatusLog


def log() -> StatusLog:
    values = np.arange(5 * 9, dtype=float).reshape(5, 9)
    return StatusLog(np.array([0, 0, 1, 0, 3]), np.array([100, 50, 500, 300, 10]), values)


def test_latest_before_a_time_by_hand() -> None:
    statuses = log()
    got = statuses.latest(np.array([0, 1, 2, 3]), 200)
    np.testing.assert_array_equal(got[0], statuses.values[0])  # 100 is key 0's latest before 200 (300 is after)
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all()  # key 1 only later; key 2 never
    np.testing.assert_array_equal(got[3], statuses.values[4])


def test_one_time_per_key_and_ties_take_the_later_entry() -> None:
    statuses = log()
    statuses.add(np.array([0]), np.array([100]), np.full((1, 9), -1.0))  # same time as entry 0, added later
    got = statuses.latest(np.array([0, 0, 0]), np.array([60, 101, 1000]))
    np.testing.assert_array_equal(got[0], statuses.values[1])
    np.testing.assert_array_equal(got[1], np.full(9, -1.0))
    np.testing.assert_array_equal(got[2], statuses.values[3])


def test_prune_keeps_each_keys_latest_before_the_cut_and_its_first() -> None:
    statuses = log()
    before = statuses.latest(np.array([0, 1, 3]), 10_000)
    statuses.prune(400)
    assert sorted(statuses.times.tolist()) == [10, 50, 300, 500]  # key 0's 100 superseded; its first (50) kept
    np.testing.assert_array_equal(statuses.first_ms(np.array([0, 1, 3]), 10_000), [50, 500, 10])
    np.testing.assert_array_equal(statuses.latest(np.array([0, 1, 3]), 10_000), before)
