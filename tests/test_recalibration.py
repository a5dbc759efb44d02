"""The online level shift (model.recalibration) against hand-computed values, its guard and its causality."""

import numpy as np
import pytest

from model.recalibration import LevelShift, OnlineShift, RecalibrationConfig, replayed_shifts


def test_level_shift_by_hand() -> None:
    state = LevelShift(RecalibrationConfig(memory=0.5, guard=0.0))
    assert state.shift == 0.0  # nothing published yet
    state.update(np.array([0.5, 0.5]), np.array([0.7, 0.9]), np.array([1.0, 1.0]))  # residuals 0.2, 0.4
    assert state.shift == pytest.approx(0.3)
    state.update(np.array([0.5]), np.array([0.5]), np.array([2.0]))  # (0.5 * 0.6 + 0) / (0.5 * 2 + 2)
    assert state.shift == pytest.approx(0.1)
    assert state.apply(np.array([0.95, 0.2])).tolist() == pytest.approx([1.0, 0.3])  # clipped to [0, 1]


def test_guard_shrinks_by_the_standard_error_by_hand() -> None:
    state = LevelShift(RecalibrationConfig(memory=0.5, guard=2.0))
    state.update(np.array([0.5, 0.5]), np.array([0.7, 0.9]), np.array([1.0, 1.0]))
    # mean 0.3, variance 0.2 / 2 - 0.09 = 0.01, n_eff = 2, se^2 = 0.005: 0.3 * (1 - 4 * 0.005 / 0.09)
    assert state.shift == pytest.approx(0.3 * (1 - 4 * 0.005 / 0.09))


def test_noise_moves_nothing_and_drift_is_followed() -> None:
    still = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        noise, drift = LevelShift(RecalibrationConfig()), LevelShift(RecalibrationConfig())
        for _ in range(10):
            forecast = rng.uniform(0.2, 0.8, 200)
            outcome = forecast + rng.normal(0.0, 0.1, 200)
            noise.update(forecast, outcome, np.ones(200))
            drift.update(forecast, outcome + 0.05, np.ones(200))
        still += noise.shift == 0.0
        assert abs(noise.shift) < 0.01 and drift.shift == pytest.approx(0.05, abs=0.01)
    assert still >= 15  # a zero-mean residual stays within two standard errors of zero most of the time


def test_replayed_shifts_see_only_earlier_slots() -> None:
    rng = np.random.default_rng(0)
    slot = np.repeat(np.arange(5), 30)
    forecast, outcome, tasks = rng.uniform(0, 1, 150), rng.uniform(0, 1, 150) + 0.3, rng.integers(1, 4, 150)
    config = RecalibrationConfig(guard=0.0)
    shifts = replayed_shifts(forecast, outcome, tasks, slot, config)
    assert np.all(shifts[slot == 0] == 0.0)  # the first slot has nothing to learn from
    assert all(len(np.unique(shifts[slot == s])) == 1 for s in range(5))  # one shift per slot
    state = LevelShift(config)
    for s in range(3):
        state.update(forecast[slot == s], outcome[slot == s], tasks[slot == s])
    assert shifts[slot == 3][0] == pytest.approx(state.shift)
    changed = outcome.copy()
    changed[slot == 4] = 0.0  # the last slot's outcomes shift nothing already published
    assert np.array_equal(replayed_shifts(forecast, changed, tasks, slot, config), shifts)


@pytest.mark.parametrize("kwargs, message", [({"memory": 1.0}, "memory: must be in [0, 1) (got 1.0)"),
                                             ({"guard": -1.0}, "guard: must be >= 0 (got -1.0)")])
def test_config_refuses_bad_values_by_name(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        RecalibrationConfig(**kwargs)


def test_online_shift_sets_outcomes_against_the_last_published_forecasts_by_hand(tmp_path) -> None:
    online = OnlineShift.start(RecalibrationConfig(memory=0.5, guard=0.0))
    assert online.advance(0, np.array([7]), np.array([0.9]), np.array([1.0])) == 0.0  # nothing forecast yet
    online.remember(0, np.array([9, 5, 7]), np.array([0.1, 0.5, 0.6]))
    # pairs 5 and 7 were forecast (0.5, 0.6); pair 4 was not and moves nothing: (1 * 0.2 + 3 * 0.1) / 4
    shift = online.advance(1, np.array([5, 4, 7]), np.array([0.7, 0.0, 0.7]), np.array([1.0, 5.0, 3.0]))
    assert shift == pytest.approx(0.125)
    with pytest.raises(ValueError, match="slot 1 is not after the last published slot 1"):
        online.remember(1, np.array([5]), np.array([0.5]))
        online.advance(1, np.array([5]), np.array([0.5]), np.array([1.0]))
    online.save(tmp_path / "online.npz")
    back = OnlineShift.load(tmp_path / "online.npz", RecalibrationConfig(memory=0.5, guard=0.0))
    assert (back.slot, back.level, back.pairs.tolist(), back.forecasts.tolist()) == \
        (online.slot, online.level, online.pairs.tolist(), online.forecasts.tolist())
    assert OnlineShift.start(None) is None  # recalibration off


def test_what_an_owner_reported_weighs_by_its_credibility_in_the_shift() -> None:
    online = OnlineShift.start(RecalibrationConfig(memory=0.5, guard=0.0))
    online.remember(0, np.array([9, 5, 7]), np.array([0.1, 0.5, 0.6]), believed=np.array([1.0, 0.0, 0.5]))
    # pair 5's owner is not believed and reported all of its outcome: nothing; pair 7's half-believed owner reported
    # half of its: 3 tasks x (1 - 0.5 x 0.5) = 2.25 of weight on its residual 0.1
    shift = online.advance(1, np.array([5, 7]), np.array([0.9, 0.7]), np.array([1.0, 3.0]),
                           reported=np.array([1.0, 0.5]))
    assert shift == pytest.approx(0.1)
    online.remember(1, np.array([5]), np.array([0.5]))  # believed by default
    assert online.advance(2, np.array([5]), np.array([0.9]), np.array([2.0]), reported=np.array([1.0])) > 0.1


def test_online_shift_replays_like_evaluate_when_every_edge_was_forecast() -> None:
    rng = np.random.default_rng(1)
    slot = np.repeat(np.arange(6), 40)
    pairs = np.tile(np.arange(40), 6)  # the same pairs every slot, each forecast the slot before
    forecast, outcome, tasks = rng.uniform(0, 1, 240), rng.uniform(0, 1, 240) + 0.2, rng.integers(1, 4, 240)
    config = RecalibrationConfig(guard=0.5)
    online, shifts = OnlineShift.start(config), []
    for s in range(6):  # slot s's forecasts are published at s - 1: remembered before s's outcomes come
        if s:
            shifts.append(online.advance(s - 1, pairs[slot == s - 1], outcome[slot == s - 1], tasks[slot == s - 1]))
        online.remember(s - 1, pairs[slot == s], forecast[slot == s])
    replayed = replayed_shifts(forecast, outcome, tasks, slot, config)
    assert shifts == pytest.approx([replayed[slot == s][0] for s in range(1, 6)])


def test_replayed_shifts_fitted_on_the_forecast_pairs_equal_the_publishers() -> None:
    """The publisher forecasts some pairs only (the recent owners'): a replay fitted on those edges alone gives
    its shifts, and a slot none of whose edges was forecast ages nothing."""
    rng = np.random.default_rng(2)
    slot = np.repeat(np.arange(7), 40)
    pairs = np.tile(np.arange(40), 7)
    forecast, outcome, tasks = rng.uniform(0, 1, 280), rng.uniform(0, 1, 280) + 0.2, rng.integers(1, 4, 280)
    published = (pairs % 3 == 0) & (slot != 4)  # a third of the pairs, and none in slot 4
    config = RecalibrationConfig(memory=0.8, guard=0.5)
    online, shifts = OnlineShift.start(config), []
    for s in range(7):
        if s:
            shifts.append(online.advance(s - 1, pairs[slot == s - 1], outcome[slot == s - 1], tasks[slot == s - 1]))
        online.remember(s - 1, pairs[(slot == s) & published], forecast[(slot == s) & published])
    replayed = replayed_shifts(forecast, outcome, tasks, slot, config, fitted=published)
    assert shifts == pytest.approx([replayed[slot == s][0] for s in range(1, 7)])
    assert replayed[slot == 5][0] == replayed[slot == 4][0]  # slot 4 refit nothing and aged nothing
    everything = replayed_shifts(forecast, outcome, tasks, slot, config)
    assert not np.allclose(replayed, everything)  # fewer edges: other shifts
