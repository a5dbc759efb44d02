"""Error metrics between predicted trust and its target (NaN when there is nothing to score)."""

from __future__ import annotations

import numpy as np


def rmse(prediction: np.ndarray, target: np.ndarray) -> float:
    return float(np.sqrt(np.mean((prediction - target) ** 2))) if len(target) else float("nan")


def mae(prediction: np.ndarray, target: np.ndarray) -> float:
    return float(np.mean(np.abs(prediction - target))) if len(target) else float("nan")


def mean_error(prediction: np.ndarray, target: np.ndarray) -> float:
    """The mean of prediction - target: positive where a method over-rates (the sign selection pays for)."""
    return float(np.mean(prediction - target)) if len(target) else float("nan")


def expected_calibration_error(prediction: np.ndarray, target: np.ndarray, edges: np.ndarray) -> float:
    """ECE: sum over bins of predicted value (``edges``, the last bin closed) of the bin's share times
    |mean prediction - mean target| in it, i.e. |sum of (prediction - target) in the bin| / N."""
    if not len(target):
        return float("nan")
    bins = np.digitize(prediction, edges[1:-1])
    gap = np.bincount(bins, prediction - target, minlength=len(edges) - 1)
    return float(np.abs(gap).sum() / len(target))
