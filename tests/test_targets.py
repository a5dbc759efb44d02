"""The targets every method is scored against (model.targets), by hand on a tiny history."""

from __future__ import annotations

import numpy as np
import pytest

from model.channel import OutageCurve
from model.config import SystemParams
from model.evidence import EvidenceConfig
from model.graphs import DeviceIndex, SlotGraph
from model.history import History
from model.targets import PairQuery, fit_outage, targets


def flagged() -> History:
    # devices a=0, b=1, c=2. slot 0: a->c, 2 tasks, both sent, one computed. slot 1: nothing.
    # slot 2: a->c (1 task, sent, computed) and b->c (3 tasks, 2 sent, none computed), with their task profiles
    slot0 = SlotGraph(0, np.array([0]), np.array([2]), np.array([0.8]), np.zeros(1), tasks=[2], flagged=[2], tr=[2],
                      com=[1], time_ratio=[0.5])
    slot2 = SlotGraph(2, np.array([0, 1]), np.array([2, 2]), np.array([1.0, 0.4]), np.zeros(2), tasks=[1, 3],
                      flagged=[1, 3], tr=[1, 2], com=[1, 0], profile=[[4e6, 300.0], [8e6, 500.0]])
    return History(DeviceIndex(("a", "b", "c")), 0, (slot0, None, slot2))


def test_targets_are_each_slots_edges_asked_from_the_slot_before() -> None:
    batch = targets(flagged(), [2, 0, 1, 2])  # any order, repeats and an empty slot: slots in order, once each
    assert len(batch) == 3
    assert batch.query.src.tolist() == [0, 0, 1] and batch.query.dst.tolist() == [2, 2, 2]
    assert batch.query.end.tolist() == [-1, 1, 1]  # slot 0 from before the log, slot 2 from the end of slot 1
    assert batch.t_col.tolist() == [0.8, 1.0, 0.4]
    assert batch.tasks.tolist() == [2, 1, 3] and batch.flagged.tolist() == [2, 1, 3]
    assert batch.tr.tolist() == [2, 1, 2] and batch.com.tolist() == [1, 1, 0]
    assert np.isnan(batch.query.profile[0]).all() and batch.query.profile[1:].tolist() == [[4e6, 300.0], [8e6, 500.0]]
    assert batch.time_ratio[0] == 0.5 and np.isnan(batch.time_ratio[1:]).all()


def test_targets_of_no_edges_are_empty() -> None:
    batch = targets(flagged(), [1])
    assert len(batch) == 0 and batch.query.src.shape == (0,) and batch.query.profile.shape == (0, 2)


def test_credibility_weighs_nothing_where_no_owner_reported() -> None:
    plain, credible = targets(flagged(), [0, 2]), targets(flagged(), [0, 2], EvidenceConfig())
    for name in ("t_col", "tasks", "flagged", "tr", "com"):
        assert getattr(credible, name).tolist() == getattr(plain, name).tolist()


def test_a_pair_query_broadcasts_its_end_and_leaves_the_profile_unknown() -> None:
    query = PairQuery(np.array([0, 1, 2]), np.array([2, 2, 0]), 4)
    assert query.end.tolist() == [4, 4, 4] and query.end.dtype == np.int64
    assert query.profile.shape == (3, 2) and np.isnan(query.profile).all()
    with pytest.raises(ValueError):
        PairQuery(np.array([0, 1]), np.array([2, 2]), np.array([1, 2, 3]))  # one end per pair, or one for all


def test_the_outage_curve_without_statuses_is_the_papers() -> None:
    system = SystemParams()
    assert fit_outage(flagged(), [1, 2], system) == OutageCurve.prior(system)  # no distance known: nothing to fit
