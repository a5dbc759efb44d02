"""Attacks injected into a recorded ratings log (Bitcoin-OTC and the like), and what they move.

Protocols (the attacks of the trust-management literature, carried out on a real log):

- False reports: ``share`` of the accounts that rated at least :data:`MIN_RATINGS` others, drawn with the seed,
  collude. Each colluder adds as many fake ratings as it gave real ones, at the times of its real ones (its activity
  keeps its rhythm):

  - ``ballot-stuffing``: each rates a fellow colluder, drawn at random, with the top of the scale;
  - ``bad-mouthing``: each rates an honest account that had been rated before then, drawn at random, with the bottom.

- Fresh ids: ``share`` of the accounts that received at least :data:`MIN_RATINGS` ratings and a negative one (a
  grade below :data:`model.distrust.DISTRUST`: an account the log's raters found wanting), drawn with the seed, act
  under other ids. No rating is added or changed; only the ids the attacker's ratings, given and received, name:

  - ``whitewashing``: right after each negative rating it receives the account leaves its id and goes on under a new
    one (``Attack.whitewash_ids`` at most), so each new id starts without the record that rating began. (The
    simulator's rule, a mean T_col under the mark, does not carry over: most of Bitcoin-OTC's ratings are +1 or +2,
    below any mark a scheduler's thresholds set.)
  - ``sybil``: each of its ratings names one of ``Attack.sybil_ids`` ids, drawn at random, so its record is split.

  A new id is the account's name with ``#ww<k>`` or ``#sybil<k>`` appended (:attr:`Injected.alias`).

Every rating, real or fake, is reported by its rater (the event's ``reporter`` is the owner): a log of ratings is what
raters say. The clean twin is the same log with the same reporters, no fakes and every account under its own id, so
a method's forecasts of the same genuine test edges (honest raters' own ratings) can be set side by side: the RMSE on
them, how far the forecasts of those toward bad-mouthed accounts fell (``victim_shift``) and those toward the attackers
rose (``attacker_shift``: colluders, or the accounts behind the fresh ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from model.distrust import DISTRUST
from simulator.config import Attack, AttackKind

MIN_RATINGS = 3  # an account that rated (colluders) or was rated (fresh ids) at least this many times can attack
FALSE_REPORTS = (AttackKind.BALLOT_STUFFING, AttackKind.BAD_MOUTHING)
FRESH_IDS = {AttackKind.WHITEWASHING: "ww", AttackKind.SYBIL: "sybil"}  # and the suffix of their new ids
INJECTED = (*FALSE_REPORTS, *FRESH_IDS)  # the attacks a ratings log can carry


def reported_by_raters(events: pa.Table) -> pa.Table:
    """The log with every outcome reported by its owner (the rater)."""
    reporter = events["owner"]
    at = events.column_names.index("reporter")
    return events.set_column(at, events.schema.field("reporter"), reporter)


@dataclass(frozen=True)
class Injected:
    """A log and its attacked twin (see the module's docstring)."""

    clean: pa.Table  # the log, every rating reported by its rater
    attacked: pa.Table  # the same with the fake ratings or the fresh ids, in time order
    attackers: np.ndarray  # (k,) the attacking accounts' own ids (colluders, whitewashers, Sybils)
    victims: np.ndarray  # (v,) the honest accounts fake ratings named (bad-mouthing; none for the other kinds)
    alias: dict[str, str] = field(default_factory=dict)  # each fresh id -> the account behind it


def injectable(attack: Attack) -> None:
    """Refuse by name a kind a ratings log cannot carry."""
    if attack.kind not in INJECTED:
        known = ", ".join(kind.value for kind in INJECTED)
        raise ValueError(f"--attack: {attack.kind.value!r} cannot be injected into a recorded log (injected: {known})")


def inject(events: pa.Table, attack: Attack, seed: int) -> Injected:
    """``events`` (a graded log, e.g. from ``import-log``, in time order) reported by its raters, and the same with the
    colluders' fake ratings or the attackers' fresh ids (see the module's docstring); a kind a ratings log cannot carry
    is refused by name."""
    injectable(attack)
    clean = reported_by_raters(events)
    rng = np.random.default_rng([seed, 13])
    owner = events["owner"].to_numpy(zero_copy_only=False).astype(str)
    collaborator = events["collaborator"].to_numpy(zero_copy_only=False).astype(str)
    if attack.kind in FRESH_IDS:
        return _fresh_ids(clean, owner, collaborator, attack, rng)
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


def _fresh_ids(clean: pa.Table, owner: np.ndarray, collaborator: np.ndarray, attack: Attack,
               rng: np.random.Generator) -> Injected:
    """The log with ``share`` of the accounts rated at least :data:`MIN_RATINGS` times, a negative rating among them,
    acting under fresh ids (whitewashing or Sybil, see the module's docstring)."""
    negative = clean["reliability"].to_numpy(zero_copy_only=False).astype(np.float64) < DISTRUST
    rated, received = np.unique(collaborator, return_counts=True)
    eligible = rated[(received >= MIN_RATINGS) & np.isin(rated, collaborator[negative])]
    attackers = np.sort(rng.choice(eligible, size=round(attack.share * len(eligible)), replace=False))
    names = {"owner": owner.astype(object), "collaborator": collaborator.astype(object)}  # room for longer ids
    suffix = FRESH_IDS[attack.kind]
    alias = {}
    for account in attackers:
        rows = np.flatnonzero((owner == account) | (collaborator == account))  # in time order
        if attack.kind is AttackKind.WHITEWASHING:  # its k-th fresh id after its k-th negative rating received
            received = np.cumsum(negative[rows] & (collaborator[rows] == account))
            k = np.minimum(np.r_[0, received[:-1]], attack.whitewash_ids - 1)
        else:
            k = rng.integers(0, attack.sybil_ids, size=len(rows))
        ids = np.where(k > 0, np.char.add(f"{account}#{suffix}", k.astype(str)), account)
        alias.update({fresh: account for fresh in ids[k > 0].tolist()})
        for column, rows_of in (("owner", owner[rows] == account), ("collaborator", collaborator[rows] == account)):
            names[column][rows[rows_of]] = ids[rows_of]
    attacked = clean
    for column, values in names.items():
        attacked = attacked.set_column(attacked.column_names.index(column), column, pa.array(values, pa.string()))
    return Injected(clean, reported_by_raters(attacked), attackers, np.zeros(0, str), alias)


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
