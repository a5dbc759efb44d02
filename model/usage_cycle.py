"""A device's usage cycle, read from the loads it reports: a harmonic fit, and where it puts the load next slot.

A device's background load swings with its owner's usage, and a device whose reliability follows that usage (the
simulator's periodic devices, ``--telemetry``) is least reliable where its cycle is busiest. The load one status
reports is the cycle plus a slot's noise, and it is the slot before the one a forecast is for: read alone, it tells
the cycle's next value poorly (a short cycle moves by half its swing in a slot). A fit of the loads over many slots
tells it well, and the head reads it beside the regression of the device's success rate on its load
(:func:`model.evidence.load_rate`), at the load the cycle will bring.

The fit is a least-squares line of the reported load u on (1, cos wt, sin wt), forgetting by :data:`CYCLE_MEMORY` per
slot, at each angular frequency w of a grid (:data:`FREQUENCIES`); its sums are a state of their own (:data:`CYCLE`),
fed, as :data:`model.evidence.REPORTS` is, by every device's latest reported load at each slot's end. The forecast is
each frequency's fitted wave at the slot ahead, weighted by how well it fits (:data:`SHARPNESS`); less its level, it
is the cycle's deviation, which the drift a changing device's load shows (:func:`model.evidence.load_drift`) leaves
out. Slots are absolute (a fit's phase is the same wherever its sums are kept).

Glossary: u the reported load; w = 2 pi f the angular frequency (f cycles per slot); t the absolute slot.
"""

from __future__ import annotations

import numpy as np

CYCLE = "usage_cycle"  # the state of each device's harmonic sums (model.evidence.SUMMED_ROLES)
CYCLE_MEMORY = 0.96  # the fit's forgetting per slot: about 25 slots of reports, a cycle or more (a prototype on seed
#                      100's loads: 0.95-0.97 forecast the cycle best, within 0.023 against 0.055 for the last load)
FREQUENCIES = np.linspace(1 / 40, 1 / 8, 17)  # cycles per slot: periods of 8 to 40 slots, the fit's grid
SHARPNESS = 3.0  # a frequency's weight: exp(-SHARPNESS * its residual over the best one's)
RIDGE = 1e-3  # each coefficient's shrinkage, as a share of the fit's slots
MIN_SLOTS = 6.0  # forgetting-weighted slots with a report before a fit is read
CYCLE_SCALE = 8.0  # a deviation of 0.125 (the simulator's cycle swings by 0.12) reads as 1
# channels: the slots with a report, their loads and squared loads; per frequency cos, sin, their squares and
# product, and the load times each
SHARED = ("slots", "load", "load2")
PER_FREQUENCY = ("cos", "sin", "cos2", "sin2", "cossin", "load_cos", "load_sin")
CHANNELS = len(SHARED) + len(PER_FREQUENCY) * len(FREQUENCIES)


def cycle_increments(keys: np.ndarray, load: np.ndarray, slot: int) -> tuple[np.ndarray, np.ndarray]:
    """A slot's :data:`CYCLE` update from each device's latest reported load by the (absolute) slot's end (k,) (NaN:
    none yet): (keys of the devices with one, increments (k', :data:`CHANNELS`))."""
    known = np.isfinite(load)
    u = np.asarray(load, np.float64)[known][:, None]  # (k', 1)
    angle = 2 * np.pi * np.mod(FREQUENCIES * slot, 1.0)  # (K,)
    cos, sin = np.cos(angle), np.sin(angle)
    waves = np.concatenate([cos, sin, cos * cos, sin * sin, cos * sin])  # (5K,) the same for every device
    per = np.concatenate([np.broadcast_to(waves, (len(u), waves.size)), u * cos, u * sin], axis=1)  # (k', 7K)
    return np.asarray(keys, np.int64)[known], np.concatenate([np.ones_like(u), u, u * u, per], axis=1)


def cycle_deviation(sums: np.ndarray, slot: np.ndarray | int) -> np.ndarray:
    """(n,) where each device's usage cycle puts its load at (absolute) ``slot`` against the fit's level, times
    :data:`CYCLE_SCALE` and clipped to [-1.5, 1.5], from its :data:`CYCLE` sums (n, 1, :data:`CHANNELS`); 0 where
    fewer than :data:`MIN_SLOTS` reports are known."""
    s = sums[:, -1, :]  # (n, C)
    n, k = len(s), len(FREQUENCIES)
    slots, load, load2 = s[:, 0], s[:, 1], s[:, 2]
    cos, sin, cos2, sin2, cossin = (s[:, 3 + i * k:3 + (i + 1) * k] for i in range(5))  # each (n, K)
    u_cos, u_sin = s[:, 3 + 5 * k:3 + 6 * k], s[:, 3 + 6 * k:]
    ridge = RIDGE * np.maximum(slots, 1.0)[:, None]  # (n, 1)
    coef = _solve_symmetric((slots[:, None] + ridge, cos, sin, cos2 + ridge, cossin, sin2 + ridge),
                            (load[:, None], u_cos, u_sin))  # 3 x (n, K): level, cos and sin weights
    residual = load2[:, None] - (coef[0] * load[:, None] + coef[1] * u_cos + coef[2] * u_sin)  # about the ridge fit's
    #                                                                                          residual sum of squares
    score = -SHARPNESS * residual / np.maximum(residual.min(axis=1, keepdims=True), 1e-12)
    weight = np.exp(score - score.max(axis=1, keepdims=True))
    angle = 2 * np.pi * np.mod(FREQUENCIES[None, :] * np.asarray(slot, np.float64).reshape(-1, 1), 1.0)  # (n or 1, K)
    wave = coef[1] * np.cos(angle) + coef[2] * np.sin(angle)  # (n, K)
    deviation = (weight * wave).sum(axis=1) / weight.sum(axis=1)
    return np.where(slots >= MIN_SLOTS, np.clip(CYCLE_SCALE * deviation, -1.5, 1.5), 0.0)


def _solve_symmetric(gram: tuple[np.ndarray, ...], moments: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """x of A x = m for many symmetric 3 x 3 systems at once, by the adjugate: ``gram`` A's upper triangle (a, b, c, d,
    e, f) = (A11, A12, A13, A22, A23, A33), ``moments`` m's three entries, each broadcasting to one shape."""
    a, b, c, d, e, f = gram
    m0, m1, m2 = moments
    adj = (d * f - e * e, c * e - b * f, b * e - c * d, a * f - c * c, b * c - a * e, a * d - b * b)
    det = a * adj[0] + b * adj[1] + c * adj[2]
    return ((adj[0] * m0 + adj[1] * m1 + adj[2] * m2) / det, (adj[1] * m0 + adj[3] * m1 + adj[4] * m2) / det,
            (adj[2] * m0 + adj[4] * m1 + adj[5] * m2) / det)
