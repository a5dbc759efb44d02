"""What every method is scored against: the edges of each target slot, asked from the end of the slot before.

* :class:`PairQuery`: pairs to score, each from its history up to the end of a relative slot.
* :func:`targets`: the edges of the target slots (their T_col and outcome counts), predicted from histories up to
  t - 1 for the tasks' own profile: what BM trains on, what the rules fit their parameters to
  (:mod:`model.baselines`), and what every forecast is judged by (:mod:`model.evaluate`).
* :func:`fit_outage`: the P_tr curve fitted to those edges' transmissions (:mod:`model.channel`).

NumPy only: the rules fit without loading PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from model.channel import OutageCurve
from model.config import SystemParams
from model.credibility import believed_share
from model.evidence import EvidenceConfig
from model.history import History


@dataclass
class PairQuery:
    """Pairs to score: owners ``src`` and candidates ``dst`` (history rows), each from its history up to the
    end of relative slot ``end``, for a task of ``profile`` (P, 2) size (bit) and density (NaN unknown)."""

    src: np.ndarray
    dst: np.ndarray
    end: np.ndarray
    profile: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.end = np.broadcast_to(np.asarray(self.end, np.int64), np.shape(self.src)).copy()
        if self.profile is None:
            self.profile = np.full((len(self.src), 2), np.nan)


@dataclass
class Targets:
    """Every edge of some target slots, in slot order: the query (from slot - 1, for the edge's task profile)
    and what happened (T_col and the outcome counts), each (P,)."""

    query: PairQuery
    t_col: np.ndarray
    tasks: np.ndarray
    flagged: np.ndarray
    tr: np.ndarray
    com: np.ndarray
    time_ratio: np.ndarray  # the tasks' mean reported offload time / local time (NaN unknown)

    def __len__(self) -> int:
        return len(self.t_col)


def targets(history: History, slots: Iterable[int], credible: EvidenceConfig | None = None,
            judged_at: int | None = None) -> Targets:
    """The edges of the target slots, predicted from the end of the slot before each. With ``credible``, the outcome
    counts an edge's owner reported itself weigh by its credibility (:meth:`model.history.History.credited`) as of
    slot ``judged_at`` (None: as of each target slot), as they do in the evidence: what is learned from is what is
    believed (T_col stays what was reported). A fit judges in hindsight, as of the last slot it may see: a liar lies
    all along, and its early reports, before the others' evidence gave it away, are lies too."""
    graphs = [(t, history.graphs[t]) for t in sorted(set(slots)) if history.graphs[t] is not None]

    def joined(name: str) -> np.ndarray:
        return np.concatenate([getattr(g, name) for _, g in graphs]) if graphs else np.zeros(0)

    src, dst = joined("src").astype(np.int64), joined("dst").astype(np.int64)
    end = np.concatenate([np.full(len(g.src), t - 1) for t, g in graphs]) if graphs else np.zeros(0, np.int64)
    profile = np.concatenate([g.profile for _, g in graphs]) if graphs else np.zeros((0, 2))
    counts = [joined(name) for name in ("tasks", "flagged", "tr", "com")]
    if credible is not None and any(g.reported.any() for _, g in graphs):
        owner = np.concatenate([history.credited(credible, t if judged_at is None else judged_at).credibility[g.src]
                                for t, g in graphs])
        weight = believed_share(joined("reported_share"), owner)
        counts = [count * weight for count in counts]
    return Targets(PairQuery(src, dst, end, profile), joined("t_col"), *counts, joined("time_ratio"))


def fit_outage(history: History, slots: Iterable[int], system: SystemParams,
               credible: EvidenceConfig | None = None) -> OutageCurve:
    """The P_tr curve fitted to the transmissions of the given slots' edges (the paper's curve without them;
    ``credible``: as :func:`targets` weighs them, as of the last of the slots)."""
    predicted = [s for s in slots if s >= 1]
    batch = targets(history, predicted, credible, max(predicted, default=None))
    prior = OutageCurve.prior(system)
    if not len(batch) or history.status is None:
        return prior
    q = batch.query
    distance = history.pair_physics(q.src, q.dst, q.end + 1, q.profile, system)[:, 0].astype(np.float64)
    return OutageCurve.fit(distance, batch.flagged, batch.tr, prior)
