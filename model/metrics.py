"""Error metrics between predicted trust and its target (NaN when there is nothing to score)."""

from __future__ import annotations

import numpy as np


def rmse(prediction: np.ndarray, target: np.ndarray) -> float:
    return float(np.sqrt(np.mean((prediction - target) ** 2))) if len(target) else float("nan")


def mae(prediction: np.ndarray, target: np.ndarray) -> float:
    return float(np.mean(np.abs(prediction - target))) if len(target) else float("nan")
