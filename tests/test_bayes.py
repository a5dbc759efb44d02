"""The Bayes filter: posteriors against hand-computed ones, owner-level inference for selective devices, time
structure for on-off devices, and its place as the floor of the rules' error on a simulated run."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from scipy.special import logsumexp

from model.baselines import RULES, predict_edges
from model.config import TrustWeights
from model.evaluate import truth_for
from model.graphs import DeviceIndex
from model.history import History
from model.targets import targets
from model.train import time_split
from simulator.bayes import BayesFilter, Grid, Revealed, Tasks, _by_class, hypotheses, midpoints
from simulator.behaviour import HIGH, PERIOD, BehaviourParams
from simulator.config import Behaviour, SimConfig, parse_attack
from simulator.experiment import simulated_run
from simulator.world import World


def filter_for(mix: dict[Behaviour, float], grid: Grid = Grid(), slots: int = 50) -> BayesFilter:
    config = SimConfig(devices=20, tasks=200, slots=slots, mix=mix)
    events, _, _ = simulated_run(config)
    return BayesFilter(World(config), events, grid)


def test_stable_posterior_mean_by_hand() -> None:
    bayes = filter_for({Behaviour.STABLE_RELIABLE: 1.0}, Grid(stable_levels=4))
    levels = midpoints(HIGH, 4)
    com = np.array([True, True, False, True])
    tasks = Tasks(np.array([1, 2, 2, 5]), np.array([3, 3, 4, 4]), com, np.ones(4))
    weights = np.prod(np.where(com[None, :], levels[:, None], 1 - levels[:, None]), axis=1)
    want = (weights * levels).sum() / weights.sum()
    got = bayes.expected_behaviour(tasks, np.array([7, 7]), np.array([9, 2]))
    assert got[0] == pytest.approx(want)
    # at slot 2 only the task of slot 1 (a success) counts: the slot's own tasks come after the forecast
    assert got[1] == pytest.approx((levels * levels).sum() / levels.sum())


def test_without_tasks_the_forecast_is_the_prior_mean() -> None:
    bayes = filter_for({Behaviour.STABLE_RELIABLE: 0.5, Behaviour.STABLE_UNRELIABLE: 0.5})
    empty = Tasks(*(np.zeros(0, t) for t in (np.int64, np.int64, bool, np.float64)))
    got = bayes.expected_behaviour(empty, np.array([0]), np.array([10]))
    assert got[0] == pytest.approx((np.mean(HIGH) + np.mean((0.05, 0.4))) / 2)


def test_selective_devices_are_judged_per_owner() -> None:
    bayes = filter_for({Behaviour.SELECTIVE: 1.0})
    slots = np.arange(1, 21)
    owner = np.where(slots % 2 == 0, 1, 2)
    com = owner == 2  # owner 1 always failed, owner 2 always succeeded
    tasks = Tasks(slots, owner, com, np.ones(len(slots)))
    toward_bad, toward_good, stranger = bayes.expected_behaviour(tasks, np.array([1, 2, 3]), np.full(3, 30))
    assert toward_bad < 0.4 < 0.85 < toward_good
    # an owner never seen: the prior share of targeted owners (0.3) at the levels the others revealed
    assert toward_bad < stranger < toward_good
    assert stranger == pytest.approx(0.3 * toward_bad + 0.7 * toward_good, abs=0.05)


def test_an_on_off_device_is_tracked_through_its_cycle() -> None:
    bayes = filter_for({Behaviour.INTERMITTENT: 1.0})
    truth = BehaviourParams(*(np.array([v]) for v in (int(Behaviour.INTERMITTENT), 0.95, 0.1, 0, 1, 10, 5, 3, 10,
                                                       0)))
    rng = np.random.default_rng(0)
    slots = np.repeat(np.arange(60), 6)
    com = rng.random(len(slots)) < truth.reliability(slots, False)
    tasks = Tasks(slots, np.zeros(len(slots), np.int64), com, np.ones(len(slots)))
    ahead = np.arange(60, 75)
    got = bayes.expected_behaviour(tasks, np.zeros(len(ahead), np.int64), ahead)
    want = truth.reliability(ahead, False)
    assert np.abs(got - want).max() < 0.15  # the phase and the cycle are pinned down by 60 slots of outcomes


def test_hypotheses_weigh_classes_by_the_mix() -> None:
    h = hypotheses({Behaviour.STABLE_RELIABLE: 3.0, Behaviour.PERIODIC: 1.0}, slots=100)
    assert np.exp(h.log_prior).sum() == pytest.approx(1.0)
    periodic = h.params.kind == int(Behaviour.PERIODIC)
    assert np.exp(h.log_prior[periodic]).sum() == pytest.approx(0.25) and not len(h.selective_high)


@pytest.mark.parametrize("tied", [False, True])
def test_the_grid_a_class_at_a_time_equals_each_entry_alone_and_all_at_once(tied: bool) -> None:
    column = hypotheses(SimConfig().behaviour_mix, 60, Grid(levels=2, stable_levels=3, starts=3, spans=2, periods=3,
                                                              phases=2)).params.column()
    slots = np.arange(60)[None, :]
    by_class = _by_class(column, slots, tied)  # (H, 60)
    assert by_class.shape == (len(column.kind), 60) and len(np.unique(column.kind)) == 6
    assert np.array_equal(by_class, column.reliability(slots, False, tied))  # every class's curve, selected per entry
    for row in range(0, len(column.kind), 89):
        assert np.array_equal(by_class[row], column.take(slice(row, row + 1)).reliability(slots, False, tied)[0])


def test_the_filter_is_the_floor_of_the_rules_error() -> None:
    config = SimConfig(devices=120, tasks=6000, slots=40, seed=11)
    events, truth, status = simulated_run(config)
    world = World(config)
    history = History.from_events(events, config.clock, TrustWeights(), index=DeviceIndex(tuple(world.ids.to_pylist())),
                                  first_slot=0, status=status)
    train_slots, test_slots = time_split(history, 0.2)
    query = targets(history, test_slots).query
    hidden = truth_for(history, test_slots, truth)
    bayes = BayesFilter(world, events).forecast(query.src, query.dst, query.end + 1)
    assert np.all((bayes >= 0) & (bayes <= 1))
    errors = {"bayes": np.sqrt(np.mean((bayes - hidden) ** 2))}
    for rule in ("channel_beta", "qs_trust", "mean"):
        errors[rule] = np.sqrt(np.mean((predict_edges(RULES[rule](history, train_slots), history, test_slots)
                                        - hidden) ** 2))
    assert errors["bayes"] < min(v for k, v in errors.items() if k != "bayes"), errors


@pytest.mark.parametrize("telemetry", [False, True])
def test_forecasts_slot_after_slot_go_on_from_the_sums_before_and_equal_fresh_ones(telemetry: bool) -> None:
    """A selection experiment asks the filter one slot at a time: each forecast goes on from the collaborator's
    sums of the forecast before and is the same, to the last bit, as a fresh filter's; asked out of order (an
    earlier slot, then all at once) it starts over where it must."""
    config = SimConfig(devices=40, tasks=1500, slots=30, seed=5, telemetry=telemetry,
                       mix={Behaviour.SELECTIVE: 0.5, Behaviour.INTERMITTENT: 0.3, Behaviour.DEGRADING: 0.2})
    events, _, _ = simulated_run(config)
    world = World(config)
    going_on = BayesFilter(world, events)
    rng = np.random.default_rng(0)
    owners, collabs = rng.integers(0, 40, 60), rng.integers(0, 40, 60)
    for slot in (12, 12, 17, 25, 14):
        at = np.full(len(owners), slot)
        np.testing.assert_array_equal(going_on.forecast(owners, collabs, at),
                                      BayesFilter(world, events).forecast(owners, collabs, at))
    many = rng.integers(1, 30, 60)
    np.testing.assert_array_equal(going_on.forecast(owners, collabs, many),
                                  BayesFilter(world, events).forecast(owners, collabs, many))
    busy = max(going_on.counted, key=lambda c: going_on.counted[c].tasks)
    assert going_on.counted[busy].tasks > 0 and going_on.counted[busy].log_likelihood.shape == \
        going_on.device_hypotheses(busy).log_prior.shape


def test_with_telemetry_the_reports_reveal_cycles_and_changes() -> None:
    config = SimConfig(devices=120, tasks=6000, slots=40, seed=11, telemetry=True)
    events, truth, status = simulated_run(config)
    world = World(config)
    bayes = BayesFilter(world, events)
    changing = int(np.flatnonzero(world.behaviour == Behaviour.DEGRADING)[0])
    steady = int(np.flatnonzero(world.behaviour == Behaviour.STABLE_RELIABLE)[0])
    allowed = {device: {int(k) for k in bayes.device_hypotheses(device).params.kind[
        np.isfinite(bayes.device_hypotheses(device).log_prior)]} for device in (changing, steady)}
    assert allowed[changing] == {int(Behaviour.DEGRADING)}  # its load drifts: nothing else is possible
    assert int(Behaviour.DEGRADING) not in allowed[steady] and int(Behaviour.PERIODIC) in allowed[steady]
    history = History.from_events(events, config.clock, TrustWeights(), index=DeviceIndex(tuple(world.ids.to_pylist())),
                                  first_slot=0, status=status)
    train_slots, test_slots = time_split(history, 0.2)
    query = targets(history, test_slots).query
    hidden = truth_for(history, test_slots, truth)
    forecast = bayes.forecast(query.src, query.dst, query.end + 1)
    rule = predict_edges(RULES["channel_beta"](history, train_slots), history, test_slots)
    assert np.sqrt(np.mean((forecast - hidden) ** 2)) < 0.85 * np.sqrt(np.mean((rule - hidden) ** 2))


def test_cycles_and_changes_are_read_from_the_loads_reported_before_a_slot() -> None:
    """Each device's cycle fitted to the loads it reported (the cycle plus a slot's noise, and a changing device's
    drift) is its own within a few hundredths of the period's range; a changing device's loads make its own change
    (its class, about its start) far likelier than none, a steady device's make no change likelier than any; the
    loads of slots from ``fitted_before`` on are not read; and the filter reading all this forecasts about as well
    as the one handed the truth."""
    config = SimConfig(devices=60, tasks=3000, slots=60, seed=12, telemetry=True)
    events, truth, status = simulated_run(config)
    world = World(config)
    read = Revealed.fitted(world, status, 50)
    assert np.median(np.abs(read.period - world.params.period)) < 1.0  # slots, of a range of 8-40
    assert np.median(np.abs(np.angle(np.exp(1j * (read.phase - world.params.phase))))) < 0.3  # radians
    misread = []
    for device in range(world.size):
        kind, start, _, weight = read.changes[device]
        likeliest = int(np.argmax(weight))
        if world.behaviour[device] in (Behaviour.DEGRADING, Behaviour.RECOVERING):
            assert kind[likeliest] == world.behaviour[device] and weight[likeliest] > 10
            misread.append(abs(start[likeliest] - world.params.start[device]))
        else:
            assert logsumexp(weight) < 0
    assert np.median(misread) < 3  # slots
    later = status.filter(pc.greater_equal(status["time_ms"], int(config.clock.start_ms(50))))
    noised = pa.concat_tables([status.filter(pc.less(status["time_ms"], int(config.clock.start_ms(50)))),
                               later.set_column(later.schema.get_field_index("cpu_load"), "cpu_load",
                                                pa.array(np.ones(later.num_rows)))])
    np.testing.assert_array_equal(Revealed.fitted(world, noised, 50).period, read.period)
    unheard = Revealed.fitted(world, status.slice(0, 0), 50)
    assert np.all(unheard.period == np.mean(PERIOD)) and not unheard.phase.any()  # the prior's mean, phase 0
    history = History.from_events(events, config.clock, TrustWeights(), index=DeviceIndex(tuple(world.ids.to_pylist())),
                                  first_slot=0, status=status)
    query = targets(history, list(range(50, 60))).query
    hidden = truth_for(history, list(range(50, 60)), truth)
    exact = BayesFilter(world, events).forecast(query.src, query.dst, query.end + 1)
    fitted = BayesFilter(world, events, status=status, fitted_before=50).forecast(query.src, query.dst, query.end + 1)
    assert not np.array_equal(fitted, exact)
    rmse = [float(np.sqrt(np.mean((f - hidden) ** 2))) for f in (exact, fitted)]
    assert rmse[1] < 1.1 * rmse[0]


def test_the_filter_knows_an_attacks_share_of_the_behaviours() -> None:
    config = SimConfig(devices=100, attack=parse_attack("on-off=0.2"))
    mix = config.behaviour_mix
    assert sum(mix.values()) == pytest.approx(1.0)
    assert mix[Behaviour.INTERMITTENT] == pytest.approx(0.8 * 0.1 + 0.2)  # the mix's on-off devices and the attackers
    assert mix[Behaviour.STABLE_RELIABLE] == pytest.approx(0.8 * 0.4)
    assert SimConfig().behaviour_mix[Behaviour.INTERMITTENT] == pytest.approx(0.1)  # no attack: the mix itself
    small = replace(config, devices=20, tasks=200, slots=10)
    h = BayesFilter(World(small), simulated_run(small)[0]).hypotheses
    intermittent = h.params.kind == int(Behaviour.INTERMITTENT)
    assert np.exp(h.log_prior[intermittent]).sum() == pytest.approx(0.28)
