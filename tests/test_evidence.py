"""Forgetting-weighted evidence: decay by hand, the offline track equals a slot-by-slot replay, features."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from model.channel import OnTimeCurve
from model.evidence import (CHANNELS, CLAIMS, DISCREDITED, DRIFT_SCALE, KEY_ORDER_MIN, LOADED, LONG_MEMORY, N, NEVER,
                            POPULATION, REPORT_CHANNELS, RIDGE, SIZED, SK, SV, W, EvidenceConfig, EvidenceState,
                            EvidenceTrack, discredited_block, find, key_order, load_drift, load_memory, load_rate,
                            memories, pair_evidence_features, positions, report_increments, role_increments,
                            typical_speed_gap, verified_cpu, with_status)
from model.graphs import SlotGraph

LAMS = np.array([0.5, 1.0])


def increments(*rows: tuple[float, ...]) -> np.ndarray:
    """Rows of the first channels (n, w, f, tr, com, ton), the load channels zero."""
    rows = np.array(rows, dtype=float)
    return np.pad(rows, ((0, 0), (0, len(CHANNELS) - rows.shape[1])))


def test_state_decays_lazily_and_adds() -> None:
    state = EvidenceState(LAMS)
    state.update(np.array([7, 3]), 2, increments((1, 1, 1, 1, 1, 1), (2, 0, 0, 0, 0, 0)))
    state.update(np.array([7]), 4, increments((1, 0, 1, 0, 0, 0)))  # 7 decays 2 slots, then adds
    values, since = state.query(np.array([7, 3, 99]), 5)
    # key 7, lambda 0.5: n = (1 * 0.25 + 1) * 0.5 = 0.625; w = 1 * 0.25 * 0.5 = 0.125; lambda 1: n = 2, w = 1
    assert values[0, 0, N] == pytest.approx(0.625) and values[0, 0, W] == pytest.approx(0.125)
    assert values[0, 1, N] == pytest.approx(2.0) and values[0, 1, W] == pytest.approx(1.0)
    assert values[1, 0, N] == pytest.approx(2 * 0.5 ** 3) and values[1, 1, N] == pytest.approx(2.0)
    assert (values[2] == 0).all() and since.tolist() == [1, 3, NEVER]


def hashed_keys(n: int, seed: int) -> np.ndarray:
    """(n,) int64 keys as hashes give them, with what a quick order could get wrong: repeats, negatives, extremes, and
    runs that differ only in their low bits (the bits :func:`key_order` puts its indices in)."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, n, dtype=np.int64, endpoint=True)
    tenth = n // 10
    keys[:tenth] = keys[n - tenth:]  # repeats
    shared = slice(tenth, 2 * tenth)
    # eight high parts, each under many keys that differ in their low bits alone
    keys[shared] = (keys[:8] >> 30 << 30)[rng.integers(0, 8, tenth)] | rng.integers(0, 1 << 12, tenth)
    extremes = [np.iinfo(np.int64).min, np.iinfo(np.int64).max, -1, 0][:n]
    keys[:len(extremes)] = extremes
    return keys[rng.permutation(n)]


def test_a_long_memory_is_kept_only_where_loads_are_reported() -> None:
    assert LONG_MEMORY == 0.995
    assert memories((0.7, 0.9), loads_reported=False) == (0.7, 0.9)
    assert memories((0.7, 0.9), loads_reported=True) == (0.7, 0.9, 0.995)  # short to long memory still
    assert memories((0.9, 0.995, 1.0), loads_reported=True) == (0.9, 0.995, 1.0)  # kept once, in order


def test_chosen_memories_are_ordered_and_read_the_level_at_the_nearest() -> None:
    config = EvidenceConfig()
    assert config.with_memories([0.98, 0.7]) == replace(config, lams=(0.7, 0.98), level_memory=0.98)
    assert config.with_memories([0.7]).level_memory == 0.7 and config.with_memories([0.9, 1.0]).level_memory == 0.9
    for bad, shown in (([], ""), ([0.7, 0.7], "0.7 0.7"), ([0.0], "0.0"), ([1.2], "1.2")):
        with pytest.raises(ValueError, match=rf"--memories: distinct forgetting factors in \(0, 1\] \(got {shown}\)"):
            config.with_memories(bad)


@pytest.mark.parametrize("n", [0, 1, 7, KEY_ORDER_MIN - 1, KEY_ORDER_MIN, 3 * KEY_ORDER_MIN + 5])
def test_key_order_is_the_stable_argsort(n: int) -> None:
    keys = hashed_keys(n, n)
    assert np.array_equal(key_order(keys), np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("n, m", [(0, 5), (5, 0), (100, 30), (3 * KEY_ORDER_MIN, 1000)])
def test_positions_agree_with_find(n: int, m: int) -> None:
    keys = hashed_keys(n, 1)
    rng = np.random.default_rng(2)
    some = rng.choice(keys, min(m, n), replace=False) if n else np.zeros(0, np.int64)
    known = np.sort(np.r_[some, some[:3], rng.integers(-5, 5, m)].astype(np.int64))  # some keys (3 twice), some absent
    at, found = find(known, keys)
    got = positions(known, keys, -1)
    assert np.array_equal(got, np.where(found, at, -1))
    assert (got >= 0).any() == (n > 0 and m > 0)


def test_prune_forgets_only_faded_keys() -> None:
    state = EvidenceState(np.array([0.5]))
    state.update(np.array([1, 2]), 0, increments((1, 0, 0, 0, 0, 0), (1, 0, 0, 0, 0, 0)))
    state.update(np.array([2]), 20, increments((1, 0, 0, 0, 0, 0)))
    state.prune(20, below=1e-3)  # key 1: 0.5 ** 20 < 1e-3
    assert state.keys.tolist() == [2]


def test_track_equals_a_replayed_state_at_every_slot() -> None:
    rng = np.random.default_rng(0)
    updates = []
    for slot in (0, 1, 4, 5, 9):
        keys = np.unique(rng.integers(0, 6, size=4))
        updates.append((slot, keys, rng.random((len(keys), len(CHANNELS)))))
    track = EvidenceTrack.record(LAMS, updates)
    state = EvidenceState(LAMS)
    queries = np.arange(7)
    for slot in range(12):
        for when, keys, values in updates:
            if when == slot:
                state.update(keys, slot, values)
        want, want_since = state.query(queries, slot)
        got, got_since = track.query(queries, np.full(len(queries), slot))
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert got_since.tolist() == want_since.tolist()


def test_role_increments_by_hand() -> None:
    # owner 0 -> collaborator 2 (2 flagged tasks of 2 Mbit: 2 tr, 1 com), owner 1 -> 2 (1 graded task at 0.5, of
    # 0.5 Mbit)
    graph = SlotGraph(0, np.array([0, 1]), np.array([2, 2]), np.array([0.8, 0.5]), np.zeros(2),
                      tasks=np.array([2, 1]), flagged=np.array([2, 0]), tr=np.array([2, 0]), com=np.array([1, 0]),
                      profile=np.array([[2e6, 1e3], [5e5, 1e3]]), time_ratio=np.array([np.exp(1.4), np.nan]),
                      log_speed=np.array([np.log(2e9), np.nan]), timed=np.array([2, 0]))
    config = EvidenceConfig(on_time=OnTimeCurve.fit(np.array([np.exp(1.4)]), np.array([4.0]), np.array([1.0])).factor,
                            size_split_bits=1e6)
    factor = config.on_time_factor(np.array([np.exp(1.4)]))[0]
    assert factor < 1  # late tasks: fewer computations to expect
    roles = role_increments(graph, n=3, config=config)
    keys, sums = roles["collaborator"]
    assert keys.tolist() == [2]
    # no loads yet; the sizes: x = +1 for the flagged tasks, larger than the 1-Mbit split (the graded one, smaller,
    # transmitted none)
    ton = 2 * factor
    # and the timed tasks with their summed log speed (the claim taken off by the holder: with_status); no cycles yet
    np.testing.assert_allclose(sums[0], [3, 2 * 0.8 + 0.5, 2, 2, 1, ton, 0, 0, 0, 0, 0, ton, 1, ton, 1, ton, 2,
                                         2 * np.log(2e9), 0, 0, 0])
    unsplit = role_increments(graph, n=3, config=replace(config, size_split_bits=None))["collaborator"][1]
    assert not unsplit[:, list(SIZED)].any()  # no split known: no size evidence
    keys, sums = roles["owner"]
    assert keys.tolist() == [0, 1] and sums.shape == (2, 2)  # what owners report: n and w, all an owner keeps
    np.testing.assert_allclose(sums[:, [N, W]], [[2, 1.6], [1, 0.5]])
    keys, sums = roles["pair"]  # n, w, f, tr, com: all a pair keeps
    assert keys.tolist() == [0 * 3 + 2, 1 * 3 + 2]
    np.testing.assert_allclose(sums, [[2, 1.6, 2, 2, 1], [1, 0.5, 0, 0, 0]])
    keys, sums = roles["population"]  # the whole slot under one key, no speeds (no one claim to set them against)
    assert keys.tolist() == [POPULATION]
    want = roles["collaborator"][1].sum(axis=0)
    want[list(CLAIMS)] = 0
    np.testing.assert_allclose(sums[0], want)


def test_an_old_success_does_not_look_like_a_new_one() -> None:
    config = EvidenceConfig(lams=(0.7, 0.9))
    state = EvidenceState(np.asarray(config.lams))
    success = increments((1, 1, 1, 1, 1, 1))
    state.update(np.array([0]), 0, success)
    state.update(np.array([1]), 29, success)
    values, since = state.query(np.array([0, 1]), 30)
    zeros = np.zeros_like(values)
    features = pair_evidence_features(values, zeros, zeros, since, config)
    assert features.shape == (2, config.features)
    recent_count, old_count = features[1, 0], features[0, 0]  # j's log task count at lambda 0.7
    assert recent_count > 10 * old_count
    lams = len(config.lams)
    # recency and seen, then load, reported, the drift and the memory
    recency, seen = config.normalized - 4 - 2 * lams, config.normalized - 3 - 2 * lams
    assert features[0, recency] > features[1, recency]  # recency: 30 slots against 1
    assert features[:, seen].tolist() == [1.0, 1.0]  # both were seen


def test_features_read_by_index_equal_the_per_pair_ones() -> None:
    rng = np.random.default_rng(0)
    config = EvidenceConfig()
    shape = (len(config.lams), len(CHANNELS))
    devices, pairs, pair_table = 7, 40, rng.uniform(0, 5, (4, *shape))
    collaborator, owner = rng.uniform(0, 5, (devices, *shape)), rng.uniform(0, 5, (devices, *shape))
    since, load = rng.integers(0, 50, devices), np.where(rng.random(devices) < 0.5, rng.random(devices), np.nan)
    population = rng.uniform(0, 50, (1, *shape))
    src, dst, pair_at = rng.integers(0, devices, pairs), rng.integers(0, devices, pairs), rng.integers(0, 4, pairs)
    per_pair = pair_evidence_features(collaborator[dst], owner[src], pair_table[pair_at], since[dst], config,
                                      population, load[dst])
    indexed = pair_evidence_features(collaborator, owner, pair_table, since, config, population, load, src=src,
                                     dst=dst, pair_at=pair_at)
    assert indexed.shape == (pairs, config.features) and np.array_equal(indexed, per_pair)


def test_claimed_cpus_are_judged_against_the_speeds_shown_by_hand() -> None:
    sums = np.zeros((4, len(CHANNELS)))
    sums[:, SK], sums[:, SV] = [2, 3, 1, 4], np.array([2, 3, 1, 4]) * np.log([1e9, 2e9, 1e9, 1e9])
    claimed = with_status(sums, np.full(4, np.nan), np.array([2e9, 2e9, 2e9, np.nan]))
    # the log of speed shown over claim, summed over the timed tasks; nothing where no claim is known
    np.testing.assert_allclose(claimed[:, list(CLAIMS)], [[2, 2 * np.log(0.5)], [3, 0], [1, np.log(0.5)], [0, 0]])
    track = claimed[:, None, :]  # (n, L=1, C) as of now
    config = EvidenceConfig(lams=(0.9,), level_memory=0.9, speed_gap=np.log(0.9))
    assert typical_speed_gap(track) == pytest.approx(np.median([np.log(0.5), 0.0]))  # those with >= 2 timed tasks
    assert typical_speed_gap(np.zeros((2, 1, len(CHANNELS)))) is None
    # device 0 shows 0.5 of its claim where 0.9 is typical: log 0.59 short, beyond the margin at its 2 tasks (0.435),
    # read at 2 GHz x 0.5 / 0.9;
    # device 1 shows more than typical (believed), device 2 one task (not judged), device 3 no claim
    cpu = verified_cpu(np.array([2e9, 2e9, 2e9, 2e9]), track, config)
    np.testing.assert_allclose(cpu, [2e9 * 0.5 / 0.9, 2e9, 2e9, 2e9])
    slight = verified_cpu(np.array([2e9]), track[:1], replace(config, speed_gap=np.log(0.7)))  # log 0.34 short
    assert slight[0] == 2e9 and verified_cpu(np.array([2e9]), track[:1], replace(config, speed_gap=None))[0] == 2e9
    # the same shortfall, 1.38 x (log 0.32), judged by how many timed tasks show it: the margin is log 1.25 + 0.3 /
    # sqrt(n), 0.435 at 2 tasks (believed: a busy stretch may show that), 0.298 at 16 (read at what they show)
    shortfall = np.zeros((2, 1, len(CHANNELS)))
    shortfall[:, 0, SK] = [2, 16]
    shortfall[:, 0, SV] = shortfall[:, 0, SK] * (np.log(0.9) - 0.32)
    np.testing.assert_allclose(verified_cpu(np.full(2, 2e9), shortfall, config), [2e9, 2e9 * np.exp(-0.32)])
    # a reported load: the claim is the share of the CPU it leaves free (a busy device is slower and says so)
    busy = with_status(sums[:1], np.array([0.5]), np.array([2e9]))
    assert busy[0, SV] == pytest.approx(2 * np.log(1e9 / (2e9 * 0.5)))


def test_load_channels_and_the_rate_at_a_load_by_hand() -> None:
    sums = increments((2, 0, 2, 2, 1, 2), (1, 0, 1, 1, 1, 1), (3, 0, 3, 3, 3, 3))
    loaded = with_status(sums, np.array([0.8, np.nan, 0.2]), np.full(3, np.nan))
    np.testing.assert_allclose(loaded[:, :6], sums[:, :6])  # the first channels as they were
    # ton, com where a load was reported, then ton*u, com*u, ton*u^2; nothing for the device that reported none
    np.testing.assert_allclose(loaded[:, list(LOADED)], [[2, 1, 1.6, 0.8, 1.28], [0, 0, 0, 0, 0], [3, 3, 0.6, 0.6, 0.12]])
    # one device's tasks at two loads: 1 of 2 computed at u = 0.8, 3 of 3 at u = 0.2 -> a line through the means
    total = loaded[[0, 2]].sum(axis=0)[None, None, :]  # (P=1, L=1, C)
    rate, slope = load_rate(total, np.array([0.8]))
    tk, ck, tu, cu, tuu = 5.0, 4.0, 2.2, 1.4, 1.4
    mean_u = tu / tk
    want_slope = (cu - ck * mean_u) / (tuu - tu ** 2 / tk + RIDGE * tk)
    assert slope[0, 0] == pytest.approx(want_slope) and want_slope < 0  # busier, less reliable
    assert rate[0, 0] == pytest.approx((ck + 1) / (tk + 2) + want_slope * (0.8 - mean_u))
    rate, slope = load_rate(total, np.array([np.nan]))  # no load now: the smoothed rate
    assert rate[0, 0] == pytest.approx(5 / 7) and slope[0, 0] == pytest.approx(want_slope)
    rate, slope = load_rate(np.zeros((1, 1, len(CHANNELS))), np.array([0.5]))  # nothing known
    assert rate[0, 0] == 0.5 and slope[0, 0] == 0.0
    # the load's drift: the load now against the mean at the tasks (2.2 / 5 = 0.44), doubled, clipped; 0 unknown
    drift = load_drift(np.concatenate([total, total, np.zeros_like(total)]), np.array([0.8, 0.1, 0.5]))
    np.testing.assert_allclose(drift[:, 0], [DRIFT_SCALE * (0.8 - 0.44), DRIFT_SCALE * (0.1 - 0.44), 0.0])
    assert load_drift(total, np.array([np.nan]))[0, 0] == 0.0 and load_drift(total, np.array([5.0]))[0, 0] == 1.0


def test_load_memory_by_hand() -> None:
    # device 5 reports 0.2 by slot 0's end and 0.6 by slot 2's (slot 1 repeats 0.2); device 6 never reports
    state = EvidenceState(LAMS, channels=len(REPORT_CHANNELS))
    for slot, latest in ((0, [0.2, np.nan]), (1, [0.2, np.nan]), (2, [0.6, np.nan])):
        keys, sums = report_increments(np.array([5, 6]), np.array(latest))
        assert keys.tolist() == [5]
        state.update(keys, slot, sums)
    values, _ = state.query(np.array([5, 6]), 2)
    memory = load_memory(values, 2, len(LAMS))
    # lambda 0.5: (0.2 * 0.25 + 0.2 * 0.5 + 0.6) / (0.25 + 0.5 + 1); lambda 1: the plain mean
    assert memory[0, 0] == pytest.approx(0.75 / 1.75) and memory[0, 1] == pytest.approx(1.0 / 3)
    assert (memory[1] == 0).all()  # nothing reported
    assert (load_memory(None, 2, len(LAMS)) == 0).all()
    config = EvidenceConfig(lams=(0.5, 1.0), level_memory=1.0)
    zeros = np.zeros((2, 2, len(CHANNELS)))
    features = pair_evidence_features(zeros, zeros, zeros, np.full(2, NEVER), config, reports=values)
    # the memory: the collaborator's last normalized columns, after the owner's and the pair's blocks
    np.testing.assert_allclose(features[:, config.normalized - 2:config.normalized], memory, rtol=1e-6)


def test_what_was_not_believed_by_hand_and_only_where_the_evidence_reads_it() -> None:
    # device 0: of it, 3 tasks not believed at the first memory, reported T_col 3 (praise), 1 task at the second, T_col
    # 0.6; from it, none. device 1: of it, none; from it, 4 of its 5 reported tasks not believed at the first memory,
    # 0 of 2 at the second
    sums = np.zeros((2, 2, len(DISCREDITED)))
    sums[0, 0, :2], sums[0, 1, :2] = (3.0, 3.0), (1.0, 0.6)
    sums[1, 0, 2:], sums[1, 1, 2:] = (4.0, 5.0), (0.0, 2.0)
    block = discredited_block(sums, 2, 2)
    np.testing.assert_allclose(block[0], [np.log1p(3.0) / 3, np.log1p(1.0) / 3, 1.5 / 4, 0.1 / 2, 0, 0, 0, 0])
    np.testing.assert_allclose(block[1], [0, 0, 0, 0, np.log1p(4.0) / 3, 0, 4 / 6, 0])
    assert (discredited_block(None, 2, 2) == 0).all()
    zeros = np.zeros((2, 2, len(CHANNELS)))
    plain = EvidenceConfig(lams=(0.5, 1.0), level_memory=1.0)
    reads = EvidenceConfig(lams=(0.5, 1.0), level_memory=1.0, discredited=True)
    assert reads.normalized == plain.normalized + 8 and reads.features == plain.features + 8
    features = pair_evidence_features(zeros, zeros, zeros, np.full(2, NEVER), reads, discredited=sums)
    assert features.shape == (2, reads.features)
    # the block: the collaborator's last normalized columns, after its load's memory; nothing else moved
    np.testing.assert_allclose(features[:, reads.normalized - 8:reads.normalized], block, rtol=1e-6)
    without = pair_evidence_features(zeros, zeros, zeros, np.full(2, NEVER), plain, discredited=sums)
    np.testing.assert_array_equal(np.delete(features, np.s_[reads.normalized - 8:reads.normalized], axis=1), without)
