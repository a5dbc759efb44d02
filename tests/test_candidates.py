"""Candidates by a k-d tree equal the brute-force owners x fleet filter, pair for pair, grouped by owner in the
Z-order of their cells."""

from __future__ import annotations

import numpy as np
import pytest

from model.candidates import Pieces, candidate_pairs, z_order


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
    order = np.lexsort((got[1], got[0]))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g[order], w)
    assert len(got[0]) > 0 or devices == 1
    src, dst, _ = got
    starts = np.flatnonzero(np.diff(src, prepend=-1) != 0)
    assert len(np.unique(src)) == len(starts)  # each owner's pairs together
    assert all((np.diff(part) > 0).all() for part in np.split(dst, starts[1:]))  # its candidates sorted
    placed = owners[~np.isnan(xy[owners, 0])]
    if range_m is not None:
        placed = placed[z_order(np.floor(xy[placed] / range_m).astype(np.int64))]
    np.testing.assert_array_equal(src[starts], placed[np.isin(placed, src)])


def test_z_order_follows_the_curve_and_keeps_ties_in_order() -> None:
    cells = np.array([[0, 0], [1, 0], [0, 1], [1, 1], [2, 0], [3, 3], [2, 2], [0, 0], [-4, -4]])
    # relative to (-4, -4), x in the even bits and y in the odd: codes 48, 49, 50, 51, 52, 63, 60, 48, 0
    assert z_order(cells).tolist() == [8, 0, 7, 1, 2, 3, 4, 6, 5]  # the two (0, 0) in their order
    assert z_order(np.zeros((0, 2), np.int64)).tolist() == []


def test_a_pair_exactly_at_the_range_is_a_candidate_and_one_beyond_is_not() -> None:
    xy = np.array([[0.0, 0.0], [300.0, 0.0], [300.001, 0.0]])
    src, dst, distance = candidate_pairs(xy, np.array([0]), np.arange(3), 300.0)
    assert src.tolist() == [0] and dst.tolist() == [1] and distance.tolist() == [300.0]


@pytest.mark.parametrize("count,cell_m,range_m", [(4, 1.0, 150.0), (7, 500.0, 100.0), (3, 2000.0, 300.0)])
def test_every_pair_within_range_lies_in_its_owners_piece_and_a_device_in_at_most_four(
        count: int, cell_m: float, range_m: float) -> None:
    rng = np.random.default_rng(count)
    xy = rng.uniform(-1500, 2500, (1500, 2))
    xy[rng.random(len(xy)) < 0.05] = np.nan
    pieces = Pieces(count, cell_m)
    home = pieces.home(xy, range_m)
    rows, piece = pieces.reach(xy, range_m)
    held = set(zip(rows.tolist(), piece.tolist()))
    known = np.flatnonzero(~np.isnan(xy[:, 0]))
    src, dst, _ = candidate_pairs(xy, known, known, range_m)
    assert len(src) > 1000 and all((d, home[s]) in held for s, d in zip(src.tolist(), dst.tolist()))
    assert (home[np.isnan(xy[:, 0])] == -1).all() and set(home[known].tolist()) == set(range(count))
    assert np.bincount(rows).max() <= 4 and np.isin(known, rows).all()
    fan_out = (1 + 2 * range_m / pieces.side(range_m)) ** 2  # cells a device's range square touches, on average
    assert len(rows) <= 1.1 * fan_out * len(known)


def test_one_piece_when_every_device_is_a_candidate() -> None:
    xy = np.array([[0.0, 0.0], [5e4, 5e4], [np.nan, np.nan]])
    pieces = Pieces(8, 100.0)
    assert pieces.home(xy, None).tolist() == [0, 0, -1]
    assert [a.tolist() for a in pieces.reach(xy, None)] == [[0, 1], [0, 0]]


def test_pieces_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="Pieces.count"):
        Pieces(0)
    with pytest.raises(ValueError, match="Pieces.cell_m"):
        Pieces(2, -1.0)


def test_a_piece_also_holds_the_devices_within_the_margin_of_its_candidates() -> None:
    """The ids model.identity judges together (within the margin of a candidate) are read in the candidate's piece."""
    rng = np.random.default_rng(5)
    xy = rng.uniform(0, 3000, (800, 2))
    pieces, range_m, margin_m = Pieces(5, 1.0), 150.0, 4.0
    twins = xy + rng.uniform(-margin_m / 2, margin_m / 2, xy.shape)  # each device's twin, within the margin
    both = np.concatenate([xy, twins])
    home = pieces.home(both, range_m)
    held = set(zip(*(a.tolist() for a in pieces.reach(both, range_m, margin_m))))
    plain = set(zip(*(a.tolist() for a in pieces.reach(both, range_m))))
    src, dst, _ = candidate_pairs(xy, np.arange(len(xy)), np.arange(len(xy)), range_m)
    assert all((d + len(xy), home[s]) in held for s, d in zip(src.tolist(), dst.tolist()))  # every twin, with it
    assert plain < held  # without the margin some twins stand outside their candidate's piece
