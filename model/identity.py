"""Ids at one place are one collaborator: the defence against Sybils and whitewashers.

A device that answers under several ids (a Sybil's, all at once; a whitewasher's, one after another) still sits at one
place and reports that place in its statuses. Ids whose latest reported positions lie within ``radius_m`` of each other
(or are linked by a chain of such ids) are judged as one collaborator: each id's evidence as collaborator becomes the
sum over its group's ids, and its recency the most recent of theirs; and an owner's own group is no candidate of
its tasks (:func:`model.scoring.score_pairs`: a device does not offload to itself). A Sybil's ids then pool their
failures, and a whitewasher's new id starts from the record its old ids left (decaying as any evidence does) instead of
from the prior.
Where no two ids stand that close (every honest fleet whose devices stand apart) nothing changes.

What it cannot see: an attacker that reports its ids farther apart than the radius, and honest devices closer than
it share their records (the radius trades one against the other; the README measures both).

Glossary: ``xy`` (n, 2) reported positions (NaN: none known); ``group`` (n,) the group each id is judged in.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree


def colocated(xy: np.ndarray, radius_m: float) -> np.ndarray:
    """(n,) the group of each id: the connected components of "stands within ``radius_m`` of"; an id without a known
    position is a group of its own. Groups are numbered 0.. in no particular order."""
    n = len(xy)
    known = np.flatnonzero(np.isfinite(xy).all(axis=1))
    pairs = cKDTree(xy[known]).query_pairs(radius_m, output_type="ndarray") if len(known) > 1 else np.zeros((0, 2), int)
    links = coo_matrix((np.ones(len(pairs)), (known[pairs[:, 0]], known[pairs[:, 1]])), shape=(n, n))
    return connected_components(links, directed=False)[1]


def pooled(collaborator: np.ndarray, since: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(collaborator (n, L, C), since (n,)) with each id's evidence as collaborator summed over its group, and its
    slots since it last served the fewest of its group's; the inputs themselves where no group holds two ids."""
    if len(np.unique(group)) == len(group):
        return collaborator, since
    sums = np.zeros((int(group.max()) + 1, *collaborator.shape[1:]), collaborator.dtype)
    np.add.at(sums, group, collaborator)
    latest = np.full(len(sums), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(latest, group, np.asarray(since, np.int64))
    return sums[group], latest[group].astype(np.asarray(since).dtype)
