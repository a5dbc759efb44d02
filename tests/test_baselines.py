"""Rule baselines against hand-computed values on a tiny history."""

from __future__ import annotations

import numpy as np
import pytest

from model.baselines import BetaParams, QSParams, RunningMean, beta_reputation, predict_edges, qs_trust
from model.graphs import DeviceIndex, SlotGraph
from model.history import History


def tiny() -> History:
    # devices a=0, b=1, c=2. slot 0: a->c 1.0, b->c 0.0. slot 1: nothing. slot 2: a->c 0.5. slot 3: a->c, b->c, a->b
    def g(t, src, dst, t_col):
        return SlotGraph(t, np.array(src), np.array(dst), np.array(t_col, dtype=float), np.zeros(len(src)))

    graphs = (g(0, [0, 1], [2, 2], [1.0, 0.0]), None, g(2, [0], [2], [0.5]), g(3, [0, 1, 0], [2, 2, 1], [0.2, 0.4, 0.9]))
    return History(DeviceIndex(("a", "b", "c")), 0, graphs)


def test_beta_reputation_by_hand() -> None:
    p = BetaParams(lam=0.5, w=0.1)
    out = beta_reputation(tiny(), [2, 3], p)
    # before slot 2 (after two decays... slot 0 evidence decayed once by the empty slot 1):
    # a->c: r = 1*0.5, s = 0; c overall: R = 0.5, S = 0.5
    e_2 = (0.5 + 0.1 * 0.5 + 1) / (0.5 + 0 + 0.1 * 1.0 + 2)
    # before slot 3: decay then add slot 2: r_ac = 0.25 + 0.5, s_ac = 0.5; R_c = 0.25 + 0.5, S_c = 0.25 + 0.5;
    # r_bc = 0, s_bc = 0.25; a->b unseen, R_b = S_b = 0
    e_ac = (0.75 + 0.1 * 0.75 + 1) / (0.75 + 0.5 + 0.1 * 1.5 + 2)
    e_bc = (0 + 0.1 * 0.75 + 1) / (0 + 0.25 + 0.1 * 1.5 + 2)
    assert out.tolist() == pytest.approx([e_2, e_ac, e_bc, 0.5])


def test_qs_trust_by_hand() -> None:
    out = qs_trust(tiny(), [2, 3], QSParams(beta=0.5, k=2.0))
    # slot 2, a->c: direct 1.0 (1 obs), recommendation from b: 0.0 (1 obs); own weight 1/3
    t_2 = (1 / 3) * 1.0 + (2 / 3) * 0.0
    # slot 3: a->c direct = 0.5*1.0 + 0.5*0.5 = 0.75 (2 obs), rec from b = 0.0 -> 0.5*0.75 + 0.5*0
    # b->c: direct 0.0 (1 obs), rec from a = 0.75 -> (1/3)*0 + (2/3)*0.75; a->b: nothing known -> 0.5
    assert out.tolist() == pytest.approx([t_2, 0.375, 0.5, 0.5])


def test_running_mean_by_hand() -> None:
    out = predict_edges(RunningMean(3), tiny(), [0, 2, 3])
    # slot 0: nothing read yet -> 0.5; slot 2: mean of 1.0, 0.0; slot 3: mean of 1.0, 0.0, 0.5 for every pair
    assert out.tolist() == pytest.approx([0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    scorer = RunningMean(3)
    for graph in tiny().graphs:
        scorer.advance(graph)
    assert scorer.score(np.array([0]), np.array([1])).tolist() == pytest.approx([(1.0 + 0.0 + 0.5 + 0.2 + 0.4 + 0.9) / 6])


def test_rules_track_a_degrading_collaborator() -> None:
    graphs = tuple(SlotGraph(t, np.array([0]), np.array([1]), np.array([1.0 if t < 10 else 0.0]), np.zeros(1))
                   for t in range(20))
    history = History(DeviceIndex(("a", "b")), 0, graphs)
    for predict in (beta_reputation, qs_trust):
        out = predict(history, range(1, 20))
        assert out[8] > 0.8 and out[-1] < out[8] - 0.5
