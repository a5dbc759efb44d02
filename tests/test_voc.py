"""VoC curves scored by hand: the paper's rule on a task with two candidates, by drawn outcomes and by expectation."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from model.voc import THETAS, InRange, voc_curves
from simulator.config import SimConfig
from simulator.world import Expected


def two_candidates() -> InRange:
    """One task, candidates a (VoC 0.9, P(com | tr) 0.5: true T 0.6 + 0.4 * 0.5 = 0.8) and b (VoC 0.6, P(com | tr) 1:
    true T 1), transmission sure, T_res 1."""
    expected = Expected(p_tr=np.array([1.0, 1.0]), p_com_given_tr=np.array([0.5, 1.0]), offload=None, local=None)
    return InRange(slot=0, valid=np.array([[True, True]]), rows=np.array([0, 0]), cols=np.array([0, 1]),
                   expected=expected, value=np.array([0.9, 0.6]), t_res=np.array([1.0, 1.0]))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expected_voc_is_each_choices_voc_times_its_chance(seed: int) -> None:
    world = SimpleNamespace(config=SimConfig())
    scored = [(np.array([0]), two_candidates(), {"m": np.array([0.9, 0.8])})]
    expected = voc_curves(world, scored, seed=seed, drawn=False)
    # m trusts both up to θ = 0.8 and a alone above: the paper's rule takes a (the higher VoC) at every θ
    assert expected["m"] == pytest.approx([0.9 * 0.5] * len(THETAS))
    # the truth trusts both up to θ = 0.8 and b alone at 0.9
    assert expected["oracle"] == pytest.approx([0.45] * (len(THETAS) - 1) + [0.6])
    drawn = voc_curves(world, scored, seed=seed)
    assert set(drawn["m"]) <= {0.0, 0.9} and len(set(drawn["m"])) == 1  # one draw per task, the same at every θ
    assert drawn["oracle"][-1] == 0.6  # b never fails
    # random picks the same candidate whichever way its choice is scored: b (sure, 0.6) or a (0.45 expected)
    picked_b = expected["random"][0] == pytest.approx(0.6)
    assert picked_b or expected["random"][0] == pytest.approx(0.45)
    assert (drawn["random"][0] == 0.6) if picked_b else drawn["random"][0] in (0.0, 0.9)
