"""Trust arithmetic of the paper: the weight behind T_col, T_res, and collaborator selection."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from model.config import TrustWeights

Array = Any  # np.ndarray | torch.Tensor | float


def collaboration_weight(p_tr: Array, p_com: Array, weights: TrustWeights) -> Array:
    """a1 * p_tr + a2 * p_com for each task (flags as 0/1, or probabilities for the expectation).

    T_col(i, j) of a slot is the mean of this over the slot's tasks from i to j.
    """
    return weights.a_tr * p_tr + weights.a_com * p_com


def resource_trust(willingness: Array, comm_ok: Array, comp_ok: Array) -> Array:
    """T_res = willingness * communication-ok * computation-ok."""
    return willingness * comm_ok * comp_ok


SelectionRule = Literal["paper", "expected"]
SELECTION_RULES: tuple[SelectionRule, ...] = ("paper", "expected")


def select(trust: np.ndarray, voc: np.ndarray, valid: np.ndarray, threshold: float,
           rule: SelectionRule = "paper") -> np.ndarray:
    """Per task (row), among valid candidates with T >= theta: the one with the highest VoC (``"paper"``, the
    paper's rule, blind to how likely the task is to succeed) or the highest expected value T * VoC
    (``"expected"``).

    trust, voc, valid: (tasks, candidates). Returns the chosen column per task, -1 where none qualifies.
    """
    if rule not in SELECTION_RULES:
        raise ValueError(f"selection rule: one of {', '.join(SELECTION_RULES)} (got {rule!r})")
    eligible = valid & (trust >= threshold)
    unknown = eligible & np.isnan(voc)
    if unknown.any():  # argmax would take it for the best
        task, column = np.argwhere(unknown)[0]
        raise ValueError(f"select: voc=nan at task {task}, candidate {column} (T >= its threshold): an unknown VoC "
                         "is no candidate's best")
    value = voc if rule == "paper" else trust * np.maximum(voc, 0.0)
    score = np.where(eligible, value, -np.inf)
    choice = score.argmax(axis=1)
    return np.where(eligible.any(axis=1), choice, -1)
