"""Ids at one place are one collaborator: the defence against Sybils and whitewashers.

A device that answers under several ids (a Sybil's, all at once; a whitewasher's, one after another) still sits at one
place and reports that place in its statuses. Ids whose latest reported positions fall in one cell of ``cell_m``
metres are judged as one collaborator: each id's evidence as collaborator becomes the sum over its cell's ids, and its
recency the most recent of theirs. A Sybil's ids then pool their failures, and a whitewasher's new id starts from the
record its old ids left (decaying as any evidence does) instead of from the prior. Where every id has a cell of its
own (every honest fleet whose devices stand apart) nothing changes.

What it cannot see: an attacker that reports false positions for its ids (checking a claimed position against the
transmission outcomes it should give is not built), and honest devices closer than ``cell_m`` share their records.

Glossary: ``xy`` (n, 2) reported positions (NaN: none known); ``group`` (n,) the cell each id is judged in.
"""

from __future__ import annotations

import numpy as np


def colocated(xy: np.ndarray, cell_m: float) -> np.ndarray:
    """(n,) the group of each id: ids whose positions fall in one ``cell_m`` cell share one; an id without a known
    position is a group of its own. Groups are numbered 0.. in no particular order."""
    n = len(xy)
    known = np.isfinite(xy).all(axis=1)
    cells = np.zeros((n, 3), np.int64)
    cells[known, :2] = np.floor(xy[known] / cell_m).astype(np.int64)
    cells[~known, 2] = 1 + np.flatnonzero(~known)  # a cell of its own
    return np.unique(cells, axis=0, return_inverse=True)[1].reshape(n)


def judged_together(collaborator: np.ndarray, since: np.ndarray, xy: np.ndarray, cell_m: float | None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pooled` over the groups of :func:`colocated` (``cell_m`` None: every id judged apart)."""
    if cell_m is None:
        return collaborator, since
    return pooled(collaborator, since, colocated(xy, cell_m))


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
