"""P_tr(d), the transmission success curve, and the on-time factor, both fitted to a log's outcomes.

The paper's channel is Rayleigh fading over a path loss g = d^-alpha0, whose success probability
has the form ``P_tr(d) = exp(-c * (d / 100 m)^alpha)`` (:func:`model.physics.outage_success`).
:class:`OutageCurve` keeps that form and fits its two parameters to a log's outcomes by maximum
likelihood (binomial: flagged tasks, successful transmissions), starting from the paper's constants
as the prior. Nothing is read from a simulator: only distances (from device statuses) and the
``tr_success`` flags of the training period. The fit is monotone (decreasing in d) by construction.

:class:`OnTimeCurve` is the other half of the system model's story: a computation that arrives too
late fails, and how late depends on the offload time against the owner's local time (eqs. 2-6).
It holds the training period's P(com | tr) per bin of log(offload time / local time), relative to
the mean, so that a collaborator's evidence can be counted against what its tasks' timing allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from model.config import SystemParams

REFERENCE_M = 100.0  # distances enter as d / 100 m, so that c is of order one


@dataclass(frozen=True)
class OutageCurve:
    """P_tr(d) = exp(-exp(log_c) * (d / 100 m)^alpha), d floored at the params' minimum distance."""

    log_c: float
    alpha: float

    @classmethod
    def prior(cls, params: SystemParams = SystemParams(), tx_w: float = 0.1, outage_snr_db: float = 0.0
              ) -> "OutageCurve":
        """The paper's curve: c = SNR_th * N0 * (100 m)^alpha0 / p_tr, alpha = alpha0."""
        c = 10 ** (outage_snr_db / 10) * params.noise_w * REFERENCE_M ** params.path_loss_exponent / tx_w
        return cls(math.log(c), params.path_loss_exponent)

    def p_tr(self, distance_m: np.ndarray) -> np.ndarray:
        d = np.maximum(np.asarray(distance_m, np.float64), 1.0) / REFERENCE_M
        return np.exp(-np.exp(self.log_c) * d ** self.alpha)

    def read(self, distance_m: np.ndarray, unknown_rate: float) -> np.ndarray:
        """(P,) P_tr at each distance, ``unknown_rate`` (a log's share of transmissions) where it is unknown (NaN)."""
        distance_m = np.asarray(distance_m, np.float64)
        return np.where(np.isfinite(distance_m), self.p_tr(np.nan_to_num(distance_m, nan=1.0)), unknown_rate)

    @classmethod
    def fit(cls, distance_m: np.ndarray, trials: np.ndarray, successes: np.ndarray,
            prior: "OutageCurve | None" = None) -> "OutageCurve":
        """The maximum-likelihood curve for ``successes`` of ``trials`` transmissions at each distance
        (NaN distances are left out); the prior where there is nothing to fit."""
        prior = prior or cls.prior()
        known = np.isfinite(distance_m) & (trials > 0)
        if not known.any() or successes[known].sum() in (0, trials[known].sum()):
            return prior
        d = np.maximum(distance_m[known], 1.0) / REFERENCE_M
        n, k = trials[known], successes[known]

        def negative_log_likelihood(theta: np.ndarray) -> float:
            rate = np.exp(theta[0]) * d ** theta[1]  # -log P_tr
            return float(np.sum(k * rate) - np.sum((n - k) * np.log(-np.expm1(-np.maximum(rate, 1e-12)))))

        from scipy.optimize import minimize  # here: scoring never fits (scipy.optimize ~0.5 s to import)

        result = minimize(negative_log_likelihood, np.array([prior.log_c, prior.alpha]), method="Nelder-Mead",
                          options={"xatol": 1e-6, "fatol": 1e-8, "maxiter": 2000})
        log_c, alpha = (float(v) for v in result.x)
        return cls(log_c, alpha) if alpha > 0 else prior


ON_TIME_BINS = np.linspace(-1.5, 1.5, 16)  # edges of the bins of log(offload time / local time)


@dataclass(frozen=True)
class OnTimeCurve:
    """P(com | tr) per bin of log(offload time / local time) over its mean; 1 where the ratio is unknown."""

    factor: tuple[float, ...]  # len(ON_TIME_BINS) + 1 bins

    @classmethod
    def fit(cls, ratio: np.ndarray, transmitted: np.ndarray, computed: np.ndarray) -> "OnTimeCurve":
        """From each edge's time ratio and its transmitted and computed task counts; two pseudo-tasks at the
        mean per bin, so an empty bin reads 1."""
        known = np.isfinite(ratio) & (ratio > 0) & (transmitted > 0)
        bins = np.digitize(np.log(ratio[known]), ON_TIME_BINS)
        size = len(ON_TIME_BINS) + 1
        hits = np.bincount(bins, computed[known], minlength=size)
        trials = np.bincount(bins, transmitted[known], minlength=size)
        mean = (hits.sum() + 1) / (trials.sum() + 2)
        return cls(tuple(((hits + 2 * mean) / (trials + 2) / mean).tolist()))

    def __call__(self, ratio: np.ndarray) -> np.ndarray:
        ratio = np.asarray(ratio, np.float64)
        known = np.isfinite(ratio) & (ratio > 0)
        bins = np.digitize(np.log(np.where(known, ratio, 1.0)), ON_TIME_BINS)
        return np.where(known, np.asarray(self.factor)[bins], 1.0)
