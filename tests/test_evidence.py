"""Forgetting-weighted evidence: decay by hand, the offline track equals a slot-by-slot replay, features."""

from __future__ import annotations

import numpy as np
import pytest

from model.channel import OnTimeCurve
from model.evidence import (COM, F, N, NEVER, POPULATION,, TON, TR, W, EvidenceConfig, EvidenceState, EvidenceTrack,
                            pair_evidence_features, role_increments)
from model.graphs import SlotGraph

LAMS = np.array([0.5, 1.0])


def increments(*rows: tuple[float, ...]) -> np.ndarray:
    return np.array(rows, dtype=float)


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
        updates.append((slot, keys, rng.random((len(keys), 6))))
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
    # owner 0 -> collaborator 2 (2 flagged tasks: 2 tr, 1 com), owner 1 -> 2 (1 graded task at 0.5)
    graph = SlotGraph(0, np.array([0, 1]), np.array([2, 2]), np.array([0.8, 0.5]), np.zeros(2),
                      tasks=np.array([2, 1]), flagged=np.array([2, 0]), tr=np.array([2, 0]), com=np.array([1, 0]),
                      time_ratio=np.array([np.exp(1.4), np.nan]))
    config = EvidenceConfig(on_time=OnTimeCurve.fit(np.array([np.exp(1.4)]), np.array([4.0]), np.array([1.0])).factor)
    factor = config.on_time_factor(np.array([np.exp(1.4)]))[0]
    assert factor < 1  # late tasks: fewer computations to expect
    roles = role_increments(graph, n=3, config=config)
    keys, sums = roles["collaborator"]
    assert keys.tolist() == [2]
    np.testing.assert_allclose(sums[0], [3, 2 * 0.8 + 0.5, 2, 2, 1, 2 * factor])
    keys, sums = roles["owner"]
    assert keys.tolist() == [0, 1] and sums[:, [F, TR, COM, TON]].sum() == 0  # what owners report: n and w
    np.testing.assert_allclose(sums[:, [N, W]], [[2, 1.6], [1, 0.5]])
    keys, _ = roles["pair"]
    assert keys.tolist() == [0 * 3 + 2, 1 * 3 + 2]
    keys, sums = roles["population"]  # the whole slot under one key
    assert keys.tolist() == [POPULATION]
    np.testing.assert_allclose(sums[0], roles["collaborator"][1].sum(axis=0))


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
    recency, seen = config.normalized - 2, config.normalized - 1
    assert features[0, recency] > features[1, recency]  # recency: 30 slots against 1
    assert features[:, seen].tolist() == [1.0, 1.0]  # both were seen
