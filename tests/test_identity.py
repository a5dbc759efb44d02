"""Ids at one place judged as one collaborator (model.identity), by hand."""

from __future__ import annotations

import numpy as np
import pytest

from model.evidence import EvidenceConfig
from model.identity import colocated, pooled


def test_ids_within_the_radius_share_a_group_and_ids_without_a_position_stand_alone() -> None:
    xy = np.array([[10.0, 5.0], [10.8, 5.0], [11.6, 5.0], [np.nan, np.nan], [np.nan, np.nan], [13.0, 5.0], [10.0, 5.0]])
    group = colocated(xy, radius_m=1.0)
    assert group[0] == group[1] == group[2] == group[6]  # 0.8 m apart in a chain, and one position twice
    assert len({group[0], group[3], group[4], group[5]}) == 4  # 1.4 m from the chain; two unknown positions apart
    assert len(set(colocated(xy, radius_m=0.5))) == 6  # only the repeated position within 0.5 m


def test_pooled_sums_each_groups_evidence_and_keeps_its_latest_service() -> None:
    collaborator = np.arange(3 * 2 * 1, dtype=np.float64).reshape(3, 2, 1)  # (n, L, C): 0 1 | 2 3 | 4 5
    since = np.array([7, 2, 10**9])
    sums, latest = pooled(collaborator, since, np.array([0, 1, 0]))
    np.testing.assert_array_equal(sums[:, :, 0], [[4, 6], [2, 3], [4, 6]])
    np.testing.assert_array_equal(latest, [7, 2, 7])


def test_ids_apart_are_left_as_they_are() -> None:
    collaborator, since = np.ones((3, 2, 4)), np.array([1, 2, 3])
    xy = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]])
    sums, latest = pooled(collaborator, since, colocated(xy, 1.0))
    assert sums is collaborator and latest is since


def test_a_radius_that_is_not_positive_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="colocation_m: must be > 0 or None"):
        EvidenceConfig(colocation_m=0.0)
