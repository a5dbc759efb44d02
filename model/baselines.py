"""Rule-based trust baselines, scored online over the same histories and target slots as BM.

Both read only slots before a target slot and update after it; each slot edge
is one unit of evidence: ``T_col`` successes and ``1 - T_col`` failures.

* Beta reputation (Josang and Ismail) with forgetting factor ``lam`` per slot:
  ``E = (r_ij + w*R_j + 1) / (r_ij + s_ij + w*(R_j + S_j) + 2)`` where r, s is the
  owner's own evidence about j and R, S everyone's, discounted by ``w``.
* QS-Trust-style QoS trust: direct trust ``D_ij`` is an exponentially weighted
  mean (weight ``beta`` on the newest slot) of T_col from i's own tasks with j;
  the recommendation ``Rec_j`` is the mean of the other owners' direct trust in j,
  weighted by their observation counts; ``T = a*D_ij + (1 - a)*Rec_j`` with
  ``a = n_ij / (n_ij + k)`` (more own observations, more own weight), and 0.5
  when nothing is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from model.history import History


@dataclass(frozen=True)
class BetaParams:
    lam: float = 0.9  # forgetting factor per slot
    w: float = 0.1  # weight of other owners' evidence


@dataclass(frozen=True)
class QSParams:
    beta: float = 0.5  # weight of the newest observation in direct trust
    k: float = 2.0  # observations at which own and recommended trust weigh equally


def _pairs(history: History) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """All pair keys (sorted) and, per slot, the pair positions of its edges."""
    n = len(history.index)
    keys = np.unique(np.concatenate([g.src * n + g.dst for g in history.graphs if g is not None]))
    positions = {t: np.searchsorted(keys, g.src * n + g.dst) for t, g in enumerate(history.graphs) if g is not None}
    return keys, positions


def beta_reputation(history: History, slots: Iterable[int], params: BetaParams = BetaParams()) -> np.ndarray:
    """Predictions for every edge of the target slots, in :func:`model.train.targets` order."""
    wanted = set(slots)
    n = len(history.index)
    keys, positions = _pairs(history)
    r, s = np.zeros(len(keys)), np.zeros(len(keys))
    big_r, big_s = np.zeros(n), np.zeros(n)
    out = {}
    for t, graph in enumerate(history.graphs):
        if graph is None:
            r, s, big_r, big_s = r * params.lam, s * params.lam, big_r * params.lam, big_s * params.lam
            continue
        pos = positions[t]
        if t in wanted:
            j = graph.dst
            out[t] = (r[pos] + params.w * big_r[j] + 1) / (r[pos] + s[pos] + params.w * (big_r[j] + big_s[j]) + 2)
        good, bad = graph.t_col, 1 - graph.t_col
        r, s, big_r, big_s = r * params.lam, s * params.lam, big_r * params.lam, big_s * params.lam
        np.add.at(r, pos, good)
        np.add.at(s, pos, bad)
        np.add.at(big_r, graph.dst, good)
        np.add.at(big_s, graph.dst, bad)
    return _ordered(out, wanted)


def qs_trust(history: History, slots: Iterable[int], params: QSParams = QSParams()) -> np.ndarray:
    """Predictions for every edge of the target slots, in :func:`model.train.targets` order."""
    wanted = set(slots)
    n = len(history.index)
    keys, positions = _pairs(history)
    direct, count = np.full(len(keys), 0.5), np.zeros(len(keys))
    collab_of = keys % n
    out = {}
    for t, graph in enumerate(history.graphs):
        if graph is None:
            continue
        pos = positions[t]
        if t in wanted:
            weighted = np.bincount(collab_of, weights=direct * count, minlength=n)
            total = np.bincount(collab_of, weights=count, minlength=n)
            j = graph.dst
            others = total[j] - count[pos]
            recommended = np.where(others > 0, (weighted[j] - direct[pos] * count[pos]) / np.maximum(others, 1e-12), 0.5)
            own = count[pos] / (count[pos] + params.k)
            out[t] = own * direct[pos] + (1 - own) * recommended
        seen = count[pos] > 0
        direct[pos] = np.where(seen, (1 - params.beta) * direct[pos] + params.beta * graph.t_col, graph.t_col)
        count[pos] += 1
    return _ordered(out, wanted)


def _ordered(predictions: dict[int, np.ndarray], wanted: set[int]) -> np.ndarray:
    ordered = [predictions[t] for t in sorted(wanted) if t in predictions]
    return np.concatenate(ordered) if ordered else np.zeros(0)
