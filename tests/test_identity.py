"""Ids at one place judged as one collaborator (model.identity), by hand."""

from __future__ import annotations

import numpy as np
import pytest

from model.config import SlotClock
from model.evidence import N, W, EvidenceConfig
from model.identity import (carried, colocated, heard_slots, identity_groups, pooled, poor_records,
                            poor_successions, successions)
from model.status import StatusLog


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
    with pytest.raises(ValueError, match="succession_m: must be > 0 or None"):
        EvidenceConfig(succession_m=-1.0)
    with pytest.raises(ValueError, match="poor_succession_m: must be > 0 or None"):
        EvidenceConfig(poor_succession_m=0.0)
    with pytest.raises(ValueError, match="succession_slots: must be >= 1"):
        EvidenceConfig(succession_slots=0)


def test_an_id_first_heard_of_where_one_fell_silent_continues_it() -> None:
    """Id 0 was last heard of in slot 5 at (0, 0); id 1 was first heard of in slot 7, 3 m away: one device (either
    order in the arrays: ids 9 and 8 likewise). Id 2 first heard of 12 slots after id 3 fell silent (more than 10):
    apart. Id 4 first heard of 8 m from id 0 (more than 5 m): apart. Ids 5 and 6 both heard of in slot 7: apart (both
    there, not one after the other). Id 7 never reported: apart."""
    xy = np.array([[0.0, 0.0], [3.0, 0.0], [100.0, 0.0], [103.0, 0.0], [0.0, 8.0], [200.0, 0.0], [201.0, 0.0],
                   [np.nan, np.nan], [300.0, 1.0], [300.0, 0.0]])
    first = np.array([0, 7, 20, 0, 6, 0, 2, -1, 9, 0])
    last = np.array([5, 9, 20, 8, 9, 7, 7, -1, 9, 4])
    np.testing.assert_array_equal(sorted(map(tuple, successions(xy, first, last, 5.0, 10))), [(0, 1), (9, 8)])
    group = identity_groups(xy, first, last, colocation_m=0.1, succession_m=5.0, within_slots=10)
    assert group[0] == group[1] and group[8] == group[9] and len(set(group)) == 8
    assert identity_groups(xy, first, last, colocation_m=0.1, succession_m=None, within_slots=10) is None
    assert identity_groups(xy, first, last, colocation_m=None, succession_m=None, within_slots=10) is None
    both = identity_groups(xy, first, last, colocation_m=1.5, succession_m=5.0, within_slots=10)
    assert both[0] == both[1] and both[5] == both[6] and len(set(both)) == 7


def test_a_record_is_poor_below_the_fleets_mean_t_col_at_the_longest_memory() -> None:
    collaborator = np.zeros((4, 2, W + 1))
    collaborator[:, -1, N] = [4.0, 4.0, 0.0, 2.0]
    collaborator[:, -1, W] = [2.0, 3.2, 0.0, 1.5]  # mean T_col 0.5, 0.8, none, 0.75
    collaborator[:, 0, W] = 9.0  # a shorter memory is not read
    population = np.zeros((2, W + 1))
    population[-1, [N, W]] = [10.0, 7.5]  # the fleet's 0.75
    np.testing.assert_array_equal(poor_records(collaborator, population), [True, False, False, False])


def test_a_poor_record_passes_farther_by_the_least_costly_matching_once() -> None:
    """Ids 0 and 1 fell silent in slot 5 with poor records. Fresh id 4 first reported in slot 6, 60 m from id 0; fresh
    ids 2 and 3 in slot 7, id 2 30 m from id 0 and 40 m from id 1, id 3 50 m from id 1. Within 75 m and 10 slots the
    links cost 0→4 60/75 + 1/10 = 0.9, 0→2 0.4 + 0.2 = 0.6, 1→2 0.533 + 0.2 = 0.733, 1→3 0.667 + 0.2 = 0.867:
    of the matchings that link both, {0→2, 1→3} costs least (1.467; {0→4, 1→2} 1.633), so 4 stays apart though it
    came sooner. With id 3 out of reach, linking both takes {0→4, 1→2}: 0 gives up its nearer id so that 1 is
    linked. Id 5 fell silent with a good record 10 m from fresh id 6: apart."""
    xy = np.array([[0.0, 0.0], [70.0, 0.0], [30.0, 0.0], [120.0, 0.0], [0.0, 60.0], [500.0, 0.0], [510.0, 0.0],
                   [900.0, 900.0]])
    first = np.array([0, 0, 7, 7, 6, 0, 6, 0])
    last = np.array([5, 5, 9, 9, 9, 5, 9, 9])
    records = served(np.array([0.5, 0.5, 0, 0, 0, 0.9, 0, 0]), np.array([4, 4, 0, 0, 0, 4, 0, 0]))  # the fleet's 0.75
    poor = poor_records(*records)
    np.testing.assert_array_equal(np.flatnonzero(poor), [0, 1])
    assert sorted(map(tuple, poor_successions(xy, first, last, poor, 75.0, 10))) == [(0, 2), (1, 3)]
    away = xy.copy()
    away[3] = [300.0, 0.0]
    assert sorted(map(tuple, poor_successions(away, first, last, poor, 75.0, 10))) == [(0, 4), (1, 2)]
    assert not len(poor_successions(xy, first, last, poor, 20.0, 10))
    group = identity_groups(xy, first, last, colocation_m=0.1, succession_m=5.0, within_slots=10, records=records,
                            poor_succession_m=75.0)
    assert group[0] == group[2] and group[1] == group[3] and len(set(group)) == 6
    assert identity_groups(xy, first, last, colocation_m=0.1, succession_m=5.0, within_slots=10) is None
    alone = identity_groups(xy, first, last, colocation_m=None, succession_m=None, within_slots=10, records=records,
                            poor_succession_m=75.0)
    np.testing.assert_array_equal(alone == alone[0], group == group[0])
    np.testing.assert_array_equal(alone == alone[1], group == group[1])


def test_an_id_is_judged_by_the_record_it_carried() -> None:
    """Id 0 (mean T_col 0.5) fell silent in slot 3 and id 1 took its record over 60 m away; id 1's own record (0.8) is
    above the fleet's 0.75, the two together (0.65) below it, so when id 1 falls silent in slot 6 it passes them on to
    id 2, 60 m farther (120 m from id 0)."""
    xy = np.array([[0.0, 0.0], [60.0, 0.0], [120.0, 0.0], [500.0, 500.0]])
    first, last = np.array([0, 4, 7, 0]), np.array([3, 6, 9, 9])
    records = served(np.array([0.5, 0.8, 0, 0]), np.array([4, 4, 0, 0]))
    group = identity_groups(xy, first, last, None, None, 10, records=records, poor_succession_m=75.0)
    assert group[0] == group[1] == group[2] != group[3]
    links = poor_successions(xy, first, last, poor_records(*records), 75.0, 10)  # by its own record: 1 is fair
    assert list(map(tuple, links)) == [(0, 1)]
    np.testing.assert_allclose(carried(records[0], links, last)[:, 0, [N, W]], [[4, 2], [8, 5.2], [0, 0], [0, 0]])


def served(rate: np.ndarray, tasks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each id's record (n, 2, C) with ``tasks`` at mean T_col ``rate`` at the longest memory, the population's
    (2, C) at 0.75)."""
    collaborator = np.zeros((len(rate), 2, W + 1))
    collaborator[:, -1, N], collaborator[:, -1, W] = tasks, rate * tasks
    population = np.zeros((2, W + 1))
    population[-1, [N, W]] = [10.0, 7.5]
    return collaborator, population


def test_a_status_log_keeps_when_each_device_was_first_heard_of() -> None:
    clock = SlotClock(origin_ms=1_000, slot_ms=100)
    log = StatusLog()
    for t in (1_050, 1_150, 1_250, 1_350):
        log.add(np.array([3, 4]), np.array([t, t + 10]), np.zeros((2, 9)))
    log.add(np.array([5]), np.array([1_360]), np.zeros((1, 9)))
    log.prune(1_300)  # superseded statuses go; each device's first stays
    np.testing.assert_array_equal(log.first_ms(np.array([4, 3, 5, 6]), 1_400), [1_060, 1_050, 1_360, -1])
    np.testing.assert_array_equal(log.first_ms(np.array([5]), 1_300), [-1])  # not yet heard of then
    first, last = heard_slots(log.first_ms(np.array([3, 6]), 1_400), log.latest_heard(np.array([3, 6]), 1_400)[1], clock)
    np.testing.assert_array_equal(first, [0, -1])
    np.testing.assert_array_equal(last, [3, -1])
