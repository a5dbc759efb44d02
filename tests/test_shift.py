"""Where a device's reported load shifts (model.shift): the CUSUM by hand, what the head reads of it (a fall only where
the tasks' times bear the loads out and, with ``fall_earned``, once the device has served since), a cycling load left
alone, a fall weighed by how the fleet's recent falls fared (the physics reading the load as far as the head reads
the fall), and the same shifts (the loads' cycles, model.usage_cycle, and the fleet's falls beside them) offline, in
shards, through pending slots and across a snapshot."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from model.evidence import (COM, FALL_AGES, REPORTS, SHIFT_OPEN, SHIFT_ROLES, SHIFT_TEST, SHIFTED, SK, SUMMED_ROLES,
                            SV, TON, EvidenceConfig, channels_of, empty_state, fall_age, fall_credit, fall_pool,
                            credited_load, loads_contradicted, report_increments, shift_block)
from model.config import RankingConfig
from model.scoring import DeviceFrame, DeviceHistory, EvidenceSnapshot, shard_of, slot_part, status_arrays
from model.shift import step
from model.stages import TorchStages
from model.usage_cycle import CYCLE
from tests.test_bm import SMALL
from tests.test_scoring import SIM, scored_log

# the longest memory forgets nothing, so the sums below are plain counts
CONFIG = EvidenceConfig(lams=(0.9, 1.0), level_memory=0.9, shifts=True)


def watched(loads: np.ndarray, com: np.ndarray) -> list[dict]:
    """One device's load (T,) and computation outcome (T,) (one on-time task a slot) through :func:`step`, its reports
    summed after each slot as :meth:`model.history.History.tracks` sums them; the shift states after each slot."""
    states = {role: empty_state(role, CONFIG.lams) for role in (REPORTS, *SHIFT_ROLES)}
    key = np.array([7])
    after = []
    for slot, (load, success) in enumerate(zip(loads, com)):
        before = states[REPORTS].query(key, slot)[0]
        step(states, slot, key, np.array([load]), before, np.ones(1), np.array([success]), CONFIG)
        reported, increments = report_increments(key, np.array([load]))
        states[REPORTS].update(reported, slot, increments)
        after.append({role: states[role].query(key, slot)[0][0] for role in SHIFT_ROLES})
    return after


def test_a_step_in_the_load_is_a_shift_located_where_the_step_began() -> None:
    loads = np.r_[np.full(20, 0.30), np.full(12, 0.55)]
    com = (np.arange(32) >= 20).astype(float)  # fails until its load steps up, succeeds after
    after = watched(loads, com)
    # by hand: the reference is the mean of the loads before the slot; up gathers load - reference - 0.125
    # slot 20: 0.55 - 0.3 = 0.25 -> 0.125; 21: 0.55 - 6.55/21 -> 0.2488; 22: -> 0.3511; 23: -> 0.4435; 24: -> 0.5268
    np.testing.assert_allclose(after[23][SHIFT_TEST][0], [1.0, 0.125 + (0.55 - 6.55 / 21) + (0.55 - 7.1 / 22)
                                                          + (0.55 - 7.65 / 23) - 3 * 0.125, 0.0])
    assert all(not a[SHIFTED].any() for a in after[:24])  # nothing shifted before the alarm
    # slot 24 passes the alarm: the shift is located at slot 20, where up last stood at zero before
    np.testing.assert_allclose(after[24][SHIFTED][-1], [5, 5 * 0.55, 5, 5])  # slots 20-24: loads, on-time, successes
    assert not after[24][SHIFT_TEST].any() and not after[24][SHIFT_OPEN].any()  # both sides start again
    # from then on the load is set against its mean since the shift (0.55): no second shift, the sums go on
    np.testing.assert_allclose(after[31][SHIFTED][-1], [12, 12 * 0.55, 12, 12])
    np.testing.assert_allclose(after[31][SHIFTED][0], [sum(0.9 ** k for k in range(12))] * 1 +
                               [0.55 * sum(0.9 ** k for k in range(12))] + [sum(0.9 ** k for k in range(12))] * 2)


def test_a_step_down_is_a_shift_too_and_the_head_reads_it_unless_the_times_contradict_the_loads() -> None:
    """A fall in a load is read as a shift (with ``fall_earned``, once the device has served that many on-time tasks
    since); before, or where its tasks' times contradict its loads, it reads as no shift at all. A rise is read either
    way, the rate since shrunk toward the whole record's where the loads are doubted."""
    loads = np.r_[np.full(20, 0.55), np.full(12, 0.30)]
    com = (np.arange(32) >= 20).astype(float)
    shifted = watched(loads, com)[-1][SHIFTED]
    assert shifted[-1, 0] == 12  # located at slot 20 again: the sides are alike
    # the head's columns: read as a shift; P(com | tr) since less over the whole record; log count since; the move
    whole = np.zeros((1, 2, 18))
    whole[..., 5], whole[..., 4] = [[32.0, 32.0]], [[12.0, 12.0]]  # TON, COM over its whole record (at lambda 1)
    reports = np.array([[[10.0, 10 * 0.55], [32.0, 20 * 0.55 + 12 * 0.30]]])
    fell = 2 * (0.30 - (20 * 0.55 + 12 * 0.30) / 32)
    read, rate, count, away = shift_block(whole, shifted[None], reports, np.array([False]))
    assert read[0, 0] == 1.0
    np.testing.assert_allclose(rate[0, 1], 13 / 14 - 13 / 34)
    np.testing.assert_allclose(count[0, 1], np.log1p(12) / 3)
    np.testing.assert_allclose(away[0, 0], max(-1.0, fell))
    doubted_fall = shift_block(whole, shifted[None], reports, np.array([True]))
    assert not any(column.any() for column in doubted_fall)  # doubted: a fall reads as no shift at all
    few = shifted.copy()
    few[:, 2:] = [[1.5, 1.5], [1.9, 1.9]]  # on-time tasks and successes since: 1.9 at the longest memory
    read, rate, _, _ = shift_block(whole, few[None], reports, np.array([False]))  # fall_earned 0: read at once
    assert read[0, 0] == 1.0
    np.testing.assert_allclose(rate[0], [2.5 / 3.5 - 13 / 34, 2.9 / 3.9 - 13 / 34])
    unearned = shift_block(whole, few[None], reports, np.array([False]), fall_earned=2.0)
    assert not any(column.any() for column in unearned)  # under fall_earned on-time tasks since: no shift at all
    few[-1, 2:] = 2.0  # as many as it takes: read
    read, rate, _, _ = shift_block(whole, few[None], reports, np.array([False]), fall_earned=2.0)
    assert read[0, 0] == 1.0
    np.testing.assert_allclose(rate[0], [2.5 / 3.5 - 13 / 34, 3 / 4 - 13 / 34])
    up = watched(np.r_[np.full(20, 0.30), np.full(12, 0.55)], com)[-1][SHIFTED]  # rose at slot 20
    rise_reports = np.array([[[10.0, 10 * 0.30], [32.0, 20 * 0.30 + 12 * 0.55]]])
    # a rise is read either way, the rate since shrunk toward the whole record's where the loads are doubted
    for doubted, since in ((False, 13 / 14), (True, (12 + 2 * 13 / 34) / 14)):
        read, rate, count, away = shift_block(whole, up[None], rise_reports, np.array([doubted]))
        assert read[0, 0] == 1.0
        np.testing.assert_allclose(rate[0, 1], since - 13 / 34)
        np.testing.assert_allclose(count[0, 1], np.log1p(12) / 3)
        np.testing.assert_allclose(away[0, 0], min(1.0, 2 * (0.55 - (20 * 0.30 + 12 * 0.55) / 32)))
    never = shift_block(whole, np.zeros((1, 2, 4)), reports, np.array([False]))
    assert not any(column.any() for column in never)  # a device whose load never shifted reads zeros


def test_a_fall_is_read_as_far_as_the_falls_of_its_cohort_bear_it_out() -> None:
    """The fleet's pool by the falls' age: on-time tasks and successes since a fall at the level memory, of devices
    whose load fell and whose times bear their loads out, and the successes their whole records would have given those
    tasks; the credit of a fall of each age, from the falls within COHORT slots of its own, by hand; a fall's columns
    weighed by it, a rise's not."""
    config = replace(CONFIG, speed_gap=0.0, fall_credit=True)
    shifted = np.zeros((6, 2, 4))
    shifted[0] = [[2.5, 0.75, 2.0, 1.0], [3.0, 0.9, 2.5, 1.5]]  # fell 3 slots ago: its mean load since 0.3
    shifted[1] = [[6.0, 1.8, 4.0, 4.0], [15.0, 4.5, 6.0, 6.0]]  # fell 15 slots ago
    shifted[2] = [[2.5, 1.75, 2.0, 2.0], [3.0, 2.1, 2.0, 2.0]]  # rose: its mean load since 0.7
    shifted[4] = shifted[0]  # fell as device 0 did, but its tasks' times contradict its loads
    shifted[5] = [[9.0, 2.7, 1.0, 0.0], [45.0, 13.5, 9.0, 1.0]]  # fell 45 slots ago: older than any pooled
    reports = np.tile([[10.0, 5.5], [20.0, 11.0]], (6, 1, 1))  # a mean reported load of 0.55 at the longest memory
    sums = np.zeros((6, 2, 18))
    sums[:, -1, COM], sums[:, -1, TON] = 4.0, 9.0  # a whole record of 4 successes in 9 on-time tasks: rate 5 / 11
    sums[4, -1, SK], sums[4, -1, SV] = 9.0, 9.0 * 0.5  # runs far faster than it says: doubted
    np.testing.assert_array_equal(fall_age(shifted, config.lams), [3, 15, 3, 0, 3, 45])  # lambda 1: the count itself
    np.testing.assert_allclose(fall_age(np.array([[[1 + 0.9 + 0.81, 0, 0, 0]]]), (0.9,)), [3.0])  # forgetting undone
    pool = fall_pool(sums, shifted, reports, config)
    expected = np.zeros((FALL_AGES, 3))
    expected[3], expected[15] = [2.0, 1.0, 2.0 * 5 / 11], [4.0, 4.0, 4.0 * 5 / 11]
    np.testing.assert_allclose(pool, expected)
    assert not fall_pool(sums, None, reports, config).any()
    assert not fall_pool(sums, shifted, reports, CONFIG).any()  # a config that reads no credit pools nothing
    # credit: over the cohort, (successes - expected + 10 x 0.5 x 0.1) / (tasks + 10), over 0.1, within [0, 1]; a fall
    # whose cohort holds no task since is read at half
    young = (1.0 - 10 / 11 + 0.5) / 12 / 0.1
    np.testing.assert_allclose(fall_credit(pool, np.array([3.0, 8.0, 9.0, 15.0, 30.0])), [young, young, 0.5, 1.0, 0.5])
    wave = np.zeros((FALL_AGES, 3))
    wave[20] = [10.0, 2.0, 3.0]  # falls 20 slots old that did worse than their records
    np.testing.assert_allclose(fall_credit(wave, np.array([14.0, 15.0, 20.0, 25.0, 26.0])), [0.5, 0.0, 0.0, 0.0, 0.5])
    wave[20] = [10.0, 4.0, 3.5]
    np.testing.assert_allclose(fall_credit(wave, np.array([20.0])), [0.5])
    wave[20] = [10.0, 5.0, 3.5]
    np.testing.assert_allclose(fall_credit(wave, np.array([20.0])), [1.0])  # borne out: read in full
    fall = watched(np.r_[np.full(20, 0.55), np.full(12, 0.30)], (np.arange(32) >= 20).astype(float))[-1][SHIFTED]
    rise = watched(np.r_[np.full(20, 0.30), np.full(12, 0.55)], (np.arange(32) >= 20).astype(float))[-1][SHIFTED]
    whole = np.zeros((2, 2, 18))
    whole[..., TON], whole[..., COM] = 32.0, 12.0
    both = np.stack([fall, rise])
    levels = np.array([[[10.0, 5.5], [32.0, 20 * 0.55 + 12 * 0.30]], [[10.0, 3.0], [32.0, 20 * 0.30 + 12 * 0.55]]])
    full = shift_block(whole, both, levels, np.zeros(2, bool))
    for credit in (0.0, 0.25):
        weighed = shift_block(whole, both, levels, np.zeros(2, bool), credit=credit)
        for column, before in zip(weighed, full):
            np.testing.assert_allclose(column[0], credit * before[0])  # the fall, as far as credited
            np.testing.assert_array_equal(column[1], before[1])  # the rise, in full
    assert full[0][0, 0] == 1.0 and full[1][0].any()


def test_the_physics_reads_a_fall_in_a_load_only_as_far_as_the_head_reads_it() -> None:
    """The load the head's physics reads: where a load fell, the reported load raised by the part of the fall (the mean
    load at the longest memory less the mean since) that is doubted: all of it where the tasks' times contradict the
    loads, where the fall is not yet earned or its cohort has shown no gain, and as far as the cohort's credit lies
    below half (a fall before its cohort has served); a rise, a load that never shifted and a model that watches no
    shifts read the load as reported."""
    config = replace(CONFIG, fall_credit=True)
    fall = watched(np.r_[np.full(20, 0.55), np.full(12, 0.30)], (np.arange(32) >= 20).astype(float))[-1][SHIFTED]
    rise = watched(np.r_[np.full(20, 0.30), np.full(12, 0.55)], (np.arange(32) >= 20).astype(float))[-1][SHIFTED]
    shifted = np.stack([fall, rise, np.zeros_like(fall)])
    levels = np.array([[[10.0, 5.5], [32.0, 20 * 0.55 + 12 * 0.30]], [[10.0, 3.0], [32.0, 20 * 0.30 + 12 * 0.55]],
                       [[10.0, 4.0], [32.0, 12.8]]])
    whole = np.zeros((3, 2, 18))
    whole[..., TON], whole[..., COM] = 32.0, 12.0
    load = np.array([0.30, 0.55, 0.40])
    fell = (20 * 0.55 + 12 * 0.30) / 32 - 0.30
    for credit, unread in ((1.0, 0.0), (0.5, 0.0), (0.25, 0.5), (0.0, 1.0), (np.array([0.4, 0.0, 0.0]), 0.2)):
        np.testing.assert_allclose(credited_load(load, whole, shifted, levels, config, credit),
                                   load + [unread * fell, 0.0, 0.0])
    np.testing.assert_allclose(credited_load(load, whole, shifted, levels, CONFIG, 0.0), load)  # no credit read
    unearned = credited_load(load, whole, shifted, levels, replace(config, fall_earned=20.0), 1.0)
    np.testing.assert_allclose(unearned, load + [fell, 0.0, 0.0])  # 12 on-time tasks since, under 20
    doubted = whole.copy()
    doubted[:, -1, SK], doubted[:, -1, SV] = 9.0, 9.0 * 0.5  # runs far faster than it says
    np.testing.assert_allclose(credited_load(load, doubted, shifted, levels, replace(config, speed_gap=0.0), 1.0),
                               load + [fell, 0.0, 0.0])
    assert credited_load(load, whole, shifted, levels, replace(config, shifts=False), 0.0) is load
    assert credited_load(load, whole, None, levels, config, 0.0) is load


def test_the_tasks_times_contradict_loads_beyond_half_the_claims_margin_on_either_side() -> None:
    """A device's mean log of shown speed over its claims, less the typical one, beyond half of log 1.25 + 0.3 /
    sqrt(timed tasks) either way: a device that says it is busier than it is runs fast, one that says it is idler runs
    slow; fewer than 2 timed tasks are not judged."""
    sums = np.zeros((6, 2, 18))
    timed = np.array([9.0, 9.0, 9.0, 1.0, 16.0, 16.0])
    gap = np.array([0.0, 0.17, -0.17, 0.9, 0.14, 0.16])  # half margins: 0.1616 (9 tasks), 0.1490 (16)
    sums[:, -1, SK], sums[:, -1, SV] = timed, timed * (gap + 0.05)
    config = replace(CONFIG, speed_gap=0.05)
    np.testing.assert_array_equal(loads_contradicted(sums, config), [False, True, True, False, False, True])
    assert not loads_contradicted(sums, CONFIG).any()  # no times known: loads read as said


def test_a_load_that_cycles_about_its_level_never_shifts() -> None:
    slots = np.arange(400)
    for period in (8.0, 23.0, 40.0):  # the simulator's cycles: +-0.12 with +-0.08 of noise about the level
        noise = np.random.default_rng(int(period)).uniform(-1, 1, len(slots))
        loads = 0.3 + 0.12 * np.sin(2 * np.pi * slots / period) + 0.08 * noise
        after = watched(loads, np.ones(len(slots)))
        assert not any(a[SHIFTED].any() for a in after), period


def test_shifts_and_cycles_alike_offline_in_shards_and_through_pending_slots() -> None:
    """The shift states, the loads' harmonic sums (model.usage_cycle) beside them and the fleet's recent falls, the same
    in one history, joined from three shards and offline."""
    events, status, history, model = scored_log(SIM)
    stages = TorchStages(model, history.index)
    config = replace(SMALL.evidence, shifts=True, cycles=True, fall_credit=True)
    whole = DeviceHistory(config)
    shards = [DeviceHistory(config) for _ in range(3)]
    keys, ids, times, values = status_arrays(status)
    whole.add_status(keys, ids, times, values)
    for k, shard in enumerate(shards):
        mine = shard_of(keys, 3) == k
        shard.add_status(keys[mine], ids[mine], times[mine], values[mine])
    slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
    for slot in range(SIM.slots):
        part = slot_part(stages, events.filter(slot_of == slot), slot)
        whole.add_part(part)
        for k, shard in enumerate(shards):
            shard.add_part(part.select(k, 3))
        if slot == 6:  # slots up to 6 final; the later ones pending, watched on where a frame is made
            for target in [whole, *shards]:
                target.fold(6)
    last = SIM.slots - 1
    one = whole.frame(stages, last, RankingConfig())
    joined = DeviceFrame.concat([s.frame(stages, last, RankingConfig()) for s in shards])
    np.testing.assert_allclose(one.shifted, joined.shifted, rtol=1e-9, atol=1e-12)
    rows = history.index.lookup(pa.array(one.ids.tolist()))
    offline = history.tracks(config)[SHIFTED].query(rows, last - history.first_slot)[0]
    np.testing.assert_allclose(one.shifted, offline, rtol=1e-9, atol=1e-12)
    assert (one.shifted[:, -1, 0] > 0).sum() >= 3  # the changing devices' loads drift by 0.25 within these slots
    assert set(SUMMED_ROLES).isdisjoint(SHIFT_ROLES)
    np.testing.assert_allclose(one.cycle, joined.cycle, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(one.cycle, history.tracks(config)[CYCLE].query(rows, last - history.first_slot)[0],
                               rtol=1e-9, atol=1e-12)
    assert one.cycle.shape == (len(one.keys), 1, channels_of(CYCLE)) and (one.cycle[:, 0, 0] > 0).all()
    pools = []
    for slot in range(7, SIM.slots):  # the fleet's recent falls (model.evidence.fall_pool), pooled alike
        pool = whole.frame(stages, slot, RankingConfig()).falls
        np.testing.assert_allclose(DeviceFrame.concat([s.frame(stages, slot, RankingConfig()) for s in shards]).falls,
                                   pool, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(history.falls(config, slot - history.first_slot), pool, rtol=1e-9, atol=1e-12)
        pools.append(pool)
    assert min(pool[:, 0].sum() for pool in pools) > 0  # falls with tasks since, each slot


def test_shift_states_and_cycles_survive_a_snapshot_and_a_reshard(tmp_path) -> None:
    events, status, history, model = scored_log(SIM)
    stages = TorchStages(model, history.index)
    config = replace(SMALL.evidence, shifts=True, cycles=True)
    whole = DeviceHistory(config)
    whole.add_status(*status_arrays(status))
    slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
    parts = [slot_part(stages, events.filter(slot_of == slot), slot) for slot in range(SIM.slots)]
    for part in parts[:9]:
        whole.add_part(part)
    whole.fold(8)
    assert len(whole.evidence[SHIFTED]) >= 1 and len(whole.evidence[SHIFT_OPEN]) >= 1  # a shift, and sides open
    EvidenceSnapshot(whole.folded_through, whole.evidence).save(tmp_path / "evidence.npz")
    merged = EvidenceSnapshot.merge([EvidenceSnapshot.load(tmp_path / "evidence.npz").select(k, 3) for k in range(3)])
    for role in (*SHIFT_ROLES, CYCLE):
        for name in ("keys", "slots", "values"):
            np.testing.assert_array_equal(getattr(merged.states[role], name), getattr(whole.evidence[role], name))
    resumed = DeviceHistory(config)  # a job restarted from the snapshot goes on watching where the first one was
    resumed.seed(merged)
    resumed.add_status(*status_arrays(status))
    for target in (whole, resumed):
        for part in parts[9:]:
            target.add_part(part)
    last = SIM.slots - 1
    frame, again = (target.frame(stages, last, RankingConfig()) for target in (whole, resumed))
    shifted = frame.shifted
    np.testing.assert_array_equal(again.shifted, shifted)
    np.testing.assert_array_equal(again.cycle, frame.cycle)
    assert (shifted[:, -1, 0] > 0).sum() > len(whole.evidence[SHIFTED])  # devices that shifted after the snapshot


def test_a_negative_fall_earned_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"EvidenceConfig.fall_earned \(--fall-earned\): must be >= 0 \(got -1.0\)"):
        EvidenceConfig(fall_earned=-1.0)
