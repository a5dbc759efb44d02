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

Ids one after another (:func:`successions`): a whitewasher that reports its new id a few metres from the old one
escapes the radius, but not what its move looks like: an id falls silent, and within a few slots an id never heard
of before first reports near where it stood. Such an id continues the silent one's record
(``EvidenceConfig.succession_m``, ``succession_slots``) for as long as the old one stays silent. Honest newcomers
are judged apart unless one first reports that close to a device that has just fallen silent.

Poor records farther (:func:`poor_successions`): a whitewasher can move its new id beyond that radius. Leaving pays
it only where the record it leaves is poorer than what a fresh id is given, so an id that fell silent with a record
poorer than the fleet's (:func:`poor_records`) passes it on farther (``EvidenceConfig.poor_succession_m``): to a
fresh id within that radius and window, one to one, by the matching that links the most silent ids at the least cost,
a link costing its distance and its gap as shares of the radius and the window (a whitewasher that stays away a few
slots is still found where an id that came sooner stands farther). An id is judged by the record it carried
(:func:`carried`), so a whitewasher does not shed its past by a short stint under an id whose own record is fair. An
honest newcomer pays where it first reports near a poor device that has just left; none inherits a good record from
this far.

Glossary: ``xy`` (n, 2) reported positions (NaN: none known); ``group`` (n,) the group each id is judged in;
``first``, ``last`` (n,) the slots of each id's first and latest report (-1: none known).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix, csr_matrix
from scipy.sparse.csgraph import connected_components, min_weight_full_bipartite_matching
from scipy.spatial import cKDTree

from model.config import SlotClock
from model.evidence import N, W


def colocated(xy: np.ndarray, radius_m: float | None, links: np.ndarray | None = None) -> np.ndarray:
    """(n,) the group of each id: the connected components of "stands within ``radius_m`` of" (None: of no one), and
    of the further ``links`` (k, 2) of ids; an id without a known position is a group of its own unless linked.
    Groups are numbered 0.. in no particular order."""
    n = len(xy)
    known = np.flatnonzero(np.isfinite(xy).all(axis=1))
    near = cKDTree(xy[known]).query_pairs(radius_m, output_type="ndarray") if radius_m is not None and len(known) > 1 \
        else np.zeros((0, 2), np.int64)
    pairs = np.concatenate([known[near], np.zeros((0, 2), np.int64) if links is None else links])
    graph = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def heard_slots(first_ms: np.ndarray, last_ms: np.ndarray, clock: SlotClock) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) (n,): the slots of each id's first and latest report from their times (-1 ms: none known)."""
    return tuple(np.where(ms >= 0, clock.slot_of(np.maximum(ms, 0)), -1) for ms in (first_ms, last_ms))


def successions(xy: np.ndarray, first: np.ndarray, last: np.ndarray, radius_m: float, within_slots: int,
                among: np.ndarray | None = None) -> np.ndarray:
    """(k, 2) links (silent id, its successor): ids within ``radius_m`` of each other, one first heard of 1 to
    ``within_slots`` slots after the other was last; silent ids only ``among`` (n,) bool where given."""
    none = np.zeros((0, 2), np.int64)
    heard = np.flatnonzero(np.isfinite(xy).all(axis=1) & (first >= 0))
    silent = heard[last[heard] < last[heard].max()] if len(heard) else heard  # the few not heard of lately
    if among is not None:
        silent = silent[among[silent]]
    if not len(silent):
        return none
    fresh = heard[(first[heard] > last[silent].min()) & (first[heard] <= last[silent].max() + within_slots)]
    if not len(fresh):
        return none
    near = cKDTree(xy[silent]).sparse_distance_matrix(cKDTree(xy[fresh]), radius_m, output_type="ndarray")
    a, b = silent[near["i"]], fresh[near["j"]]
    took_over = (first[b] - last[a] >= 1) & (first[b] - last[a] <= within_slots)
    return np.stack([a[took_over], b[took_over]], axis=1).astype(np.int64)


def poor_records(collaborator: np.ndarray, population: np.ndarray) -> np.ndarray:
    """(n,) whether each id's record as collaborator (n, L, C), at the longest memory, is poorer than the fleet's
    (``population`` (L, C)): a mean T_col below the population's. An id that never served has no record."""
    served, fleet = collaborator[:, -1, N], population[-1]
    rate = np.divide(collaborator[:, -1, W], served, out=np.ones(len(served)), where=served > 0)
    return (served > 0) & (rate < fleet[W] / max(fleet[N], 1e-12))


def poor_successions(xy: np.ndarray, first: np.ndarray, last: np.ndarray, poor: np.ndarray, radius_m: float,
                     within_slots: int) -> np.ndarray:
    """(k, 2) links (silent id, its successor) as :func:`successions` makes them, from ids whose record is ``poor``
    (n,) bool only, and one to one: the matching that links the most silent ids and, among those, the least in all,
    a link costing its distance as a share of ``radius_m`` plus its gap as a share of ``within_slots`` (so a
    successor that waits a few slots is not lost to a farther id that appeared sooner)."""
    links = successions(xy, first, last, radius_m, within_slots, among=poor)
    if not len(links):
        return links
    gap = first[links[:, 1]] - last[links[:, 0]]
    cost = np.hypot(*(xy[links[:, 0]] - xy[links[:, 1]]).T) / radius_m + gap / within_slots  # (k,) each in (0, 2]
    silent, row = np.unique(links[:, 0], return_inverse=True)
    fresh, column = np.unique(links[:, 1], return_inverse=True)
    unlinked = 2.0 * len(links) + 1.0  # a silent id left unlinked costs more than any links it could reorder
    graph = csr_matrix((np.r_[cost, np.full(len(silent), unlinked)],
                        (np.r_[row, np.arange(len(silent))], np.r_[column, len(fresh) + np.arange(len(silent))])),
                       shape=(len(silent), len(fresh) + len(silent)))
    rows, columns = min_weight_full_bipartite_matching(graph)
    matched = np.empty(len(silent), np.int64)  # each silent id's column: a fresh id's, or its own unlinked one
    matched[rows] = columns
    return links[matched[row] == column]


def carried(collaborator: np.ndarray, links: np.ndarray, last: np.ndarray) -> np.ndarray:
    """(n, 1, 2) each id's record as collaborator (n, L, C) at the longest memory, its channels n and w, with the
    records it took over along ``links`` (k, 2) (silent id, successor), carried on in the order the silent ids fell
    silent: the last id of a chain carries every record of it."""
    out = collaborator[:, -1:, :max(N, W) + 1].copy()
    for silent, fresh in links[np.argsort(last[links[:, 0]], kind="stable")]:
        out[fresh] += out[silent]
    return out


def identity_groups(xy: np.ndarray, first: np.ndarray, last: np.ndarray, colocation_m: float | None,
                    succession_m: float | None, within_slots: int,
                    records: tuple[np.ndarray, np.ndarray] | None = None,
                    poor_succession_m: float | None = None) -> np.ndarray | None:
    """(n,) the group each id is judged in: ids at one place (:func:`colocated`), ids one after another
    (:func:`successions`) and, where ``records`` (each id's record as collaborator (n, L, C), the population's
    (L, C)) are given, poor records passed on as far as ``poor_succession_m`` (:func:`poor_successions`): a silent
    id judged by the record it carried (:func:`carried`: its own and those the links of a first pass, by its own
    record, handed it); None where every id is judged apart."""
    far = records is not None and poor_succession_m is not None
    if colocation_m is None and succession_m is None and not far:
        return None
    links = [np.zeros((0, 2), np.int64)]
    if succession_m is not None:
        links.append(successions(xy, first, last, succession_m, within_slots))
    if far:
        collaborator, population = records
        poor = poor_records(collaborator, population)
        own = poor_successions(xy, first, last, poor, poor_succession_m, within_slots)
        chain = np.concatenate([*links, own])
        if len(chain):  # records to carry: judge again by them where they change a verdict (else the first pass stands)
            again = poor_records(carried(collaborator, chain, last), population)
            if not np.array_equal(again, poor):
                own = poor_successions(xy, first, last, again, poor_succession_m, within_slots)
        links.append(own)
    group = colocated(xy, colocation_m, np.concatenate(links))
    return None if len(np.unique(group)) == len(group) else group


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
