"""The paper's experiments on simulated runs (a run in memory, and the evaluation of every method on it), and on
recorded logs with attacks injected.

The simulator sits above ``model``: it takes the physics from there, and hands its runs, with what only a
simulation has (the hidden truth, the world for the selection experiment), to :mod:`model.evaluate`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np
import pyarrow as pa

from model.bm import BMConfig
from model.evaluate import RunOutput, Simulated, evaluate_run
from model.graphs import DeviceIndex
from model.history import History
from model.manipulation import injection_measures
from model.targets import targets
from model.train import TrainConfig, time_split
from model.voc import Scorer
from simulator.bayes import BayesFilter
from simulator.config import Attack, SimConfig
from simulator.engine import MemorySink, Simulator
from simulator.inject import inject
from simulator.world import World


def simulated_world(sim_config: SimConfig) -> tuple[pa.Table, pa.Table, pa.Table, World]:
    """(events, truth, status) of a simulated run, in memory, and its world as the run left it (whitewashers'
    ids joined and left where they did)."""
    memory, simulator = MemorySink(), Simulator(sim_config)
    simulator.run([memory])
    return memory["events"], memory["truth"], memory["status"], simulator.world


def simulated_run(sim_config: SimConfig) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(events, truth, status) of a simulated run, in memory."""
    return simulated_world(sim_config)[:3]


def bayes_reference(world: World, events: pa.Table, status: pa.Table, history: History, train: TrainConfig
                    ) -> tuple[np.ndarray, Scorer]:
    """The Bayes filter's forecast of every test edge (in :func:`model.targets.targets` order), and its scorer of any
    pairs (what it would select: the ceiling of what attackers can be denied from the log); with telemetry, each
    device's usage cycle read from the loads it reported before the test period
    (:func:`simulator.bayes.fitted_cycles`)."""
    _, test_slots = time_split(history, train.test_fraction)
    query = targets(history, test_slots).query
    bayes = BayesFilter(world, events, status=status, fitted_before=history.first_slot + test_slots[0])

    def score(src: np.ndarray, dst: np.ndarray, end: int, profile: np.ndarray) -> np.ndarray:
        return bayes.forecast(src, dst, np.full(len(src), history.first_slot + end + 1))

    return bayes.forecast(query.src, query.dst, history.first_slot + query.end + 1), score


def evaluate_simulated(sim_config: SimConfig, config: BMConfig, train: TrainConfig, runs: int, methods: list[str],
                       progress: Callable[[str], None] = lambda _: None, voc: bool = True,
                       each_run: Callable[[list[RunOutput]], None] = lambda _: None) -> list[RunOutput]:
    """Every method on ``runs`` simulated runs (seeds ``sim_config.seed`` + 0, 1, ...), one result per run;
    ``each_run`` sees the results so far after each run (a long evaluation keeps what it finished)."""
    results = []
    for run in range(runs):
        run_config = replace(sim_config, seed=sim_config.seed + run)
        events, truth, status, world = simulated_world(run_config)
        # every simulated device has a row (in the world's order), and slot 0 is the clock's first slot
        history = History.from_events(events, sim_config.clock, config.weights,
                                      index=DeviceIndex(tuple(world.ids.to_pylist())), first_slot=0, status=status)
        behaviour = world.devices_table()["behaviour"].to_numpy(zero_copy_only=False)
        references: dict[str, np.ndarray] = {}
        reference_scorers: dict[str, Scorer] = {}
        if "bayes" in methods:
            references["bayes"], reference_scorers["bayes"] = bayes_reference(world, events, status, history, train)
        results.append(evaluate_run(history, replace(config, clock=sim_config.clock),
                                    replace(train, seed=train.seed + run), methods,
                                    Simulated(truth, world, events, behaviour), voc, references, reference_scorers))
        progress(f"run {run + 1}/{runs} done")
        each_run(results)
    return results


def evaluate_injected(events: pa.Table, attack: Attack, config: BMConfig, train: TrainConfig, runs: int,
                      methods: list[str], progress: Callable[[str], None] = lambda _: None,
                      each_run: Callable[[list[RunOutput]], None] = lambda _: None) -> list[RunOutput]:
    """Every method on a recorded log with ``attack`` injected (:mod:`simulator.inject`, drawn with ``train.seed``) and
    on its clean twin, ``runs`` training seeds: the attacked runs' figures, each method's with what the attack moved
    (:func:`model.manipulation.injection_measures`)."""
    injected = inject(events, attack, train.seed)
    index = DeviceIndex.from_edges(injected.clean, injected.attacked)  # the twins' devices, fresh ids among them
    clean = History.from_events(injected.clean, config.clock, config.weights, index=index)
    attacked = History.from_events(injected.attacked, config.clock, config.weights, index=index,
                                   first_slot=clean.first_slot)
    results = []
    for run in range(runs):
        seeded = replace(train, seed=train.seed + run)
        twin, result = (evaluate_run(history, config, seeded, methods) for history in (clean, attacked))
        forecasts = [name for name in result.scores if name in result.predictions.column_names]
        for method, measures in injection_measures(twin.predictions, result.predictions, injected.attackers,
                                                   injected.victims, forecasts, injected.alias).items():
            result.scores[method].update(measures)
        results.append(result)
        progress(f"run {run + 1}/{runs} done")
        each_run(results)
    return results
