"""A peer's protocol on real logs: TrustGuard's single-timeslot prediction of distrust.

TrustGuard (a GNN over time snapshots, IEEE TDSC 2024) evaluates on the Bitcoin logs this way: the log is
cut into ``snapshots`` equal-time snapshots; for k = 2 .. snapshots - 1 a model trains on snapshots 1..k
and predicts the ratings of snapshot k + 1 whose two devices it saw in 1..k; the label is distrust (a
negative rating: a graded outcome below one half); AUC and MCC are averaged over the rounds.

Here every method scores distrust from what it knows at the end of snapshot k: BM as ``1 - T_beh`` of the
pair (its history through snapshot k, no test data), the simple rule (``distrust_share``) as the trustee's
smoothed share of distrust received, and the learned rule (``distrust_logit``, :mod:`model.distrust`) as the
probability a logistic regression on raters' and trustees' figures gives, fitted on snapshots 2..k (each
rating's features as of its snapshot's start). MCC needs a threshold, never chosen on the test snapshot: BM and
the simple rule choose it on the last training snapshot (snapshot k predicted from 1..k-1, by the same model);
the learned rule, whose probabilities are calibrated, flags as many ratings as they expect. BM's slots are
``slots_per_snapshot`` equal parts of a snapshot, so snapshot boundaries are slot boundaries.

``bm_blend`` never trusts BM further than it has shown out of sample: its score is a mix of BM's and the
learned rule's scores as percentiles, with the weight (and the threshold, in percentiles) that did best on the
previous round's test snapshot, which that round predicted without seeing it and which is training data now;
the first round, with no such evidence, takes the learned rule alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from model.bm import BM, BMConfig
from model.config import SlotClock
from model.distrust import DISTRUST, DistrustLogit, RatingLog, expected_count_threshold, features, received_share
from model.history import History
from model.targets import PairQuery
from model.train import TrainConfig, train_bm


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """The probability that a random positive scores above a random negative (ties count half); NaN without
    both classes."""
    positives, negatives = int(label.sum()), int((~label).sum())
    if not positives or not negatives:
        return float("nan")
    ranks = average_ranks(score)
    return float((ranks[label].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def average_ranks(score: np.ndarray) -> np.ndarray:
    """(n,) each score's rank, 1-based, ties sharing their mean rank."""
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score))
    sorted_score = score[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_score)) + 1]
    ends = np.r_[starts[1:], len(score)]
    for begin, end in zip(starts, ends):
        ranks[order[begin:end]] = (begin + end + 1) / 2
    return ranks


def mcc(predicted: np.ndarray, label: np.ndarray) -> float:
    """Matthews correlation coefficient of boolean predictions; 0 where it is undefined (a constant column)."""
    tp = float((predicted & label).sum())
    tn = float((~predicted & ~label).sum())
    fp = float((predicted & ~label).sum())
    fn = float((~predicted & label).sum())
    denominator = np.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return float((tp * tn - fp * fn) / denominator) if denominator else 0.0


def percentiles(score: np.ndarray) -> np.ndarray:
    """(n,) each score's mid-rank share in (0, 1), ties sharing theirs: scores of different scales made comparable."""
    return (average_ranks(score) - 0.5) / max(len(score), 1)


BLEND_WEIGHTS = np.linspace(0.0, 1.0, 11)  # BM's share in bm_blend's mix


def blend(bm: np.ndarray, rule: np.ndarray, weight: float) -> np.ndarray:
    """bm_blend's score: BM's and the rule's scores as percentiles, ``weight`` on BM's."""
    return weight * percentiles(bm) + (1 - weight) * percentiles(rule)


def blend_weight(bm: np.ndarray, rule: np.ndarray, label: np.ndarray) -> float:
    """The smallest weight on BM (of :data:`BLEND_WEIGHTS`) whose blend has the highest AUC on these ratings:
    BM is trusted no further than it helped; 0 (the rule) where the AUC is undefined."""
    values = [auc(blend(bm, rule, w), label) for w in BLEND_WEIGHTS]
    if np.all(np.isnan(values)):
        return 0.0
    return float(BLEND_WEIGHTS[int(np.nanargmax(values))])


def best_threshold(score: np.ndarray, label: np.ndarray) -> float:
    """The threshold on ``score`` (predict distrust at or above it) with the highest MCC on these ratings."""
    candidates = np.unique(score)
    if not len(candidates):
        return 0.5
    values = [mcc(score >= t, label) for t in candidates]
    return float(candidates[int(np.argmax(values))])


@dataclass(frozen=True)
class Ratings:
    """The ratings of one snapshot between devices seen before it: owner and collaborator ids, distrust labels."""

    owner: np.ndarray
    collaborator: np.ndarray
    distrust: np.ndarray

    @classmethod
    def of(cls, events: pa.Table, seen: set[str]) -> "Ratings":
        owner = events["owner"].to_numpy(zero_copy_only=False)
        collaborator = events["collaborator"].to_numpy(zero_copy_only=False)
        known = np.array([o in seen and c in seen for o, c in zip(owner, collaborator)], bool)
        reliability = events["reliability"].to_numpy(zero_copy_only=False).astype(np.float64)
        return cls(owner[known], collaborator[known], reliability[known] < DISTRUST)


Scorer = Callable[[Ratings], np.ndarray]  # distrust scores of a snapshot's ratings


def bm_scorer(model: BM, history: History, end: int) -> Scorer:
    """1 - T_beh of each pair from the model's history through relative slot ``end``."""
    def score(ratings: Ratings) -> np.ndarray:
        src, dst = history.index.lookup(pa.array(ratings.owner)), history.index.lookup(pa.array(ratings.collaborator))
        model.eval()
        with torch.no_grad():
            t_beh = model.t_beh(model.pair_outputs(history, PairQuery(src, dst, end)))
        return 1.0 - t_beh.double().cpu().numpy()

    return score


def distrust_share(log: RatingLog) -> Scorer:
    """The rule: the trustee's share of distrust among the ratings it received in ``log``, smoothed toward the log's
    share (:func:`model.distrust.received_share`)."""
    return lambda ratings: received_share(log, ratings.collaborator)


def scored(k: int, scores: np.ndarray, label: np.ndarray, threshold: float) -> dict:
    """One round's figures for one method: AUC, and MCC at ``threshold`` (chosen without this snapshot)."""
    return {"k": k + 1, "ratings": len(scores), "auc": auc(scores, label), "mcc": mcc(scores >= threshold, label),
            "threshold": threshold}


def snapshot_clock(events: pa.Table, snapshots: int, slots_per_snapshot: int) -> SlotClock:
    """Slots of equal length from the first event, ``slots_per_snapshot`` to each of ``snapshots`` equal-time
    snapshots spanning the log."""
    times = events["event_time_ms"].to_numpy()
    first, last = int(times.min()), int(times.max())
    slot_ms = -(-(last - first + 1) // (snapshots * slots_per_snapshot))
    return SlotClock(origin_ms=first, slot_ms=max(slot_ms, 1))


def rating_log(events: pa.Table, snapshot: np.ndarray, before: int) -> RatingLog:
    """The ratings of snapshots before ``before``, aged in snapshots from the last of them."""
    known = events.filter(pa.array(snapshot < before))
    column = {name: known[name].to_numpy(zero_copy_only=False) for name in ("owner", "collaborator", "reliability")}
    return RatingLog(column["owner"], column["collaborator"], column["reliability"].astype(np.float64),
                     (before - 1 - snapshot[snapshot < before]).astype(np.float64))


def evaluate_snapshots(events: pa.Table, config: BMConfig, train: TrainConfig, snapshots: int = 10,
                       slots_per_snapshot: int = 10, progress: Callable[[str], None] = lambda _: None) -> dict:
    """Every round's AUC and MCC for BM, the two rules and BM's blend with the learned one, and their means over
    rounds: {method: {"auc", "mcc", "rounds": [{"k", "auc", "mcc", "threshold", "ratings"} (the blend: and its
    "weight" on BM)]}}."""
    if snapshots < 3:
        raise ValueError(f"--snapshots: need at least 3 (got {snapshots})")
    if "reliability" not in events.column_names or pc.all(pc.is_null(events["reliability"])).as_py():
        raise ValueError("events: the snapshot protocol needs graded outcomes (reliability), e.g. an imported log")
    clock = snapshot_clock(events, snapshots, slots_per_snapshot)
    snapshot = clock.slot_of(events["event_time_ms"].to_numpy()) // slots_per_snapshot
    config = replace(config, clock=clock)
    rounds: dict[str, list[dict]] = {"bm": [], "distrust_share": [], "distrust_logit": [], "bm_blend": []}
    # per snapshot j >= 1: its ratings between devices seen before, the log before it, and those ratings' features
    # as of its start (the learned rule's rows); the round testing j tunes on j - 1's
    ratings: list[Ratings] = []
    logs: list[RatingLog] = []
    labelled: list[tuple[np.ndarray, np.ndarray]] = []
    previous: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # the last round's test: bm, logit, labels
    for k in range(1, snapshots):  # train on snapshots 1..k (0..k-1 here), test on k + 1 (k here)
        logs.append(rating_log(events, snapshot, k))
        seen = set(logs[-1].owner.tolist()) | set(logs[-1].collaborator.tolist())
        ratings.append(Ratings.of(events.filter(pa.array(snapshot == k)), seen))
        test = ratings[-1]
        labelled.append((features(logs[-1], test.owner, test.collaborator), test.distrust))
        if k < 2:
            continue
        tune = ratings[-2]
        known = events.filter(pa.array(snapshot < k))
        history = History.from_events(known, clock, config.weights, first_slot=0)
        model, _, _ = train_bm(history, config, replace(train, test_fraction=0.0))
        scorers = {"bm": (bm_scorer(model, history, k * slots_per_snapshot - 1),
                          bm_scorer(model, history, (k - 1) * slots_per_snapshot - 1)),
                   "distrust_share": (distrust_share(logs[-1]), distrust_share(logs[-2]))}
        tested = {}
        for method, (score_test, score_tune) in scorers.items():
            threshold = best_threshold(score_tune(tune), tune.distrust) if len(tune.distrust) else 0.5
            tested[method] = score_test(test)
            rounds[method].append(scored(k, tested[method], test.distrust, threshold))
        tested["distrust_logit"] = learned_rule(labelled[:-1], labelled[-1][0])
        if tested["distrust_logit"] is None:  # no distrust (or no trust) to learn from yet: the simple rule
            tested["distrust_logit"] = tested["distrust_share"]
            rounds["distrust_logit"].append(rounds["distrust_share"][-1])
        else:
            rounds["distrust_logit"].append(scored(k, tested["distrust_logit"], test.distrust,
                                                   expected_count_threshold(tested["distrust_logit"])))
        if previous is None:  # no out-of-sample evidence for BM yet: the learned rule, at its own threshold
            rounds["bm_blend"].append({**rounds["distrust_logit"][-1], "weight": 0.0})
        else:
            bm_before, rule_before, label_before = previous
            weight = blend_weight(bm_before, rule_before, label_before)
            threshold = best_threshold(blend(bm_before, rule_before, weight), label_before)
            mixed = blend(tested["bm"], tested["distrust_logit"], weight)
            rounds["bm_blend"].append({**scored(k, mixed, test.distrust, threshold), "weight": weight})
        previous = (tested["bm"], tested["distrust_logit"], test.distrust)
        progress(f"snapshot round {k - 1}/{snapshots - 2} done")
    return {method: {"auc": float(np.nanmean([r["auc"] for r in rows])),
                     "mcc": float(np.mean([r["mcc"] for r in rows])), "rounds": rows}
            for method, rows in rounds.items()}


def learned_rule(training: list[tuple[np.ndarray, np.ndarray]], test: np.ndarray) -> np.ndarray | None:
    """P(distrust) of the test ratings (their features) from :class:`DistrustLogit` fitted on the earlier snapshots'
    (features, labels); None where those lack distrust or trust."""
    x = np.concatenate([x_j for x_j, _ in training])
    label = np.concatenate([label_j for _, label_j in training])
    if not label.any() or label.all():
        return None
    return DistrustLogit().fit(x, label).probability(test)
