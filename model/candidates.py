"""Candidate pairs of a slot: each owner against the devices within range, found with a spatial index.

Cost ~ owners x neighbours (a k-d tree over the known positions, :class:`scipy.spatial.cKDTree`),
never owners x fleet; ``range_m=None`` (every device is a candidate) stays available and is quadratic
by definition. Pairs come out grouped by owner, owners in the order of their cells (squares of the range's
side) along a Z-order curve, each owner's candidates sorted (positions in the caller's arrays), so a slot's
scores do not depend on how they were found, and the pairs that a stage reads together (a chunk of them)
belong to owners close together, who share most candidates: on a 300k-device slot, owners in index order sent
~65k distinct devices through each chunk of 65,536 pairs, scattered over the fleet's rows.

:class:`Pieces` splits a slot's pair scoring by space, so a fleet's slot is scored on many workers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree


def candidate_pairs(xy: np.ndarray, owners: np.ndarray, known: np.ndarray,
                    range_m: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs (owner, candidate) within ``range_m`` metres.

    xy: (N, 2) positions, NaN where unknown; owners: (O,) and known: (K,) sorted int indices into xy
    (known: the rows with a position). Returns ``src``, ``dst`` (P,) int64 indices into xy, grouped by src in
    :func:`z_order` of the owners' cells (sorted by src where ``range_m`` is None), each owner's dst sorted,
    src != dst, and ``distance`` (P,) in metres.
    """
    owners = owners[~np.isnan(xy[owners]).any(axis=1)]
    if range_m is None:  # every known device: owners x fleet
        src, dst = np.repeat(owners, len(known)), np.tile(known, len(owners))
    elif len(owners) and len(known):
        owners = owners[z_order(np.floor(xy[owners] / range_m).astype(np.int64))]
        near = cKDTree(xy[owners]).sparse_distance_matrix(cKDTree(xy[known]), range_m, output_type="ndarray")
        found = near["i"].astype(np.int64) << 32 | near["j"]  # (owner's place in the order, candidate's)
        found.sort()  # one sort of int64 codes: ~0.2 s for 28M pairs, where per-owner lists took ~4 s
        src, dst = owners[found >> 32], known[found & 0xFFFFFFFF]
    else:
        src = dst = np.zeros(0, np.int64)
    distance = np.hypot(*(column[src] - column[dst] for column in (xy[:, 0].copy(), xy[:, 1].copy())))
    keep = (src != dst) & (distance <= (np.inf if range_m is None else range_m))
    return src[keep].astype(np.int64, copy=False), dst[keep].astype(np.int64, copy=False), distance[keep]


def z_order(cells: np.ndarray) -> np.ndarray:
    """The order (a stable argsort) of integer cells (n, 2) along a Z-order (Morton) curve: cells close together
    come close together, whatever the fleet's extent (each coordinate taken relative to its minimum, 31 bits)."""
    if not len(cells):
        return np.zeros(0, np.int64)
    code = np.zeros(len(cells), np.int64)
    for axis, offset in enumerate(cells.T - cells.min(axis=0)[:, None]):
        spread = offset.astype(np.int64) & 0x7FFFFFFF  # bit b of the coordinate goes to bit 2b + axis
        for shift, mask in ((16, 0x0000FFFF0000FFFF), (8, 0x00FF00FF00FF00FF), (4, 0x0F0F0F0F0F0F0F0F),
                            (2, 0x3333333333333333), (1, 0x5555555555555555)):
            spread = (spread | (spread << shift)) & mask
        code |= spread << axis
    return np.argsort(code, kind="stable")


@dataclass(frozen=True)
class Pieces:
    """How a slot's pair scoring splits into ``count`` pieces, so that no slot sits on one key.

    An owner belongs to the piece of the square cell (side ``max(cell_m, 2 range_m)``) its position lies
    in, each cell hashed to one of ``count`` pieces; a piece holds its owners and every device within
    ``range_m`` of them (and within :meth:`reach`'s margin of such a device): each device enters the pieces of the
    cells its range square touches, at most 4 without a margin (so the data sent grows by less than 4x, and by
    ``(1 + 2 range_m / side)^2`` on average). Owners
    without a position have no candidates (:func:`candidate_pairs`) and belong to no piece. With
    ``range_m=None`` (every device a candidate) there is one piece: that case is quadratic anyway.
    """

    count: int = 1
    cell_m: float = 2000.0

    def __post_init__(self) -> None:
        if not 1 <= self.count <= 4096:
            raise ValueError(f"Pieces.count: must lie in 1..4096 (got {self.count!r})")
        if not self.cell_m > 0:
            raise ValueError(f"Pieces.cell_m: must be > 0 metres (got {self.cell_m!r})")

    def side(self, range_m: float) -> float:
        return max(self.cell_m, 2.0 * range_m)

    def _piece(self, cx: np.ndarray, cy: np.ndarray) -> np.ndarray:
        """A cell's piece: a hash of its integer coordinates (neighbouring cells land on different pieces)."""
        return ((cx * 73_856_093) ^ (cy * 19_349_663)) % self.count

    def home(self, xy: np.ndarray, range_m: float | None) -> np.ndarray:
        """(n,) the piece of each device as an owner; -1 for a device without a position. xy: (n, 2) metres."""
        known = ~np.isnan(xy).any(axis=1)
        if range_m is None or self.count == 1:
            return np.where(known, 0, -1)
        cells = np.floor(np.where(known[:, None], xy, 0.0) / self.side(range_m)).astype(np.int64)
        return np.where(known, self._piece(cells[:, 0], cells[:, 1]), -1)

    def reach(self, xy: np.ndarray, range_m: float | None, margin_m: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """(rows, pieces) int64, sorted: each device with a position in every piece whose owners it may serve, or
        that stands within ``margin_m`` of one that may (its evidence is read with theirs: :mod:`model.identity`)."""
        rows = np.flatnonzero(~np.isnan(xy).any(axis=1))
        if range_m is None or self.count == 1:
            return rows, np.zeros(len(rows), np.int64)
        side, reach_m = self.side(range_m), range_m + margin_m
        low = np.floor((xy[rows] - reach_m) / side).astype(np.int64)  # (k, 2): side >= 2 range: 1 or 2 cells per axis
        high = np.floor((xy[rows] + reach_m) / side).astype(np.int64)  # (a margin may make it 3)
        steps = range(int((high - low).max(initial=0)) + 1)
        cells = [(np.minimum(low[:, 0] + dx, high[:, 0]), np.minimum(low[:, 1] + dy, high[:, 1]))
                 for dx in steps for dy in steps]
        pairs = np.unique(np.concatenate([rows * self.count + self._piece(cx, cy) for cx, cy in cells]))
        return pairs // self.count, pairs % self.count
