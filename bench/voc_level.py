"""VoC vs θ when only the level of T moves: BM's T_beh scaled by constants, against the rules.

The paper's selection rule takes the best VoC among candidates with T ≥ θ, and a task with no such
candidate scores 0. A constant factor on T_beh keeps every candidate's rank, so whatever it changes in
the achieved VoC comes from the level of T, not from how good the trust is. Trains BM once on one
simulated run (the paper's default setting), then scores every arm with the same draws. Run:
``python -m bench.voc_level [--seed 0] [--scales 0.85 0.9 0.95] [--epochs 12]``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from bench.report import emit
from model.baselines import RULES
from model.bm import BMConfig
from model.evaluate import learned_scorer, online_scorer
from model.graphs import DeviceIndex
from model.history import History
from model.train import TrainConfig, time_split, train_bm
from model.voc import THETAS, Scorer, scored_tasks, voc_curves
from simulator.config import SimConfig
from simulator.experiment import simulated_run
from simulator.world import World

RIVALS = ("qs_trust", "channel_beta")


def scaled(scorer: Scorer, factor: float) -> Scorer:
    """The same scorer with T_beh multiplied by ``factor`` (clipped to [0, 1]): same ranking, another level."""
    return lambda *query: np.clip(factor * scorer(*query), 0.0, 1.0)


def measure(sim: SimConfig, config: BMConfig, train: TrainConfig, scales: list[float]) -> tuple[list[dict], float]:
    """(a row per arm: its VoC at each θ, and the mean T_beh it gave), BM's training seconds."""
    events, _, status = simulated_run(sim)
    world = World(sim)
    history = History.from_events(events, sim.clock, config.weights, index=DeviceIndex(tuple(world.ids.to_pylist())),
                                  first_slot=0, status=status)
    train_slots, test_slots = time_split(history, train.test_fraction)
    started = time.perf_counter()
    model, _, _ = train_bm(history, replace(config, clock=sim.clock), train)
    seconds = time.perf_counter() - started
    bm = learned_scorer(model, history)
    arms: dict[str, Scorer] = {"bm": bm, **{f"bm x{s:g}": scaled(bm, s) for s in scales},
                               **{name: online_scorer(RULES[name](history, train_slots), history) for name in RIVALS}}
    levels: dict[str, list[float]] = {}

    def watched(name: str, scorer: Scorer) -> Scorer:
        def score(*query: np.ndarray) -> np.ndarray:
            t_beh = scorer(*query)
            levels.setdefault(name, []).append(float(t_beh.mean()))
            return t_beh
        return score

    watching = {name: watched(name, scorer) for name, scorer in arms.items()}
    curves = voc_curves(world, list(scored_tasks(world, events, history.first_slot, test_slots, watching)),
                        seed=train.seed)
    rows = [{"arm": name, **{f"theta {theta:g}": round(v, 3) for theta, v in zip(THETAS, curve)},
             "mean T_beh": round(float(np.mean(levels[name])), 3) if name in levels else ""}
            for name, curve in curves.items()]
    return rows, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="the simulated run's seed")
    parser.add_argument("--scales", type=float, nargs="+", default=[0.85, 0.9, 0.95], help="factors on BM's T_beh")
    parser.add_argument("--epochs", type=int, default=12, help="BM's training epochs (patience 3)")
    args = parser.parse_args()
    sim = replace(SimConfig(), seed=args.seed)
    rows, seconds = measure(sim, BMConfig(), TrainConfig(epochs=args.epochs, patience=3), args.scales)
    emit("voc_level", rows, {"seed": args.seed, "epochs": args.epochs, "bm_train_s": round(seconds, 1)})


if __name__ == "__main__":
    main()
