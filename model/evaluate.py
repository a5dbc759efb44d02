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
readout), ``bm_online`` (BM's forecasts with the online level shift of :mod:`model.recalibration`,
replayed over the test slots in order: each slot's shift refitted on the outcomes of the slots before it;
its MAE is BM's median readout's, which a shift of the mean leaves alone), the rules of
:mod:`model.baselines` (fitted on the training period where they fit anything) and ``oracle``.
"""

from __future__ import annotations

import itertools
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
from model.bm import BMConfig, Readout
from model.context import PHYSICS_COLUMNS
from model.history import History
from model.manipulation import DETECT_BELOW, attack_measures
from model.metrics import expected_calibration_error, mae, mean_error, rmse
from model.plots import plot_curves, plot_reliability
from model.recalibration import RecalibrationConfig, replayed_shifts
from model.targets import PairQuery, fit_outage, targets
from model.train import TrainConfig, WarmUps, predict, prepare, time_split, train_bm
from model.trust import RULE_WORDS, SELECTION_RULES, rule_suffix
from model.voc import THETAS, CpuReader, Scorer, candidate_rmse, scored_tasks, voc_curves

# method -> (sequence encoder, head); bm_paper also reports its literal "max" readout as bm_paper_max
LEARNED = {"bm": ("bimamba", "context"), "bm_paper": ("bimamba", "paper"), "lstm": ("lstm", "context"),
           "transformer": ("transformer", "context"), "gnn": ("last", "context"), "gnn_pool": ("pool", "context")}
# references, simulated logs only: the hidden truth itself, and the simulator's Bayes filter (simulator.bayes: the
# best forecast anything learning from the log could make; computed by the simulator, passed as ``references``)
REFERENCES = ("oracle", "bayes")
ONLINE = "bm_online"  # bm recalibrated online (model.recalibration), reported with bm
# how a choice's VoC is scored: the report's key prefix, model.voc.voc_curves' ``drawn``, the tables' words
VOC_SCORES = (("", True, "Achieved VoC (each choice's outcome drawn from the hidden probabilities)"),
              ("expected_", False, "Expected VoC (each choice's VoC times its hidden P(success): no draws' noise)"))
METHODS = (*LEARNED, *RULES, *REFERENCES)


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
    """What only a simulated log has: the hidden truth, each device's hidden behaviour label (by history row),
    and the world for the selection experiment."""

    truth: pa.Table
    world: object  # simulator.world.World (the simulator sits above model: duck-typed here)
    events: pa.Table
    behaviour: np.ndarray  # (devices,) str: the hidden behaviour of each history row


@dataclass(frozen=True)
class RunOutput:
    """One run of :func:`evaluate_run`: every method's figures, and every test edge's forecasts
    (:func:`predictions_table`)."""

    scores: dict[str, dict]
    predictions: pa.Table


def learned_scorer(model, history: History, readout: Readout | None = None) -> Scorer:
    def score(src: np.ndarray, dst: np.ndarray, end: int, profile: np.ndarray) -> np.ndarray:
        model.eval()
        with torch.no_grad():
            return model.t_beh(model.pair_outputs(history, PairQuery(src, dst, end, profile)), readout).cpu().numpy()

    return score


def learned_cpu_reader(model, history: History) -> CpuReader | None:
    """Each candidate's CPU as ``model``'s physics read it: the claim, or as fast as its tasks' times show
    (:func:`model.evidence.verified_cpu`), as the job publishes it and ranks by; None for a model that judges no
    claim (its physics believe the statuses, or it reads none)."""
    config = model.config
    if not config.uses_context or config.evidence.speed_gap is None:
        return None
    column = PHYSICS_COLUMNS.index("cpu_collaborator_hz")

    def read(src: np.ndarray, dst: np.ndarray, end: int, profile: np.ndarray) -> np.ndarray:
        physics = history.pair_physics(src, dst, np.full(len(src), end), profile, config.system, config.evidence)
        return physics[:, column].astype(np.float64)

    return read


def shifted_scorer(scorer: Scorer, slots: np.ndarray, shifts: np.ndarray) -> Scorer:
    """``scorer`` with the online level shift of the slot it forecasts, as the job publishes it: ``slots`` (k,) the
    sorted test slots that had edges, ``shifts`` (k,) the shift each got (:func:`model.recalibration.replayed_shifts`).
    A slot without edges gets the next such slot's (no outcome came between them); one after the last, the last's."""
    if not len(slots):
        return scorer

    def score(src: np.ndarray, dst: np.ndarray, end: int, profile: np.ndarray) -> np.ndarray:
        at = min(int(np.searchsorted(slots, end + 1)), len(slots) - 1)
        return np.clip(scorer(src, dst, end, profile) + shifts[at], 0.0, 1.0)

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


def by_label(prediction: np.ndarray, target: np.ndarray, labels: np.ndarray,
             metric: Callable[[np.ndarray, np.ndarray], float] = rmse) -> dict[str, float]:
    """``metric`` (RMSE unless given) within each label's edges (labels present only), in label order."""
    return {str(label): metric(prediction[labels == label], target[labels == label]) for label in np.unique(labels)}


def accuracy(prediction: np.ndarray, observed: np.ndarray, hidden: np.ndarray | None, edge_slot: np.ndarray,
             test_slots: list[int], median: np.ndarray | None = None, behaviour: np.ndarray | None = None,
             honest: np.ndarray | None = None) -> dict:
    """RMSE/MAE (MAE of ``median`` when given), the per-slot RMSE curve and the calibration bins against the
    observed T_col (and the truth; with ``behaviour``, the collaborators' hidden labels, also the RMSE against
    the truth per label and the mean error, forecast minus truth, per label; with ``honest``, whether each edge's
    owner is honest, the RMSE against the truth of honest owners' edges: an attacker's own edges, whose reports may
    be lies, left out)."""
    s = scores(prediction, observed, median)
    row = {"rmse": s.rmse, "mae": s.mae, "ece": expected_calibration_error(prediction, observed, CALIBRATION_BINS),
           "rmse_per_slot": per_slot_rmse(prediction, observed, edge_slot, test_slots),
           **{f"calibration_{k}": v for k, v in calibration(prediction, observed).items()}}
    if hidden is not None:
        s = scores(prediction, hidden, median)
        row.update(rmse_truth=s.rmse, mae_truth=s.mae,
                   ece_truth=expected_calibration_error(prediction, hidden, CALIBRATION_BINS),
                   calibration_mean_truth=calibration(prediction, hidden)["mean_target"])
        if behaviour is not None:
            row["rmse_truth_by_behaviour"] = by_label(prediction, hidden, behaviour)
            row["bias_truth_by_behaviour"] = by_label(prediction, hidden, behaviour, mean_error)
        if honest is not None:
            row["rmse_truth_honest"] = rmse(prediction[honest], hidden[honest])
    return row


def predictions_table(history: History, test_slots: list[int], batch, forecasts: dict[str, np.ndarray],
                      hidden: np.ndarray | None, behaviour: np.ndarray | None) -> pa.Table:
    """Every test edge (in :func:`targets` order): its absolute slot, owner and collaborator ids, the observed
    T_col (``target``) and its tasks, the hidden truth and the collaborator's behaviour when simulated, and
    one column per method with its forecast (T_beh)."""
    query = batch.query
    ids = np.asarray(history.index.ids, dtype=object)
    columns = {"slot": pa.array(history.first_slot + query.end + 1, pa.int64()),
               "owner": pa.array(ids[query.src], pa.string()), "collaborator": pa.array(ids[query.dst], pa.string()),
               "target": pa.array(batch.t_col, pa.float64()), "tasks": pa.array(batch.tasks, pa.float64())}
    if hidden is not None:
        columns["truth"] = pa.array(hidden, pa.float64())
    if behaviour is not None:
        columns["behaviour"] = pa.array(behaviour, pa.string())
    columns.update({name: pa.array(np.asarray(values, np.float64)) for name, values in forecasts.items()})
    return pa.table(columns)


def evaluate_run(history: History, config: BMConfig, train: TrainConfig, methods: list[str],
                 simulated: Simulated | None = None, voc: bool = True,
                 references: dict[str, np.ndarray] | None = None,
                 reference_scorers: dict[str, Scorer] | None = None) -> RunOutput:
    """One run: every method's scores on the test period, its seconds, and (simulated, ``voc``) its VoC curve.

    ``references``: forecasts of the test edges (in :func:`targets` order) made outside this module, scored like
    the methods' (the simulator's Bayes filter: what any learner could reach at best); ``reference_scorers``: the
    same references' scorers of any pair, which select in the VoC and manipulation experiments as the methods do."""
    train_slots, test_slots = time_split(history, train.test_fraction)
    batch = targets(history, test_slots)
    observed, edge_slot = batch.t_col, batch.query.end + 1
    hidden = truth_for(history, test_slots, simulated.truth) if simulated else None
    behaviour = simulated.behaviour[batch.query.dst] if simulated else None
    attacker = simulated.world.attacker if simulated else np.zeros(0, bool)
    honest = ~attacker[batch.query.src] if attacker.any() else None  # history rows are the world's ids
    out: dict[str, dict] = {}
    forecasts: dict[str, np.ndarray] = {}
    scorers: dict[str, Scorer] = {}
    readers: dict[str, CpuReader] = {}  # the methods whose physics read each CPU as the tasks' times show
    prepared = prepare(history, config, train) if set(methods) & set(LEARNED) else None
    warm_ups = WarmUps()  # the context heads' one warm-up: the first learned method fits it, the others take it
    for method in methods:
        started = time.perf_counter()
        predicted: dict[str, np.ndarray] = {}
        medians: dict[str, np.ndarray] = {}
        facts: dict[str, float] = {}
        if method in LEARNED:
            sequence, head = LEARNED[method]
            model, _, trained = train_bm(history, replace(config, sequence=sequence, head=head), train,
                                         prepared=prepared, warm_ups=warm_ups)
            facts["kept_epoch"] = trained.fit.best_epoch  # -1: no end-to-end epoch beat the warmed-up head
            facts["end_to_end_gain"] = trained.fit.end_to_end_gain  # what the best epoch took off the head's loss
            if head == "context":  # the stack's weights on the head's own forecast and on the rule (0.5 each: the
                facts["stack_own"] = float(model.head.stack[0])  # default average; 1 and 0: no rule mixed in)
                facts["stack_rule"] = float(model.head.stack[-1])
                facts["size_corrected"] = float(model.head.sizing.adopted)  # 1 where the head reads the task's size
                facts["memories"] = float(len(model.config.evidence.lams))  # 5 where the evidence keeps the long one
                facts["shifts"] = float(model.config.evidence.shifts)  # 1 where it reads the loads' shifts (model.shift)
            predicted[method] = predict(model, history, test_slots)[0]
            if head == "paper" or not history.has_flags:  # else the median readout is T_beh itself
                medians[method] = predict(model, history, test_slots, readout="median")[0]
            scorers[method] = learned_scorer(model, history)
            reader = learned_cpu_reader(model, history)
            if reader is not None:
                readers[method] = reader
            if head == "paper":  # the paper's literal readout of the same model: the most probable level
                predicted[f"{method}_max"] = predict(model, history, test_slots, readout="max")[0]
                scorers[f"{method}_max"] = learned_scorer(model, history, readout="max")
            if method == "bm":  # what owners reported weighs by their credibility, as in the job's publisher
                believed = targets(history, test_slots, config.evidence).tasks
                shift = replayed_shifts(predicted[method], observed, believed, edge_slot, RecalibrationConfig())
                predicted[ONLINE] = np.clip(predicted[method] + shift, 0.0, 1.0)
                slots, first = np.unique(edge_slot, return_index=True)  # an edge's shift is its slot's
                scorers[ONLINE] = shifted_scorer(scorers[method], slots, shift[first])  # selects as published
                if method in readers:
                    readers[ONLINE] = readers[method]
                if method in medians:  # the median readout stays: a skewed target's mean moves, its mode need not
                    medians[ONLINE] = medians[method]
        elif method in RULES:
            predicted[method] = predict_edges(RULES[method](history, train_slots), history, test_slots)
            scorers[method] = online_scorer(RULES[method](history, train_slots), history)
        elif method == "oracle" and hidden is not None:
            predicted[method] = hidden
        else:  # a reference the caller computes (bayes), or one this log cannot have
            continue
        seconds = time.perf_counter() - started
        for name, prediction in predicted.items():
            forecasts[name] = prediction
            out[name] = {"seconds": seconds, **facts, **accuracy(prediction, observed, hidden, edge_slot, test_slots,
                                                                 medians.get(name), behaviour, honest)}
    for name, prediction in (references or {}).items():
        forecasts[name] = prediction
        out[name] = accuracy(prediction, observed, hidden, edge_slot, test_slots, None, behaviour, honest)
    if simulated is not None and voc:
        scorers.update(reference_scorers or {})
        channel = fit_outage(history, train_slots, config.system)  # every method's P(success) reads the same P(tr)
        scored = list(scored_tasks(simulated.world, simulated.events, history.first_slot, test_slots, scorers,
                                   readers, channel))
        for method, rmse in candidate_rmse(simulated.world, scored).items():
            out.setdefault(method, {})["rmse_truth_candidates"] = rmse
        for (prefix, drawn, _), rule in itertools.product(VOC_SCORES, SELECTION_RULES):
            metric = f"{prefix}voc{rule_suffix(rule)}"
            curves = voc_curves(simulated.world, scored, seed=train.seed, rule=rule, drawn=drawn)  # scored once
            for method, curve in curves.items():
                out.setdefault(method, {})[metric] = curve
        if simulated.world.attacker.any() or simulated.world.late_joiners.any():
            for method, measures in attack_measures(simulated.world, simulated.events, scored,
                                                         seed=train.seed).items():
                out.setdefault(method, {}).update(measures)
    return RunOutput(out, predictions_table(history, test_slots, batch, forecasts, hidden, behaviour))


def _mean_std(values: list) -> dict:
    """{"mean", "std"} over runs of numbers or equal-length curves; NaN points skipped (NaN where all are)."""
    array = np.array(values, dtype=np.float64)
    with warnings.catch_warnings():  # a point empty in every run (NaN) stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, std = np.nanmean(array, axis=0), np.nanstd(array, axis=0)
    return {"mean": mean.tolist(), "std": std.tolist()}


def summarize(runs: list[dict[str, dict]]) -> dict[str, dict[str, dict]]:
    """{method: {metric: {"mean": x, "std": y}}} over runs; curves (lists) get per-point mean and std, and
    per-label figures (dicts such as ``rmse_truth_by_behaviour``) one {"mean", "std"} per label, over the runs
    that had it."""
    summary: dict[str, dict[str, dict]] = {}
    for method in runs[0]:
        summary[method] = {}
        for metric, first in runs[0][method].items():
            values = [r[method][metric] for r in runs if metric in r.get(method, {})]
            if isinstance(first, dict):
                labels = sorted({label for v in values for label in v})
                summary[method][metric] = {label: _mean_std([v[label] for v in values if label in v])
                                           for label in labels}
            else:
                summary[method][metric] = _mean_std(values)
    return summary


def paired_differences(runs: list[dict[str, dict]], metric: str, reference: str = "bm") -> dict | None:
    """The reference method's ``metric`` minus each other method's, paired by run: {"metric", "reference",
    "best_other" (the other method with the lowest mean), "differences": {method: {"mean", "se", "runs"}}}; the
    standard error is the runs' standard deviation (ddof 1) over sqrt(runs), NaN for one run. Methods that
    know what no learner can (:data:`REFERENCES`) and BM's own variant (:data:`ONLINE`) are
    compared but never the best other. None when the reference or the metric is missing."""
    if reference not in runs[0] or metric not in runs[0][reference]:
        return None
    differences = {}
    for method in runs[0]:
        if method == reference or metric not in runs[0][method]:
            continue
        d = np.array([r[reference][metric] - r[method][metric] for r in runs], dtype=np.float64)
        se = float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else float("nan")
        differences[method] = {"mean": float(d.mean()), "se": se, "runs": len(d)}
    others = {m: float(np.mean([r[m][metric] for r in runs])) for m in differences
              if m not in (*REFERENCES, ONLINE)}
    best = min(others, key=others.get) if others else None
    return {"metric": metric, "reference": reference, "best_other": best, "differences": differences}


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"] + ["| " + " | ".join(r) + " |" for r in rows]


def _number(value: float, digits: int) -> str:
    return "" if math.isnan(value) else f"{value:.{digits}f}"


def _paired_lines(paired: dict) -> list[str]:
    """The paired-difference table: reference minus each method, mean and standard error over runs."""
    reference, metric = paired["reference"], paired["metric"]
    lines = ["", f"Paired difference of {metric}, {reference} minus each method, per run (negative: {reference} is "
                 f"better; ± one standard error over runs). Best other method: {paired['best_other']}.", ""]
    return lines + _table(["method", f"{reference} − method", "± s.e.", "runs"], [
        [method, f"{d['mean']:+.5f}", _number(d["se"], 5), str(d["runs"])]
        for method, d in sorted(paired["differences"].items(), key=lambda item: item[1]["mean"])])


BEHAVIOUR_TABLES = (("rmse_truth_by_behaviour", "RMSE against the hidden truth", "{:.4f}"),
                    ("bias_truth_by_behaviour", "Mean error (forecast − truth; positive: over-rated)", "{:+.4f}"))


def _behaviour_lines(summary: dict[str, dict[str, dict]]) -> list[str]:
    """The RMSE against the truth and the mean error per hidden behaviour of the collaborator (rows: methods)."""
    lines: list[str] = []
    for figure, title, form in BEHAVIOUR_TABLES:
        rows = {m: row[figure] for m, row in summary.items() if figure in row}
        if not rows:
            continue
        labels = sorted({label for by in rows.values() for label in by})
        lines += ["", f"{title} per behaviour of the collaborator (mean over runs):", ""]
        lines += _table(["method", *labels], [
            [method, *(form.format(by[label]["mean"]) if label in by else "" for label in labels)]
            for method, by in rows.items()])
    return lines


SELECTION_MEASURES = ("tasks_assigned", "attack_tasks_won", "attack_voc_lost", "whitewash_share_before",
                      "whitewash_share_after", "newcomer_tasks_won")  # per selection rule (model.manipulation)
BELIEF_MEASURES = ("attack_slots_to_detect", "attack_detected", "honest_flagged", "honest_trust_shift",
                   "newcomer_trust_shift")


def _attack_lines(summary: dict[str, dict[str, dict]]) -> list[str]:
    """What attackers won from each method (:mod:`model.manipulation`), when the run had attackers: the selections
    by each rule, then what each method believed of attackers and honest devices."""
    rows = {m: row for m, row in summary.items() if "attack_tasks_won" in row}
    if not rows:
        return []

    def cell(row: dict, measure: str) -> str:
        return "" if measure not in row or math.isnan(row[measure]["mean"]) else \
            f"{row[measure]['mean']:.4f} ± {row[measure]['std']:.4f}"

    lines = []
    for rule in SELECTION_RULES:
        suffix = rule_suffix(rule)
        measures = [m for m in SELECTION_MEASURES if any(f"{m}{suffix}" in row for row in rows.values())]
        if not measures:
            continue
        lines += ["", f"Manipulation: what the attackers won when each method selected by {RULE_WORDS[rule]} (θ the "
                      "task's own threshold; mean ± std over runs; model.manipulation):", ""]
        lines += _table(["method", *measures], [[method, *(cell(row, f"{m}{suffix}") for m in measures)]
                                                 for method, row in rows.items()])
    lines += ["", f"Manipulation: what each method believed (detected: T_beh toward its victims below {DETECT_BELOW}; "
                  "honest_flagged: honest candidates below it; honest_trust_shift: T_beh minus the truth over honest "
                  "candidates; newcomer_trust_shift: over honest devices in their first slots after joining late):", ""]
    beliefs = [m for m in BELIEF_MEASURES if any(m in row for row in rows.values())]
    return lines + _table(["method", *beliefs], [[method, *(cell(row, m) for m in beliefs)]
                                                 for method, row in rows.items() if BELIEF_MEASURES[0] in row])


INJECTION_MEASURES = ("rmse_genuine_clean", "rmse_genuine_attacked", "victim_shift", "attacker_shift",
                      "attacker_rmse_clean", "attacker_rmse_attacked")


def _injection_lines(summary: dict[str, dict[str, dict]]) -> list[str]:
    """What an attack injected into a recorded log moved (:func:`model.manipulation.injection_measures`)."""
    rows = {m: row for m, row in summary.items() if INJECTION_MEASURES[0] in row}
    if not rows:
        return []
    lines = ["", "Injected attack: on the genuine test edges (honest raters' own), the RMSE on the clean log and on "
                 "the attacked one, and how far the forecasts toward the accounts fake ratings named (victim) and "
                 "toward the attackers (colluders, or the accounts behind fresh ids) moved (attacked minus clean), "
                 "and the RMSE on those toward the attackers (mean ± std over runs):", ""]
    return lines + _table(["method", *INJECTION_MEASURES], [
        [method, *("" if math.isnan(row[m]["mean"]) else f"{row[m]['mean']:+.4f} ± {row[m]['std']:.4f}"
                   for m in INJECTION_MEASURES)] for method, row in rows.items()])


def markdown(title: str, summary: dict[str, dict[str, dict]], notes: list[str], paired: dict | None = None) -> str:
    coarse = ("seconds", "kept_epoch", "size_corrected", "memories", "shifts")  # one decimal
    metrics = [m for m in ("rmse", "mae", "rmse_truth", "rmse_truth_honest", "rmse_truth_candidates", "mae_truth",
                           "ece", "ece_truth", "seconds", "kept_epoch", "end_to_end_gain", "stack_own",
                           "stack_rule", "size_corrected", "memories", "shifts")
               if any(m in row for row in summary.values())]
    lines = [f"# {title}", ""] + _table(["method", *metrics], [
        [method] + [("" if m not in row else f"{row[m]['mean']:.1f}" if m in coarse
                     else f"{row[m]['mean']:.2f}" if m in ("stack_own", "stack_rule")
                     else f"{row[m]['mean']:.4f} ± {row[m]['std']:.4f}") for m in metrics]
        for method, row in summary.items() if any(m in row for m in metrics)])
    lines += _behaviour_lines(summary) + (_paired_lines(paired) if paired else []) + _attack_lines(summary)
    lines += _injection_lines(summary)
    for (prefix, _, scored_by), rule in itertools.product(VOC_SCORES, SELECTION_RULES):
        metric = f"{prefix}voc{rule_suffix(rule)}"
        curves = {method: row[metric] for method, row in summary.items() if metric in row}
        if curves:
            lines += ["", f"{scored_by} per task versus the trust threshold θ, selecting by {RULE_WORDS[rule]} (mean "
                          "over runs):", ""]
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
    metric = "rmse_truth" if any("rmse_truth" in row for row in summary.values()) else "rmse"
    paired = paired_differences(runs, metric)
    report = {"title": title, "setup": setup, **summary, "paired": paired, "runs": runs}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    figures = report_figures(out, summary)
    text = markdown(title, summary, notes, paired) + "".join(f"\n![{p.stem}]({p.name})\n" for p in figures)
    (out / "report.md").write_text(text)
    return report


def write_predictions(path: Path, results: list[RunOutput], first_seed: int = 0) -> None:
    """Every run's test-edge forecasts as one Parquet file (columns ``run`` and ``seed`` first), written under a
    hidden name and renamed into place."""
    import pyarrow.parquet as pq

    tables = []
    for run, result in enumerate(results):
        n = result.predictions.num_rows
        table = result.predictions
        tables.append(table.add_column(0, "seed", pa.array(np.full(n, first_seed + run), pa.int64()))
                      .add_column(0, "run", pa.array(np.full(n, run), pa.int64())))
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    pq.write_table(pa.concat_tables(tables, promote_options="default"), partial)
    partial.replace(path)


def evaluate_log(events: pa.Table, config: BMConfig, train: TrainConfig, runs: int, methods: list[str],
                 progress: Callable[[str], None] = lambda _: None, status: pa.Table | None = None,
                 each_run: Callable[[list[RunOutput]], None] = lambda _: None) -> list[RunOutput]:
    """Every method on a recorded log, ``runs`` training seeds (``train.seed`` + 0, 1, ...); ``each_run`` sees
    the results so far after each run (a long evaluation keeps what it finished)."""
    history = History.from_events(events, config.clock, config.weights, status=status)
    results = []
    for run in range(runs):
        results.append(evaluate_run(history, config, replace(train, seed=train.seed + run), methods))
        progress(f"run {run + 1}/{runs} done")
        each_run(results)
    return results
