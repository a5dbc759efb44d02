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


def success_probability(t_beh: np.ndarray, p_tr: np.ndarray, weights: TrustWeights) -> np.ndarray:
    """P(success) = P(tr) * P(com | tr) of a pair's task, from its T_beh and its P(tr).

    T_beh forecasts T_col, whose expectation is P(tr) * (a1 + a2 * P(com | tr)) (computation only follows
    transmission), so P(tr) * P(com | tr) = (T_beh - a1 * P(tr)) / a2, clipped to [0, P(tr)]: what a task's
    value is weighed by, where T_beh weighs a failed computation at a1 of a success.
    """
    success = (t_beh - weights.a_tr * p_tr) / weights.a_com
    return np.clip(success, 0.0, p_tr)


SelectionRule = Literal["paper", "expected", "success"]
SELECTION_RULES: tuple[SelectionRule, ...] = ("paper", "expected", "success")
def rule_suffix(rule: SelectionRule) -> str:
    """What a report's figures by ``rule`` are suffixed with: nothing for the paper's rule, else ``_<rule>``."""
    return "" if rule == "paper" else f"_{rule}"


RULE_WORDS: dict[SelectionRule, str] = {  # each rule as reports name it
    "paper": "the paper's rule: the highest VoC among T >= θ",
    "expected": "the expected-value rule: the highest T × VoC among T >= θ",
    "success": "the success rule: the highest P(success) × T_res × VoC among T >= θ",
}


def select(trust: np.ndarray, voc: np.ndarray, valid: np.ndarray, threshold: float,
           rule: SelectionRule = "paper", success: np.ndarray | None = None) -> np.ndarray:
    """Per task (row), among valid candidates with T >= theta: the one with the highest VoC (``"paper"``, the
    paper's rule, blind to how likely the task is to succeed), the highest T * VoC (``"expected"``, T standing in
    for the chance of success), or the highest expected value itself, ``success`` * VoC (``"success"``).

    trust, voc, valid, success: (tasks, candidates); ``success`` (rule ``"success"`` only) each candidate's
    P(success) * T_res (:func:`success_probability`). Returns the chosen column per task, -1 where none qualifies.
    """
    if rule not in SELECTION_RULES:
        raise ValueError(f"selection rule: one of {', '.join(SELECTION_RULES)} (got {rule!r})")
    if (rule == "success") != (success is not None):
        raise ValueError(f"select: success= is given with rule 'success' and only then (rule {rule!r}, success "
                         f"{'given' if success is not None else 'None'})")
    eligible = valid & (trust >= threshold)
    unknown = eligible & np.isnan(voc)
    if unknown.any():  # argmax would take it for the best
        task, column = np.argwhere(unknown)[0]
        raise ValueError(f"select: voc=nan at task {task}, candidate {column} (T >= its threshold): an unknown VoC "
                         "is no candidate's best")
    value = voc if rule == "paper" else (trust if success is None else success) * np.maximum(voc, 0.0)
    score = np.where(eligible, value, -np.inf)
    choice = score.argmax(axis=1)
    return np.where(eligible.any(axis=1), choice, -1)
