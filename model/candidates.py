"""Candidate pairs of a slot: each owner against the devices within range, found with a spatial index.

Cost ~ owners x neighbours (a k-d tree over the known positions, :class:`scipy.spatial.cKDTree`),
never owners x fleet; ``range_m=None`` (every device is a candidate) stays available and is quadratic
by definition. Pairs come out sorted by owner, then candidate (positions in the caller's arrays), so a
slot's scores do not depend on how they were found.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree


def candidate_pairs(xy: np.ndarray, owners: np.ndarray, known: np.ndarray,
                    range_m: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs (owner, candidate) within ``range_m`` metres.

    xy: (N, 2) positions, NaN where unknown; owners: (O,) and known: (K,) sorted int indices into xy
    (known: the rows with a position). Returns ``src``, ``dst`` (P,) int64 indices into xy, sorted by
    (src, dst), src != dst, and ``distance`` (P,) in metres.
    """
    owners = owners[~np.isnan(xy[owners]).any(axis=1)]
    if range_m is None:  # every known device: owners x fleet
        src, dst = np.repeat(owners, len(known)), np.tile(known, len(owners))
    elif len(owners) and len(known):
        neighbours = cKDTree(xy[known]).query_ball_point(xy[owners], r=range_m, return_sorted=True)
        counts = np.fromiter((len(n) for n in neighbours), np.int64, len(owners))
        src = np.repeat(owners, counts)
        dst = known[np.concatenate(neighbours).astype(np.int64)] if counts.sum() else np.zeros(0, np.int64)
    else:
        src = dst = np.zeros(0, np.int64)
    distance = np.hypot(*(xy[src, c] - xy[dst, c] for c in (0, 1)))
    keep = (src != dst) & (distance <= (np.inf if range_m is None else range_m))
    return src[keep].astype(np.int64), dst[keep].astype(np.int64), distance[keep]
