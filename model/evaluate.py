"""Evaluation: every method on the same log, the same time split and the same test targets.

Per run, each method predicts T_col of every test edge (slot t's edges from
slots before t); RMSE and MAE are taken against the observed T_col and, on
simulated data, against the hidden truth (the expectation of T_col that the
simulator knows). ``oracle`` predicts the truth itself: its error against the
observed T_col is the noise floor no method can beat. Runs differ by seed (the
simulation's and the training's); the report gives mean and std over runs.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from model.baselines import beta_reputation, qs_trust
from model.bm import BMConfig
from model.history import History
from model.train import TrainConfig, predict, targets, time_split, train_bm

LEARNED = {"bm": "bimamba", "lstm": "lstm", "transformer": "transformer", "gnn": "last"}
RULES: dict[str, Callable[[History, list[int]], np.ndarray]] = {"beta": beta_reputation, "qs_trust": qs_trust}


@dataclass(frozen=True)
class Scores:
    rmse: float
    mae: float


def scores(prediction: np.ndarray, target: np.ndarray) -> Scores:
    error = prediction - target
    return Scores(float(np.sqrt(np.mean(error**2))), float(np.mean(np.abs(error))))


def truth_for(history: History, slots: list[int], truth: pa.Table) -> np.ndarray:
    """The hidden reliability of each test edge, in :func:`targets` order."""
    src, dst, end, _ = targets(history, slots)
    n = len(history.index)
    absolute_slot = truth["slot"].to_numpy() - history.first_slot
    rows = history.index.lookup(truth["owner"]) * n + history.index.lookup(truth["collaborator"])
    lookup = dict(zip((absolute_slot * n * n + rows).tolist(), truth["reliability"].to_numpy().tolist()))
    keys = ((end + 1) * n * n + src * n + dst).tolist()
    missing = [k for k in keys if k not in lookup]
    if missing:
        raise ValueError(f"truth: {len(missing)} test edges have no truth row")
    return np.array([lookup[k] for k in keys])


def evaluate_run(history: History, config: BMConfig, train: TrainConfig, methods: list[str],
                 truth: pa.Table | None = None) -> dict[str, dict[str, float]]:
    """One run: every method's scores on the test period, and its training seconds."""
    train_slots, test_slots = time_split(history, train.test_fraction)
    observed = targets(history, test_slots)[3]
    hidden = truth_for(history, test_slots, truth) if truth is not None else None
    out: dict[str, dict[str, float]] = {}
    for method in methods:
        started = time.perf_counter()
        if method in LEARNED:
            model, _, _ = train_bm(history, replace(config, sequence=LEARNED[method]), train)
            prediction = predict(model, history, test_slots)[0]
        elif method in RULES:
            prediction = RULES[method](history, test_slots)
        elif method == "oracle" and hidden is not None:
            prediction = hidden
        else:
            continue
        row = {"seconds": time.perf_counter() - started}
        s = scores(prediction, observed)
        row.update(rmse=s.rmse, mae=s.mae)
        if hidden is not None:
            s = scores(prediction, hidden)
            row.update(rmse_truth=s.rmse, mae_truth=s.mae)
        out[method] = row
    return out


def summarize(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, dict[str, float]]]:
    """{method: {metric: {"mean": x, "std": y}}} over runs."""
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for method in runs[0]:
        metrics = runs[0][method].keys()
        summary[method] = {m: {"mean": float(np.mean([r[method][m] for r in runs])),
                               "std": float(np.std([r[method][m] for r in runs]))} for m in metrics}
    return summary


def markdown(title: str, summary: dict[str, dict[str, dict[str, float]]], notes: list[str]) -> str:
    metrics = [m for m in ("rmse", "mae", "rmse_truth", "mae_truth", "seconds") if m in next(iter(summary.values()))]
    lines = [f"# {title}", "", "| method | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for method, row in summary.items():
        cells = [f"{row[m]['mean']:.4f} ± {row[m]['std']:.4f}" if m != "seconds" else f"{row[m]['mean']:.1f}"
                 for m in metrics]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + [f"- {note}" for note in notes]) + "\n"


def write_report(out: Path, title: str, runs: list[dict[str, dict[str, float]]], setup: dict, notes: list[str]) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(runs)
    report = {"title": title, "setup": setup, **summary, "runs": runs}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(markdown(title, summary, notes))
    return report


def simulated_log(sim_config) -> tuple[pa.Table, pa.Table]:
    """(events, truth) of a simulated run, in memory."""
    from simulator.engine import Simulator

    tables: dict[str, list[pa.Table]] = {"events": [], "truth": []}

    class Keep:
        def write(self, kind: str, table: pa.Table) -> None:
            if kind in tables:
                tables[kind].append(table)

        def close(self) -> None:
            pass

    Simulator(sim_config).run([Keep()])
    return pa.concat_tables(tables["events"]), pa.concat_tables(tables["truth"])


def evaluate_simulated(sim_config, config: BMConfig, train: TrainConfig, runs: int, methods: list[str],
                       progress: Callable[[str], None] = lambda _: None) -> list[dict[str, dict[str, float]]]:
    results = []
    for run in range(runs):
        events, truth = simulated_log(replace(sim_config, seed=sim_config.seed + run))
        history = History.from_events(events, replace(config, clock=sim_config.clock).clock, config.weights)
        results.append(evaluate_run(history, replace(config, clock=sim_config.clock),
                                    replace(train, seed=train.seed + run), methods, truth))
        progress(f"run {run + 1}/{runs} done")
    return results


def evaluate_log(events: pa.Table, config: BMConfig, train: TrainConfig, runs: int, methods: list[str],
                 progress: Callable[[str], None] = lambda _: None) -> list[dict[str, dict[str, float]]]:
    history = History.from_events(events, config.clock, config.weights)
    results = []
    for run in range(runs):
        results.append(evaluate_run(history, config, replace(train, seed=train.seed + run), methods))
        progress(f"run {run + 1}/{runs} done")
    return results
