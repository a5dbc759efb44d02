"""The false-report attacks injected into a recorded ratings log (Bitcoin-OTC and the like), and what they move.

Protocol (the rating attacks of the trust-management literature, where colluders add fake ratings to a real log):
``share`` of the accounts that rated at least :data:`MIN_RATINGS` others, drawn with the seed, collude. Each colluder
adds as many fake ratings as it gave real ones, at the times of its real ones (its activity keeps its rhythm):

- ``ballot-stuffing``: each rates a fellow colluder, drawn at random, with the top of the scale;
- ``bad-mouthing``: each rates an honest account that had been rated before then, drawn at random, with the bottom.

Every rating, real or fake, is reported by its rater (the event's ``reporter`` is the owner): a log of ratings is what
raters say. The clean twin is the same log with the same reporters and no fakes, so a method's forecasts of the same
genuine test edges (honest raters' own ratings) can be set side by side: the RMSE on them, how far the forecasts of
those toward bad-mouthed accounts fell (``victim_shift``) and those toward colluders rose (``colluder_shift``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from simulator.config import Attack, AttackKind

MIN_RATINGS = 3  # an account that rated at least this many times can collude
INJECTED = (AttackKind.BALLOT_STUFFING, AttackKind.BAD_MOUTHING)  # the attacks a ratings log can carry


def reported_by_raters(events: pa.Table) -> pa.Table:
    """The log with every outcome reported by its owner (the rater)."""
    reporter = events["owner"]
    at = events.column_names.index("reporter")
    return events.set_column(at, events.schema.field("reporter"), reporter)


@dataclass(frozen=True)
class Injected:
    """A log and its attacked twin (see the module's docstring)."""

    clean: pa.Table  # the log, every rating reported by its rater
    attacked: pa.Table  # the same with the fake ratings, in time order
    colluders: np.ndarray  # (k,) the colluders' ids
    victims: np.ndarray  # (v,) the honest accounts fake ratings named (bad-mouthing; none for ballot-stuffing)


def injectable(attack: Attack) -> None:
    """Refuse by name a kind a ratings log cannot carry."""
    if attack.kind not in INJECTED:
        known = ", ".join(kind.value for kind in INJECTED)
        raise ValueError(f"--attack: {attack.kind.value!r} cannot be injected into a recorded log (injected: {known})")


def inject(events: pa.Table, attack: Attack, seed: int) -> Injected:
    """``events`` (a graded log, e.g. from ``import-log``, in time order) reported by its raters, and the same with the
    colluders' fake ratings (see the module's docstring); a kind a ratings log cannot carry is refused by name."""
    injectable(attack)
    clean = reported_by_raters(events)
    rng = np.random.default_rng([seed, 13])
    owner = events["owner"].to_numpy(zero_copy_only=False).astype(str)
    collaborator = events["collaborator"].to_numpy(zero_copy_only=False).astype(str)
    raters, given = np.unique(owner, return_counts=True)
    eligible = raters[given >= MIN_RATINGS]
    colluders = np.sort(rng.choice(eligible, size=round(attack.share * len(eligible)), replace=False))
    rows = np.flatnonzero(np.isin(owner, colluders))  # each a fake rating at the time of a real one
    if attack.kind is AttackKind.BALLOT_STUFFING:
        offset = rng.integers(1, max(len(colluders), 2), size=len(rows))  # another colluder than the rater
        at = (np.searchsorted(colluders, owner[rows]) + offset) % len(colluders)
        targets, reliability = colluders[at], 1.0
    else:
        targets, reliability = _rivals(owner, collaborator, colluders, rows, rng), 0.0
    keep = targets != owner[rows]
    rows, targets = rows[keep], targets[keep]
    fake = events.take(pa.array(rows))
    ids = pc.binary_join_element_wise(fake["event_id"], pa.scalar("-fake"), "")
    fake = (fake.set_column(fake.column_names.index("event_id"), "event_id", ids)
            .set_column(fake.column_names.index("collaborator"), "collaborator", pa.array(targets, pa.string()))
            .set_column(fake.column_names.index("reliability"), "reliability",
                        pa.array(np.full(len(rows), reliability))))
    attacked = pa.concat_tables([clean, reported_by_raters(fake).cast(clean.schema)])
    order = np.argsort(attacked["event_time_ms"].to_numpy(), kind="stable")
    victims = np.unique(targets) if attack.kind is AttackKind.BAD_MOUTHING else np.zeros(0, str)
    return Injected(clean, attacked.take(pa.array(order)), colluders, victims)


def _rivals(owner: np.ndarray, collaborator: np.ndarray, colluders: np.ndarray, rows: np.ndarray,
            rng: np.random.Generator) -> np.ndarray:
    """For each fake rating at ``rows`` (of a time-ordered log), an honest account rated somewhere in the log before
    it, drawn uniformly."""
    honest_rated = ~np.isin(collaborator, colluders)
    first_seen = {}
    for position in np.flatnonzero(honest_rated):
        first_seen.setdefault(collaborator[position], position)
    names = np.array(list(first_seen), dtype=object)
    seen_at = np.array(list(first_seen.values()))
    order = np.argsort(seen_at)
    names, seen_at = names[order], seen_at[order]
    known = np.searchsorted(seen_at, rows)  # accounts first rated before each fake rating's row
    picks = (rng.random(len(rows)) * np.maximum(known, 1)).astype(np.int64)
    return np.where(known > 0, names[np.minimum(picks, len(names) - 1)], owner[rows]).astype(str)
