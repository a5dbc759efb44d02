"""Rule-based trust baselines, online over the same histories as BM.

Each scorer is advanced slot by slot (:meth:`advance`, reading a slot's edges
after it has been scored) and answers for any (owner, collaborator) pair from
the slots it has read. Each slot edge is one unit of evidence: ``T_col``
successes and ``1 - T_col`` failures.

* Beta reputation (Josang and Ismail) with forgetting factor ``lam`` per slot:
  ``E = (r_ij + w*R_j + 1) / (r_ij + s_ij + w*(R_j + S_j) + 2)`` where r, s is the
  owner's own evidence about j and R, S everyone's, discounted by ``w``.
* QS-Trust-style QoS trust: direct trust ``D_ij`` is an exponentially weighted
  mean (weight ``beta`` on the newest slot) of T_col from i's own tasks with j;
  the recommendation ``Rec_j`` is the mean of the other owners' direct trust in j,
  weighted by their observation counts; ``T = a*D_ij + (1 - a)*Rec_j`` with
  ``a = n_ij / (n_ij + k)`` (more own observations, more own weight), and 0.5
  when nothing is known.
* Running mean (``mean``): the mean T_col of every edge read so far, the same for
  every pair; a method that beats it knows something about the devices, not
  only the log's level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Protocol

import numpy as np

from model.graphs import SlotGraph
from model.history import History


@dataclass(frozen=True)
class BetaParams:
    lam: float = 0.9  # forgetting factor per slot
    w: float = 0.1  # weight of other owners' evidence


@dataclass(frozen=True)
class QSParams:
    beta: float = 0.5  # weight of the newest observation in direct trust
    k: float = 2.0  # observations at which own and recommended trust weigh equally


class OnlineScorer(Protocol):
    def advance(self, graph: SlotGraph | None) -> None: ...

    def score(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray: ...


class _PairTable:
    """Per-pair values over n devices, in a dict keyed by src * n + dst (pairs are sparse)."""

    def __init__(self, n: int, default: float) -> None:
        self.n, self.default, self.values = n, default, {}

    def get(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        keys = (src * self.n + dst).tolist()
        return np.array([self.values.get(k, self.default) for k in keys], dtype=np.float64)

    def put(self, src: np.ndarray, dst: np.ndarray, values: np.ndarray) -> None:
        self.values.update(zip((src * self.n + dst).tolist(), values.tolist()))


class BetaReputation:
    def __init__(self, n: int, params: BetaParams = BetaParams()) -> None:
        self.params, self.slots = params, 0
        self.r, self.s = _PairTable(n, 0.0), _PairTable(n, 0.0)  # stored undecayed; scaled by lam**-slot
        self.big_r, self.big_s = np.zeros(n), np.zeros(n)

    def _decay(self) -> float:
        return self.params.lam ** self.slots

    def advance(self, graph: SlotGraph | None) -> None:
        self.slots += 1
        if self._decay() < 1e-150:  # fold the pending decay into the stored values before it underflows
            for table in (self.r, self.s):
                table.values = {k: v * self._decay() for k, v in table.values.items()}
            self.slots = 0
        self.big_r *= self.params.lam
        self.big_s *= self.params.lam
        if graph is None:
            return
        scale = 1.0 / self._decay()  # evidence added now, expressed in undecayed units
        good, bad = graph.t_col, 1 - graph.t_col
        self.r.put(graph.src, graph.dst, self.r.get(graph.src, graph.dst) + good * scale)
        self.s.put(graph.src, graph.dst, self.s.get(graph.src, graph.dst) + bad * scale)
        np.add.at(self.big_r, graph.dst, good)
        np.add.at(self.big_s, graph.dst, bad)

    def score(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        decay, w = self._decay(), self.params.w
        r, s = self.r.get(src, dst) * decay, self.s.get(src, dst) * decay
        return (r + w * self.big_r[dst] + 1) / (r + s + w * (self.big_r[dst] + self.big_s[dst]) + 2)


class QSTrust:
    def __init__(self, n: int, params: QSParams = QSParams()) -> None:
        self.params = params
        self.direct, self.count = _PairTable(n, 0.5), _PairTable(n, 0.0)
        self.weighted, self.total = np.zeros(n), np.zeros(n)  # per collaborator: sum(D * count), sum(count)

    def advance(self, graph: SlotGraph | None) -> None:
        if graph is None:
            return
        direct, count = self.direct.get(graph.src, graph.dst), self.count.get(graph.src, graph.dst)
        updated = np.where(count > 0, (1 - self.params.beta) * direct + self.params.beta * graph.t_col, graph.t_col)
        np.add.at(self.weighted, graph.dst, updated * (count + 1) - direct * count)
        np.add.at(self.total, graph.dst, 1.0)
        self.direct.put(graph.src, graph.dst, updated)
        self.count.put(graph.src, graph.dst, count + 1)

    def score(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        direct, count = self.direct.get(src, dst), self.count.get(src, dst)
        others = self.total[dst] - count
        recommended = np.where(others > 0, (self.weighted[dst] - direct * count) / np.maximum(others, 1e-12), 0.5)
        own = count / (count + self.params.k)
        return own * direct + (1 - own) * recommended


class RunningMean:
    def __init__(self, n: int) -> None:
        self.total, self.count = 0.0, 0

    def advance(self, graph: SlotGraph | None) -> None:
        if graph is not None:
            self.total += float(graph.t_col.sum())
            self.count += len(graph.t_col)

    def score(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        return np.full(len(src), self.total / self.count if self.count else 0.5)


def predict_edges(scorer: OnlineScorer, history: History, slots: Iterable[int]) -> np.ndarray:
    """Scores for every edge of the target slots (in :func:`model.train.targets` order), online."""
    wanted, out = set(slots), []
    for t, graph in enumerate(history.graphs):
        if t in wanted and graph is not None:
            out.append(scorer.score(graph.src, graph.dst))
        scorer.advance(graph)
    return np.concatenate(out) if out else np.zeros(0)


def beta_reputation(history: History, slots: Iterable[int], params: BetaParams = BetaParams()) -> np.ndarray:
    return predict_edges(BetaReputation(len(history.index), params), history, slots)


def qs_trust(history: History, slots: Iterable[int], params: QSParams = QSParams()) -> np.ndarray:
    return predict_edges(QSTrust(len(history.index), params), history, slots)
