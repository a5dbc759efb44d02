"""Evaluation: every method on the same log, the same time split and the same test targets.

Per run, each method predicts T_col of every test edge (slot t's edges from
slots before t); RMSE and MAE are taken against the observed T_col and, on
simulated data, against the hidden truth (the expectation of T_col that the
simulator knows). RMSE scores each method's mean forecast (its T_beh), MAE its
median forecast where it gives one (the learned heads' ``median`` readout: the
point forecast absolute error rewards), else the same T_beh. ``oracle`` predicts the truth itself: its error against the
observed T_col is the noise floor no method can beat. Calibration: per bin of
predicted T_beh, the share of predictions and the mean target (a reliability
diagram), and the expected calibration error (ECE) against the observed T_col
and the truth. On simulated data each method's T_beh also drives the selection
experiment (:mod:`model.voc`). Runs differ by seed (the simulation's and the
training's); the report gives mean and std over runs.

Methods: the learned ones (:data:`LEARNED`: BM and the same model with another sequence encoder,
all with the context head, plus ``bm_paper``, the paper-literal BM, and its ``bm_paper_max``
readout), the rules of :mod:`model.baselines` (fitted on the training period where they fit
anything) and ``oracle``.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

import torch

from model.baselines import RULES, OnlineScorer, predict_edges
from model.bm import BMConfig, PairQuery, Readout
from model.history import History
from model.metrics import expected_calibration_error, mae, rmse
from model.plots import plot_curves, plot_reliability
from model.train import TrainConfig, predict, prepare, targets, time_split, train_bm
from model.voc import THETAS, Scorer, voc_curves

# method -> (sequence encoder, head); bm_paper also reports its literal "max" readout as bm_paper_max
LEARNED = {"bm": ("bimamba", "context"), "bm_paper": ("bimamba", "paper"), "lstm": ("lstm", "context"),
           "transformer": ("transformer", "context"), "gnn": ("last", "context")}
METHODS = (*LEARNED, *RULES, "oracle")


@dataclass(frozen=True)
class Scores:
    rmse: float
    mae: float


def scores(prediction: np.ndarray, target: np.ndarray, median: np.ndarray | None = None) -> Scores:
    """RMSE of the (mean) prediction; MAE of the median forecast when the method gives one (the point forecast
    that absolute error rewards), else of the prediction."""
    return Scores(rmse(prediction, target), mae(prediction if median is None else median, target))


def per_slot_rmse(prediction: np.ndarray, target: np.ndarray, slot: np.ndarray, slots: list[int]) -> list[float]:
    """RMSE within each test slot (the long-term curve); NaN for a slot without edges."""
    return [scores(prediction[slot == t], target[slot == t]).rmse if (slot == t).any() else float("nan")
            for t in slots]


CALIBRATION_BINS = np.linspace(0.0, 1.0, 11)  # predicted T_beh in [0, 0.1), ..., [0.9, 1.0]


def calibration(prediction: np.ndarray, target: np.ndarray) -> dict[str, list[float]]:
    """Reliability diagram of ``prediction``: per bin of predicted value, the share of predictions in it and
    the mean target of those (NaN for an empty bin). A calibrated method's mean target matches its bin."""
    bins = np.digitize(prediction, CALIBRATION_BINS[1:-1])  # 0 .. 9; 1.0 falls in the last bin
    count = np.bincount(bins, minlength=len(CALIBRATION_BINS) - 1)
    total = np.bincount(bins, weights=target, minlength=len(CALIBRATION_BINS) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, total / count, np.nan)
    return {"share": (count / max(len(prediction), 1)).tolist(), "mean_target": mean.tolist()}


def truth_for(history: History, slots: list[int], truth: pa.Table) -> np.ndarray:
    """The hidden reliability of each test edge, in :func:`targets` order."""
    query = targets(history, slots).query
    src, dst, end = query.src, query.dst, query.end
    n = len(history.index)
    absolute_slot = truth["slot"].to_numpy() - history.first_slot
    rows = history.index.lookup(truth["owner"]) * n + history.index.lookup(truth["collaborator"])
    lookup = dict(zip((absolute_slot * n * n + rows).tolist(), truth["reliability"].to_numpy().tolist()))
    keys = ((end + 1) * n * n + src * n + dst).tolist()
    missing = [k for k in keys if k not in lookup]
    if missing:
        raise ValueError(f"truth: {len(missing)} test edges have no truth row")
    return np.array([lookup[k] for k in keys])


@dataclass(frozen=True)
class Simulated:
    """What only a simulated log has: the hidden truth, and the world for the selection experiment."""

    truth: pa.Table
    world: object  # simulator.world.World (the simulator sits above model: duck-typed here)
    events: pa.Table


def learned_scorer(model, history: History, readout: Readout | None = None) -> Scorer:
    def score(src: np.ndarray, dst: np.ndarray, end: int, profile: np.ndarray) -> np.ndarray:
        model.eval()
        with torch.no_grad():
            return model.t_beh(model.pair_outputs(history, PairQuery(src, dst, end, profile)), readout).cpu().numpy()

    return score


def online_scorer(scorer: OnlineScorer, history: History) -> Scorer:
    """A rule scorer advanced lazily through the history (ends must not decrease)."""
    read = 0

    def score(src: np.ndarray, dst: np.ndarray, end: int, profile: np.ndarray) -> np.ndarray:
        nonlocal read
        while read <= end:
            scorer.advance(history.graphs[read])
            read += 1
        return scorer.score(src, dst, profile)

    return score


def accuracy(prediction: np.ndarray, observed: np.ndarray, hidden: np.ndarray | None, edge_slot: np.ndarray,
             test_slots: list[int], median: np.ndarray | None = None) -> dict:
    """RMSE/MAE (MAE of ``median`` when given), the per-slot RMSE curve and the calibration bins against the
    observed T_col (and the truth)."""
    s = scores(prediction, observed, median)
    row = {"rmse": s.rmse, "mae": s.mae, "ece": expected_calibration_error(prediction, observed, CALIBRATION_BINS),
           "rmse_per_slot": per_slot_rmse(prediction, observed, edge_slot, test_slots),
           **{f"calibration_{k}": v for k, v in calibration(prediction, observed).items()}}
    if hidden is not None:
        s = scores(prediction, hidden, median)
        row.update(rmse_truth=s.rmse, mae_truth=s.mae,
                   ece_truth=expected_calibration_error(prediction, hidden, CALIBRATION_BINS),
                   calibration_mean_truth=calibration(prediction, hidden)["mean_target"])
    return row


def evaluate_run(history: History, config: BMConfig, train: TrainConfig, methods: list[str],
                 simulated: Simulated | None = None, voc: bool = True) -> dict[str, dict]:
    """One run: every method's scores on the test period, its seconds, and (simulated, ``voc``) its VoC curve."""
    train_slots, test_slots = time_split(history, train.test_fraction)
    batch = targets(history, test_slots)
    observed, edge_slot = batch.t_col, batch.query.end + 1
    hidden = truth_for(history, test_slots, simulated.truth) if simulated else None
    out: dict[str, dict] = {}
    scorers: dict[str, Scorer] = {}
    prepared = prepare(history, config, train) if set(methods) & set(LEARNED) else None
    for method in methods:
        started = time.perf_counter()
        predicted: dict[str, np.ndarray] = {}
        medians: dict[str, np.ndarray] = {}
        facts: dict[str, float] = {}
        if method in LEARNED:
            sequence, head = LEARNED[method]
            model, _, trained = train_bm(history, replace(config, sequence=sequence, head=head), train,
                                         prepared=prepared)
            facts["kept_epoch"] = trained.fit.best_epoch  # -1: no end-to-end epoch beat the warmed-up head
            predicted[method] = predict(model, history, test_slots)[0]
            if head == "paper" or not history.has_flags:  # else the median readout is T_beh itself
                medians[method] = predict(model, history, test_slots, readout="median")[0]
            scorers[method] = learned_scorer(model, history)
            if head == "paper":  # the paper's literal readout of the same model: the most probable level
                predicted[f"{method}_max"] = predict(model, history, test_slots, readout="max")[0]
                scorers[f"{method}_max"] = learned_scorer(model, history, readout="max")
        elif method in RULES:
            predicted[method] = predict_edges(RULES[method](history, train_slots), history, test_slots)
            scorers[method] = online_scorer(RULES[method](history, train_slots), history)
        elif method == "oracle" and hidden is not None:
            predicted[method] = hidden
        else:
            continue
        seconds = time.perf_counter() - started
        for name, prediction in predicted.items():
            out[name] = {"seconds": seconds, **facts, **accuracy(prediction, observed, hidden, edge_slot, test_slots,
                                                                 medians.get(name))}
    if simulated is not None and voc:
        curves = voc_curves(simulated.world, simulated.events, history.first_slot, test_slots, scorers,
                            seed=train.seed)
        for method, curve in curves.items():
            out.setdefault(method, {})["voc"] = curve
    return out


def summarize(runs: list[dict[str, dict]]) -> dict[str, dict[str, dict]]:
    """{method: {metric: {"mean": x, "std": y}}} over runs; curves (lists) get per-point mean and std."""
    summary: dict[str, dict[str, dict]] = {}
    for method in runs[0]:
        summary[method] = {}
        for metric in runs[0][method]:
            values = np.array([r[method][metric] for r in runs], dtype=np.float64)
            with warnings.catch_warnings():  # a curve point empty in every run (NaN) stays NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                mean, std = np.nanmean(values, axis=0), np.nanstd(values, axis=0)
            summary[method][metric] = {"mean": mean.tolist(), "std": std.tolist()}
    return summary


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"] + ["| " + " | ".join(r) + " |" for r in rows]


def _number(value: float, digits: int) -> str:
    return "" if math.isnan(value) else f"{value:.{digits}f}"


def markdown(title: str, summary: dict[str, dict[str, dict]], notes: list[str]) -> str:
    metrics = [m for m in ("rmse", "mae", "rmse_truth", "mae_truth", "ece", "ece_truth", "seconds", "kept_epoch")
               if any(m in row for row in summary.values())]
    lines = [f"# {title}", ""] + _table(["method", *metrics], [
        [method] + [("" if m not in row else f"{row[m]['mean']:.1f}" if m in ("seconds", "kept_epoch")
                     else f"{row[m]['mean']:.4f} ± {row[m]['std']:.4f}") for m in metrics]
        for method, row in summary.items()])
    curves = {method: row["voc"] for method, row in summary.items() if "voc" in row}
    if curves:
        lines += ["", "Achieved VoC per task versus the trust threshold theta (mean over runs):", ""]
        lines += _table(["method", *(f"θ={t}" for t in THETAS)],
                        [[m, *(f"{v:.3f}" for v in c["mean"])] for m, c in curves.items()])
    bins = [f"{lo:.1f}-{hi:.1f}" for lo, hi in zip(CALIBRATION_BINS[:-1], CALIBRATION_BINS[1:])]
    truth = any("calibration_mean_truth" in row for row in summary.values())
    lines += ["", "Calibration on the test edges, per bin of predicted T_beh: share of predictions in the bin (%), "
              "mean observed next-slot T_col" + (", mean hidden truth" if truth else "") + " (means over runs):", ""]
    lines += _table(["method", *bins], [
        [method] + [" / ".join([_number(100 * row["calibration_share"]["mean"][k], 1),
                                _number(row["calibration_mean_target"]["mean"][k], 2),
                                *([_number(row["calibration_mean_truth"]["mean"][k], 2)] if truth else [])])
                    if row["calibration_share"]["mean"][k] > 0 else "–" for k in range(len(bins))]
        for method, row in summary.items() if "calibration_share" in row])
    return "\n".join(lines + [""] + [f"- {note}" for note in notes]) + "\n"


def report_figures(out: Path, summary: dict[str, dict[str, dict]]) -> list[Path]:
    """The PNG plots of a summary: VoC versus theta (Fig. 3b) and RMSE per test slot (Fig. 3a)."""
    figures = []
    voc = {m: row["voc"] for m, row in summary.items() if "voc" in row}
    if voc:
        figures.append(plot_curves(out / "voc_vs_theta.png", list(THETAS), voc, "trust threshold θ",
                                   "achieved VoC per task", "Selection: achieved VoC vs θ"))
    bins = {m: {"mean_target": row.get("calibration_mean_truth", row["calibration_mean_target"])["mean"],
                "share": row["calibration_share"]["mean"]}
            for m, row in summary.items() if "calibration_share" in row}
    if bins:
        target = "hidden truth" if any("calibration_mean_truth" in row for row in summary.values()) else "observed T_col"
        figures.append(plot_reliability(out / "reliability.png", CALIBRATION_BINS, bins, target))
    per_slot = {m: row["rmse_per_slot"] for m, row in summary.items() if "rmse_per_slot" in row}
    if per_slot:
        slots = list(range(len(next(iter(per_slot.values()))["mean"])))
        smooth = max(1, len(slots) // 25) if len(slots) > 50 else 1
        title = "Long-term accuracy per slot" + (f" (rolling mean over {smooth} slots)" if smooth > 1 else "")
        figures.append(plot_curves(out / "rmse_per_slot.png", slots, per_slot, "test slot",
                                   "RMSE vs next-slot T_col", title, smooth))
    return figures


def write_report(out: Path, title: str, runs: list[dict[str, dict]], setup: dict, notes: list[str]) -> dict:
    """report.json (every figure), report.md (tables) and the PNG plots."""
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(runs)
    report = {"title": title, "setup": setup, **summary, "runs": runs}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    figures = report_figures(out, summary)
    text = markdown(title, summary, notes) + "".join(f"\n![{p.stem}]({p.name})\n" for p in figures)
    (out / "report.md").write_text(text)
    return report


def evaluate_log(events: pa.Table, config: BMConfig, train: TrainConfig, runs: int, methods: list[str],
                 progress: Callable[[str], None] = lambda _: None, status: pa.Table | None = None,
                 each_run: Callable[[list], None] = lambda _: None) -> list[dict[str, dict[str, float]]]:
    """Every method on a recorded log, ``runs`` training seeds; ``each_run`` sees the results so far after
    each run (a long evaluation keeps what it finished)."""
    history = History.from_events(events, config.clock, config.weights, status=status)
    results = []
    for run in range(runs):
        results.append(evaluate_run(history, config, replace(train, seed=train.seed + run), methods))
        progress(f"run {run + 1}/{runs} done")
        each_run(results)
    return results
