"""Candidates by a k-d tree equal the brute-force owners x fleet filter, pair for pair and in order."""

from __future__ import annotations

import numpy as np
import pytest

from model.candidates import candidate_pairs


def brute_force(xy: np.ndarray, owners: np.ndarray, known: np.ndarray, range_m: float | None):
    src, dst = np.repeat(owners, len(known)), np.tile(known, len(owners))
    distance = np.hypot(*(xy[src, c] - xy[dst, c] for c in (0, 1)))
    keep = (src != dst) & ~np.isnan(distance) & (distance <= (np.inf if range_m is None else range_m))
    return src[keep], dst[keep], distance[keep]


@pytest.mark.parametrize("devices,range_m", [(1, 300.0), (50, 300.0), (400, 150.0), (400, None), (2000, 80.0)])
def test_the_index_finds_exactly_the_pairs_within_range(devices: int, range_m: float | None) -> None:
    rng = np.random.default_rng(devices)
    xy = rng.uniform(0, 1000, (devices, 2))
    xy[rng.random(devices) < 0.1] = np.nan  # devices without a status
    known = np.flatnonzero(~np.isnan(xy[:, 0]))
    owners = np.sort(rng.choice(devices, size=max(1, devices // 5), replace=False))
    got, want = candidate_pairs(xy, owners, known, range_m), brute_force(xy, owners, known, range_m)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert len(got[0]) > 0 or devices == 1


def test_a_pair_exactly_at_the_range_is_a_candidate_and_one_beyond_is_not() -> None:
    xy = np.array([[0.0, 0.0], [300.0, 0.0], [300.001, 0.0]])
    src, dst, distance = candidate_pairs(xy, np.array([0]), np.arange(3), 300.0)
    assert src.tolist() == [0] and dst.tolist() == [1] and distance.tolist() == [300.0]
