"""What a slot publishes, and how a scored piece becomes it: the paper's selection as wire records.

* :class:`PairScores`: one piece of a slot scored (:func:`model.scoring.score_pairs`) and not yet published: every
  recent owner's candidates with their raw T_beh, T_res and VoC. :meth:`PairScores.publish` moves T_beh by the online
  recalibration's shift (:class:`model.publisher.SlotPublisher` gives it), forms T = T_beh * T_res and the chance of
  success P(success) * T_res (:func:`model.trust.success_probability`) and ranks each owner's candidates
  (:func:`ranked_rows`: T >= theta, then the highest VoC for the owner's task).
* :class:`SlotScores`: the trust scores and rankings of a slot or a piece of it, as :mod:`schemas` records.

Glossary: T_beh/T_res/T the paper's trusts, theta the task's trust threshold, V (``voc``) the value of task
completion (:mod:`model.physics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from model.config import RankingConfig, SlotClock, TrustWeights
from model.evidence import find
from model.graphs import pair_keys
from model.trust import success_probability
from schemas import CollaboratorRanking, Columns, Nested, RankedCandidate, TrustScore


@dataclass(frozen=True)
class SlotScores:
    """What a slot publishes: trust scores and rankings (wire records), keyed by owner when sent."""

    slot: int
    scores: Columns  # TrustScore records
    rankings: Columns  # CollaboratorRanking records
    piece: int = 0  # which piece of the slot (:meth:`model.scoring.DeviceFrame.pieces`): its owners' records, all
    #                 of them

    @classmethod
    def join(cls, results: list["SlotScores"]) -> "SlotScores":
        """The pieces of one slot as one result (piece 0), in piece order."""
        slots = {r.slot for r in results}
        if len(slots) != 1:
            raise ValueError(f"SlotScores.join: pieces of several slots {sorted(slots)}")
        by_owner = sorted(results, key=lambda r: r.piece)
        return cls(slots.pop(), Columns.concat([r.scores for r in by_owner]),
                   Columns.concat([r.rankings for r in by_owner]))


@dataclass
class PairScores:
    """One piece of a slot scored and not yet published: every recent owner's candidates with their raw T_beh (before
    the online recalibration, :mod:`model.recalibration`), T_res and VoC. :meth:`publish` ranks them into the
    slot's records; :meth:`forecasts` is what the next slot's outcomes are set against."""

    slot: int
    piece: int
    version: int  # the scorer's count of this piece's scorings (newer frames after late events score it again)
    keys: np.ndarray  # (n,) the frame's device keys
    ids: np.ndarray  # (n,) their ids
    owners: np.ndarray  # (o,) frame rows of the recent owners
    thresholds: np.ndarray  # (n,) theta per frame row (owners' tasks, else the default)
    src: np.ndarray  # (P,) frame rows of each pair's owner, grouped by owner
    dst: np.ndarray  # (P,) frame rows of its candidate
    t_beh: np.ndarray  # (P,) raw T_beh
    t_res: np.ndarray  # (P,)
    voc: np.ndarray  # (P,)
    believed: np.ndarray | None = None  # (P,) each pair's owner's credibility as a reporter (None: 1, all believed)
    task_sizes: np.ndarray | None = None  # (n,) per frame row its latest task's size, bit (NaN: none; None: unknown)
    size_step: np.ndarray | None = None  # (P,) T_beh's change for a task of the other size class (None: T_beh
    #                                      ignores the size)
    size_split_bits: float | None = None  # the size that parts the classes (model.evidence.size_x)
    cpu_hz: np.ndarray | None = None  # (n,) per frame row the CPU the physics read it at (its claim, or as far as its
    #                                   tasks' times bear that out: model.evidence.verified_cpu; None: not published)
    p_tr: np.ndarray | None = None  # (P,) each pair's P(tr) by the model's channel curve (None: the model has none,
    #                                 and no P(success) is published)
    weights: TrustWeights = TrustWeights()  # a1, a2: how T_beh weighs transmission and computation

    def forecasts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """((P,) pair keys, (P,) raw T_beh, (P,) how far the owner's report of the pair's outcome is believed)."""
        believed = np.ones(len(self.src)) if self.believed is None else self.believed
        return pair_keys(self.keys[self.src], self.keys[self.dst]), self.t_beh, believed

    def publish(self, ranking: RankingConfig, model_version: str, clock: SlotClock, shift: float = 0.0,
                revision: int = 0) -> SlotScores:
        """The piece's trust scores and rankings with T_beh moved by ``shift`` (clipped to [0, 1]): one ranking per
        recent owner, by the paper's rule, with no candidates where none is in range. ``revision`` numbers the
        piece's publications (0: the first; an update after late events has a higher one). Each record says the
        owner's task size its trust is for, and, where the model's trust depends on it, the size that parts large
        tasks from small ones and the trust's change for a task of the other class (T_res times T_beh's; and the chance
        of success's, read from T_beh so moved), with which a scheduler reads the trust for a task of its own, and the
        CPU the collaborator's trust and VoC were computed at, with which it computes its own task's VoC."""
        slot, ids, src, dst, thresholds = self.slot, self.ids, self.src, self.dst, self.thresholds
        t_beh = np.clip(self.t_beh + shift, 0.0, 1.0) if shift else self.t_beh
        trust = np.clip(t_beh * self.t_res, 0.0, 1.0)
        success = None if self.p_tr is None else success_probability(t_beh, self.p_tr, self.weights) * self.t_res
        bounds = np.flatnonzero(np.r_[True, src[1:] != src[:-1]]) if len(src) else np.zeros(0, np.int64)
        # each owner's pairs: one run of them (none: nothing in range, an empty ranking, so its scheduler knows)
        starts, by_owner = np.r_[bounds, len(src)], np.argsort(src[bounds])  # run k: pairs starts[k]:starts[k + 1]
        at, found = find(src[bounds][by_owner], self.owners)
        run = by_owner[at[found]]
        begin, end = np.zeros(len(self.owners), np.int64), np.zeros(len(self.owners), np.int64)
        begin[found], end[found] = starts[run], starts[run + 1]
        # owner_lists' padding reads row -1: a last entry no pair has, ordered after every pair and never eligible
        collaborators = np.r_[self.keys[dst], np.iinfo(np.int64).max]
        trust_read, voc_read = np.r_[trust, np.nan], np.r_[self.voc, np.nan]
        success_read = None if success is None else np.r_[success, np.nan]
        p, _ = owner_lists(begin, end, lambda rows, _: (  # the pairs whose scores are published: the most trusted
            np.lexsort((collaborators[rows], -trust_read[rows]), axis=-1),
            np.arange(rows.shape[1]) < ranking.scores_per_owner))
        c, listed_counts = owner_lists(begin, end, lambda rows, owners: ranked_rows(  # the rankings' pairs
            trust_read[rows], voc_read[rows], collaborators[rows], thresholds[self.owners[owners]], ranking.top_k,
            None if success_read is None else success_read[rows]))
        window = {"slot": slot, "slot_start_ms": int(clock.start_ms(slot)), "slot_end_ms": int(clock.end_ms(slot)),
                  "model_version": model_version, "is_update": revision > 0, "revision": revision}
        sizes = np.full(len(ids), np.nan) if self.task_sizes is None else self.task_sizes
        per_pair = {} if self.size_step is None else {"size_step": self.size_step * self.t_res}
        split = {} if self.size_step is None else {"size_split_bits": self.size_split_bits}
        if self.cpu_hz is not None:
            per_pair["cpu_hz"] = nullable(self.cpu_hz[dst])
        if success is not None:
            per_pair["p_success"] = success
            if self.size_step is not None:  # the chance read from T_beh as a task of the other size class moves it
                moved = np.clip(t_beh + self.size_step, 0.0, 1.0)
                per_pair["success_step"] = success_probability(moved, self.p_tr, self.weights) * self.t_res - success
        scores = Columns.of(TrustScore, len(p), owner=ids[src[p]], collaborator=ids[dst[p]], t_beh=t_beh[p],
                            t_res=self.t_res[p], trust=trust[p], task_size_bits=nullable(sizes[src[p]]),
                            **{name: values[p] for name, values in per_pair.items()}, **split, **window)
        entries = Columns.of(RankedCandidate, len(c), collaborator=ids[dst[c]], trust=trust[c], voc=self.voc[c],
                             **{name: values[c] for name, values in per_pair.items()})
        rankings = Columns.of(CollaboratorRanking, len(self.owners), owner=ids[self.owners],
                              threshold=thresholds[self.owners], task_size_bits=nullable(sizes[self.owners]),
                              candidates=Nested.of(entries, listed_counts), **split, **window)
        return SlotScores(slot, scores, rankings, self.piece)


def nullable(values: np.ndarray) -> np.ndarray:
    """A float column for a nullable field: as it is where every value is known, else objects with None for NaN."""
    missing = np.isnan(values)
    if not missing.any():
        return values
    out = values.astype(object)
    out[missing] = None
    return out


OWNERS_PAD_TO = 16  # owner_lists: owners whose pair counts round up alike are listed together,
OWNERS_PER_CALL = 512  # this many at a time (a call's arrays stay in cache)


def ranked_rows(trust: np.ndarray, voc: np.ndarray, keys: np.ndarray, thresholds: np.ndarray, top_k: int,
                success: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """What m owners' rankings list of their n candidates each ((m, n) T, VoC and keys; (m,) thresholds; ``success``
    (m, n) P(success) * T_res or None): (the (m, n) positions in the paper's selection order (VoC, then T, then key;
    the eligible, T >= theta, first), (m, n) which of those to publish). Published: the ``top_k`` first eligible, and
    every eligible candidate on the (T, VoC) Pareto frontier, and on the (T, ``success`` * VoC) one. For any threshold
    theta' at or above the ranking's, the paper's rule's choice among T >= theta' is then listed (nothing with at
    least its T has a higher VoC, so it is on the frontier), and so are the expected-value rule's (T * VoC: on the
    first frontier too) and the success rule's (the highest ``success`` * VoC: on the second)."""
    position = np.arange(trust.shape[1])
    ineligible = ~(trust >= thresholds[:, None])  # NaN trust too
    eligible = (~ineligible).sum(axis=1)[:, None]
    # sort keys (VoC finite or NaN): the ineligible after the eligible, +inf; a NaN VoC, sorted after every number,
    # just below it
    less_trusted = np.where(ineligible, np.inf, -trust)
    less_valuable = np.where(ineligible, np.inf, np.where(np.isnan(voc), np.finfo(np.float64).max, -voc))
    order = np.lexsort((keys, less_trusted, less_valuable), axis=-1)  # the selection order (a stable sort per key)
    by_trust = np.lexsort((keys, less_valuable, less_trusted), axis=-1)
    on_frontier = _frontier(np.take_along_axis(voc, by_trust, axis=1))
    if success is not None:
        on_frontier |= _frontier(np.take_along_axis(success * np.maximum(voc, 0.0), by_trust, axis=1))
    frontier = np.zeros(trust.shape, bool)
    np.put_along_axis(frontier, by_trust, on_frontier & (position < eligible), axis=1)
    return order, (np.take_along_axis(frontier, order, axis=1) | (position < top_k)) & (position < eligible)


def _frontier(values: np.ndarray) -> np.ndarray:
    """(m, n) values of candidates in order of T, most trusted first -> (m, n) whether each is on the Pareto frontier:
    the most trusted, and each with a value above the best of the more trusted (none past a NaN)."""
    out = np.ones(values.shape, bool)
    np.greater(values[:, 1:], np.maximum.accumulate(values, axis=1)[:, :-1], out=out[:, 1:])
    return out


def owner_lists(begin: np.ndarray, end: np.ndarray, choose: Callable[[np.ndarray, np.ndarray],
                                                                      tuple[np.ndarray, np.ndarray]],
                pad_to: int = OWNERS_PAD_TO) -> tuple[np.ndarray, np.ndarray]:
    """Per owner, what ``choose`` picks of its pairs ``begin:end`` (O,), as one array of pair indices in owner order
    and (O,) counts. ``choose(rows, owners)``: owners with n pairs each, (m, n) their pair indices and (m,) which
    owners they are -> ((m, n) an order of each row's positions, which of those in that order to keep: (m, n), or
    (n,) for every row). Owners go together by their pair count rounded up to a multiple of ``pad_to``, each row
    padded with index -1, which ``choose`` must order after every pair of its row (the caller's arrays end with an
    entry that sorts last) and which is never picked, at most ``OWNERS_PER_CALL`` owners a call: the work is a few
    array calls per rounded count, not per owner (a slot of ~90 owners has nearly as many distinct counts), in
    arrays that stay in cache (a 300k-device slot's 60k owners fall in ~20 rounded counts)."""
    lengths = end - begin
    rounded = -(-lengths // pad_to) * pad_to
    picked, owner_of = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for n in np.unique(rounded[lengths > 0]).tolist():
        group, position = np.flatnonzero((rounded == n) & (lengths > 0)), np.arange(n)
        for owners in np.split(group, range(OWNERS_PER_CALL, len(group), OWNERS_PER_CALL)):
            rows = np.where(position < lengths[owners, None], begin[owners, None] + position, -1)
            order, keep = choose(rows, owners)
            in_order = np.take_along_axis(rows, order, axis=1)
            keep = np.broadcast_to(keep, rows.shape) & (in_order >= 0)
            picked.append(in_order[keep])  # row by row, each in its order
            owner_of.append(np.repeat(owners, keep.sum(axis=1)))
    owner_of = np.concatenate(owner_of)
    return np.concatenate(picked)[np.argsort(owner_of, kind="stable")], np.bincount(owner_of, minlength=len(begin))
