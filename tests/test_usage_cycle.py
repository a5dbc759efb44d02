"""A device's usage cycle from its reported loads (model.usage_cycle): the fit's forecast of a wave by hand, noise left
out, too few reports read as none, the phase the same wherever the slots start; each task counted where the cycle
stood, and what the head reads of it (model.evidence.cycle_block)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from model.evidence import (COM, CK, CYCLE_RIDGE, CZ, TK, TON, TZ, TZZ, EvidenceConfig, channels_of, cycle_block,
                            empty_state, with_status)
from model.usage_cycle import CYCLE, CYCLE_SCALE, FREQUENCIES, MIN_SLOTS, cycle_deviation, cycle_increments

PERIODS = [1 / FREQUENCIES[0], 1 / FREQUENCIES[6], 1 / FREQUENCIES[-1], 17.3]  # on the grid, and one between


def summed(loads: np.ndarray, first_slot: int = 0) -> np.ndarray:
    """Devices' loads (n, T) over slots first_slot .. first_slot + T - 1 (NaN: none reported) summed into a CYCLE
    state as the history and the shards sum them; the sums (n, 1, C) at the last slot."""
    state = empty_state(CYCLE, ())
    keys = np.arange(len(loads))
    for t in range(loads.shape[1]):
        reported, increments = cycle_increments(keys, loads[:, t], first_slot + t)
        state.update(reported, first_slot + t, increments)
    return state.query(keys, first_slot + loads.shape[1] - 1)[0]


@pytest.mark.parametrize("period", PERIODS)
def test_a_cycling_load_is_forecast_a_slot_ahead(period: float) -> None:
    """A load 0.3 + 0.12 sin(2 pi t / period + phase) reported for 80 slots: the next slot's deviation from 0.3 is
    forecast within 0.01 of the load (0.08 read) where the period is on the fit's grid, within 0.03 between."""
    slots = np.arange(81)
    phase = np.array([[0.0], [1.0], [2.5], [4.0]])
    loads = 0.3 + 0.12 * np.sin(2 * np.pi * slots / period + phase)  # (4, 81)
    read = cycle_deviation(summed(loads[:, :80]), 80)
    on_grid = np.isclose(FREQUENCIES, 1 / period).any()
    np.testing.assert_allclose(read / CYCLE_SCALE, loads[:, 80] - 0.3, atol=0.01 if on_grid else 0.03)


def test_the_slot_s_noise_is_left_out_of_the_forecast() -> None:
    """With noise of half the cycle's swing in every report, the fit forecasts the cycle's next value better than
    the last report tells it: over 200 devices, half the error or less."""
    rng = np.random.default_rng(3)
    n, slots = 200, np.arange(61)
    period, phase = rng.uniform(8, 40, (n, 1)), rng.uniform(0, 2 * np.pi, (n, 1))
    cycle = 0.12 * np.sin(2 * np.pi * slots / period + phase)
    loads = 0.3 + cycle + rng.uniform(-0.08, 0.08, cycle.shape)
    forecast = cycle_deviation(summed(loads[:, :60]), 60) / CYCLE_SCALE
    fit_error = np.sqrt(np.mean((forecast - cycle[:, 60]) ** 2))
    last_error = np.sqrt(np.mean((loads[:, 59] - 0.3 - cycle[:, 60]) ** 2))
    assert fit_error < 0.5 * last_error


def test_the_phase_is_the_same_wherever_the_slots_start() -> None:
    """The sums are of absolute slots: the same loads from slot 10,000,000 on forecast the same deviation."""
    slots = np.arange(41)
    loads = 0.3 + 0.1 * np.cos(2 * np.pi * slots[None, :] / np.array([[12.0], [30.0]]))
    np.testing.assert_allclose(cycle_deviation(summed(loads[:, :40], 10 ** 7), 10 ** 7 + 40),
                               cycle_deviation(summed(loads[:, :40]), 40), atol=1e-6)


def test_too_few_reports_read_as_no_cycle() -> None:
    """Below MIN_SLOTS forgetting-weighted reports (and for a device that never reported) the deviation is 0;
    from there on it is read; a missing report leaves the sums as they were, decayed."""
    loads = np.full((2, 12), np.nan)
    loads[0] = 0.3 + 0.1 * np.sin(np.arange(12))
    sums = summed(loads)
    assert sums[0, 0, 0] >= MIN_SLOTS and sums[1].sum() == 0
    read = cycle_deviation(sums, 12)
    assert read[0] != 0 and read[1] == 0
    assert cycle_deviation(summed(loads[:, :4]), 4)[0] == 0
    assert channels_of(CYCLE) == sums.shape[-1]


def test_the_head_reads_the_rate_at_the_load_the_cycle_brings() -> None:
    """cycle_block, by hand: a device whose 10 tasks where its cycle stood at z = -1 all succeeded and 10 at z = +1 all
    failed; the line of its rate on z through (11/22 at z's mean 0) with slope -10 / (20 + CYCLE_RIDGE * 20), read at
    the next slot's z = 0.8; a device that served nothing reads 1/2 and no slope; zeros without a cycle."""
    c = np.zeros((2, 2, channels_of("collaborator")))
    c[0, :, [TK, CK, TZ, CZ, TZZ]] = np.array([20.0, 10.0, 0.0, -10.0, 20.0])[:, None]
    deviation = np.array([0.8, 0.8])
    z, rate, slope = cycle_block(c, deviation)
    by_hand = -10.0 / (20.0 + CYCLE_RIDGE * 20.0)
    np.testing.assert_allclose(z[:, 0], deviation)
    np.testing.assert_allclose(rate[0], 11.0 / 22.0 + by_hand * 0.8)
    np.testing.assert_allclose(slope[0], by_hand / 2.0)
    np.testing.assert_allclose(rate[1], 0.5)
    assert not slope[1].any()
    assert all(not part.any() for part in cycle_block(c, None))
    config = EvidenceConfig(lams=(0.9, 1.0), level_memory=0.9)
    assert replace(config, cycles=True).features == config.features + 2 * len(config.lams) + 1


def test_with_status_counts_each_task_where_the_cycle_stood() -> None:
    """with_status fills ton z, com z and ton z^2 from the collaborator's cycle in the task's slot, zero where its load
    is unknown or no cycle is given."""
    increments = np.zeros((3, channels_of("collaborator")))
    increments[:, TON], increments[:, COM] = [0.9, 0.5, 1.0], [1.0, 0.0, 1.0]
    out = with_status(increments, np.array([0.3, 0.4, np.nan]), np.full(3, 1e9), np.array([-0.5, 1.2, 0.7]))
    np.testing.assert_allclose(out[:, [TZ, CZ, TZZ]], [[-0.45, -0.5, 0.225], [0.6, 0.0, 0.72], [0.0, 0.0, 0.0]])
    assert not with_status(increments, np.array([0.3, 0.4, 0.5]), np.full(3, 1e9))[:, [TZ, CZ, TZZ]].any()
