"""Trust arithmetic of the paper: the per-task collaboration weight behind T_col."""

from __future__ import annotations

from typing import Any

from model.config import TrustWeights

Array = Any  # np.ndarray | torch.Tensor | float


def collaboration_weight(p_tr: Array, p_com: Array, weights: TrustWeights) -> Array:
    """a1 * p_tr + a2 * p_com for each task (flags as 0/1, or probabilities for the expectation).

    T_col(i, j) of a slot is the mean of this over the slot's tasks from i to j.
    """
    return weights.a_tr * p_tr + weights.a_com * p_com
