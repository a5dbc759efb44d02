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


def brute_latest(statuses: StatusLog, key: int, before_ms: int) -> int:
    """The entry a reader wants, by a loop: the latest of ``key`` before the time, the later-added on a tie; -1."""
    best = -1
    for entry in range(len(statuses)):
        if statuses.keys[entry] == key and statuses.times[entry] < before_ms and (
                best < 0 or statuses.times[entry] >= statuses.times[best]):
            best = entry
    return best


def test_every_query_and_the_prune_agree_with_a_loop_over_the_entries_as_the_log_changes() -> None:
    import pickle

    rng = np.random.default_rng(5)
    statuses = StatusLog()
    for step in range(12):
        n = int(rng.integers(0, 40))
        statuses.add(rng.integers(0, 9, n), rng.integers(0, 6, n) + 5 * step, rng.normal(size=(n, 9)))  # many ties
        keys = np.arange(-1, 11)
        for before_ms in (-5, int(rng.integers(0, 70)), 10_000):
            values, heard = statuses.heard(keys, before_ms)
            for row, key in enumerate(keys):
                want = brute_latest(statuses, key, before_ms)
                assert heard[row, 1] == (statuses.times[want] if want >= 0 else -1)
                np.testing.assert_array_equal(values[row], statuses.values[want] if want >= 0 else np.full(9, np.nan))
                times = statuses.times[(statuses.keys == key) & (statuses.times < before_ms)]
                assert heard[row, 0] == (times.min() if len(times) else -1)
        assert "_sorted" not in pickle.loads(pickle.dumps(statuses)).__dict__  # the job's state keeps no sort
        cut = int(rng.integers(0, 70))
        kept = {brute_latest(statuses, key, cut) for key in np.unique(statuses.keys)} - {-1}
        for key in np.unique(statuses.keys):  # each key's first, the later-added on a tie
            mine = np.flatnonzero(statuses.keys == key)
            kept.add(int(mine[statuses.times[mine] == statuses.times[mine].min()][-1]))
        kept |= set(np.flatnonzero(statuses.times >= cut).tolist())
        want = statuses.times[sorted(kept)], statuses.values[sorted(kept)]
        statuses.prune(cut)
        np.testing.assert_array_equal(statuses.times, want[0])
        np.testing.assert_array_equal(statuses.values, want[1])
