"""Online recalibration: a level shift of T_beh refitted on the outcomes of the most recently published slots.

A log that drifts (Bitcoin-OTC's ratings rise over its last months) leaves every forecast made from its past a
little off in the same direction. After each slot, the outcomes of the pairs that collaborated in it are set
against what was forecast for them; the shift added to the next slot's forecasts is the decayed, task-weighted
mean residual, shrunk toward zero by how far it stands from noise:

    m = sum_s lam^(t-s) sum_e w_e (y_e - f_e) / sum_s lam^(t-s) sum_e w_e      (the decayed mean residual)
    se^2 = var / n_eff,  n_eff = (sum w)^2 / sum w^2                        (its squared standard error)
    shift = m * max(0, 1 - (guard * se)^2 / m^2)

so a residual within ``guard`` standard errors of zero moves nothing (a log that does not drift keeps its
forecasts), and a clear one is followed almost whole. Glossary: f the forecast T_beh, y the slot's observed
T_col, w its tasks, lam ``memory``.

:class:`OnlineShift` is what a publisher keeps between slots (``score_log`` offline, ``PublishSlots`` in the job):
the level shift, and the raw forecasts of the last slot it published, which the next slot's outcomes are set
against. ``trustbeam evaluate``'s ``bm_online`` (:func:`replayed_shifts`) runs the same shift over every test
edge; the publisher sets a slot's outcomes against the pairs it scored (the owners' candidates in range).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from model.credibility import believed_share
from model.evidence import find, key_order


@dataclass(frozen=True)
class RecalibrationConfig:
    memory: float = 0.9  # lam: the weight of a slot's residuals one slot later
    guard: float = 2.0  # standard errors a mean residual must clear before it shifts anything

    def __post_init__(self) -> None:
        if not 0.0 <= self.memory < 1.0:
            raise ValueError(f"RecalibrationConfig.memory: must be in [0, 1) (got {self.memory!r})")
        if self.guard < 0.0:
            raise ValueError(f"RecalibrationConfig.guard: must be >= 0 (got {self.guard!r})")


@dataclass
class LevelShift:
    """The decayed residual sums of the published forecasts; :attr:`shift` is what the next slot adds."""

    config: RecalibrationConfig
    weight: float = 0.0  # sum of lam^age w
    weight_sq: float = 0.0  # sum of lam^(2 age) w^2: the effective count's denominator
    residual: float = 0.0  # sum of lam^age w r
    residual_sq: float = 0.0  # sum of lam^age w r^2

    def update(self, forecast: np.ndarray, outcome: np.ndarray, tasks: np.ndarray) -> None:
        """Age the sums by one slot and add one slot's residuals (forecast, outcome, tasks: (n,) each)."""
        lam = self.config.memory
        r, w = np.asarray(outcome, float) - np.asarray(forecast, float), np.asarray(tasks, float)
        self.weight = lam * self.weight + float(w.sum())
        self.weight_sq = lam * lam * self.weight_sq + float((w * w).sum())
        self.residual = lam * self.residual + float((w * r).sum())
        self.residual_sq = lam * self.residual_sq + float((w * r * r).sum())

    @property
    def shift(self) -> float:
        if self.weight <= 0.0:
            return 0.0
        mean = self.residual / self.weight
        if mean == 0.0:
            return 0.0
        variance = max(self.residual_sq / self.weight - mean * mean, 0.0)
        se_sq = variance * self.weight_sq / (self.weight * self.weight)
        return mean * max(0.0, 1.0 - self.config.guard ** 2 * se_sq / (mean * mean))

    def apply(self, forecast: np.ndarray) -> np.ndarray:
        return np.clip(np.asarray(forecast, float) + self.shift, 0.0, 1.0)


def replayed_shifts(forecast: np.ndarray, outcome: np.ndarray, tasks: np.ndarray, slot: np.ndarray,
                    config: RecalibrationConfig, fitted: np.ndarray | None = None) -> np.ndarray:
    """(n,) the shift each edge's forecast gets when its slots are published in order and each slot's outcomes
    refit the shift before the next: an edge of slot s sees only the outcomes of slots before s (the state
    starts empty at the first slot). All arguments (n,), ``slot`` the edges' slots. ``fitted`` (n,) bool: the
    edges whose outcomes refit the shift (None: all); a slot with none ages nothing, as :meth:`OnlineShift.advance`
    (the job's publisher meets only the outcomes of the pairs it forecast: :mod:`bench.recalibration_bench`)."""
    state = LevelShift(config)
    fitted = np.ones(len(slot), bool) if fitted is None else np.asarray(fitted, bool)
    out = np.zeros(len(slot))
    for s in np.unique(slot):
        rows = slot == s
        out[rows] = state.shift
        used = rows & fitted
        if used.any():
            state.update(forecast[used], outcome[used], tasks[used])
    return out


@dataclass
class OnlineShift:
    """A publisher's recalibration between slots (slots in order; see the module's docstring).

    For each slot: :meth:`advance` with the slot's outcomes gives the shift its forecasts get, then
    :meth:`remember` keeps its raw forecasts for the next slot's outcomes."""

    level: LevelShift
    slot: int = -1  # the last slot published
    pairs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (m,) its pairs' keys, sorted
    forecasts: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (m,) their raw T_beh (before the shift)
    believed: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (m,) their owners' credibility as reporters

    @classmethod
    def start(cls, config: RecalibrationConfig | None) -> "OnlineShift | None":
        """A fresh state (None without recalibration)."""
        return None if config is None else cls(LevelShift(config))

    def copy(self) -> "OnlineShift":
        """An independent state (the arrays are never written in place)."""
        return OnlineShift(replace(self.level), self.slot, self.pairs, self.forecasts, self.believed)

    def advance(self, slot: int, pairs: np.ndarray, outcome: np.ndarray, tasks: np.ndarray,
                reported: np.ndarray | None = None) -> float:
        """The shift for ``slot``'s forecasts, after setting its outcomes (pair keys, observed T_col, tasks, and the
        share of those the owner reported: (k,) each) against the last published slot's forecasts of the same pairs;
        what an owner reported weighs by its credibility then (:mod:`model.credibility`)."""
        if slot <= self.slot:
            raise ValueError(f"OnlineShift.advance: slot {slot} is not after the last published slot {self.slot}")
        at, hit = find(self.pairs, pairs)
        if hit.any():  # a slot none of whose pairs was forecast ages nothing (as replayed_shifts)
            weight = tasks[hit]
            if reported is not None:
                weight = weight * believed_share(reported[hit], self.believed[at[hit]])
            self.level.update(self.forecasts[at[hit]], outcome[hit], weight)
        return self.level.shift

    def remember(self, slot: int, pairs: np.ndarray, forecasts: np.ndarray, believed: np.ndarray | None = None
                 ) -> None:
        """Keep ``slot``'s raw forecasts ((m,) pair keys and T_beh, and how far each owner's reports are believed:
        1 where None): the next slot's outcomes meet them."""
        order = key_order(pairs)
        self.slot, self.pairs, self.forecasts = slot, np.asarray(pairs, np.int64)[order], np.asarray(forecasts)[order]
        self.believed = np.ones(len(order)) if believed is None else np.asarray(believed, float)[order]

    def save(self, path: str | Path) -> None:
        level = self.level
        np.savez(path, sums=np.array([level.weight, level.weight_sq, level.residual, level.residual_sq]),
                 slot=np.array(self.slot), pairs=self.pairs, forecasts=self.forecasts, believed=self.believed)

    @classmethod
    def load(cls, path: str | Path, config: RecalibrationConfig) -> "OnlineShift":
        """What :meth:`save` wrote, continued under ``config``."""
        with np.load(path) as saved:
            believed = saved["believed"] if "believed" in saved else np.ones(len(saved["pairs"]))
            return cls(LevelShift(config, *saved["sums"].tolist()), int(saved["slot"]), saved["pairs"],
                       saved["forecasts"], believed)
