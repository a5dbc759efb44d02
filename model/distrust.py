"""A learned rule for graded logs: the probability that a rating is distrust, from what raters and trustees showed.

The snapshot protocol (:mod:`model.snapshots`) asks, of each rating between two accounts seen before, whether it
is distrust (a negative rating). The trustee's share of distrust received is the simple rule; this module's
:class:`DistrustLogit` reads more of the same log, every figure smoothed toward the log's own share:

* the trustee as ratee: its share of distrust received over the whole log, halving per snapshot of age, and in
  the last snapshot alone, with those ratings' counts, and its mean and lowest grade received;
* the rater: its share of distrust given (a harsh rater's ratings are distrust more often), its count, its mean
  grade given, and the share of distrust it received;
* the trustee as rater: its share of distrust given;
* the reverse rating, if the trustee rated the rater before: its grade and whether it was distrust.

An L2-regularized logistic regression over the standardized features is fitted on earlier snapshots, each
rating with the features as of its snapshot's start, so every training row is an out-of-sample forecast as the
test ones are. Its probabilities are calibrated, so its threshold needs no labels: :func:`expected_count_threshold`
flags as many ratings as the probabilities expect.

Glossary: ``grade`` the graded outcome in [0, 1] (``reliability``); distrust is a grade below
:data:`DISTRUST`; ``age`` a rating's age in snapshots at the time of the forecast (0: the last snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

DISTRUST = 0.5  # a graded outcome below this is a negative rating
SMOOTHING = 2.0  # pseudo-ratings at the log's share (or mean grade) behind every smoothed figure
RECENCY = 0.5  # weight per snapshot of age in the recency-weighted share
L2 = 10.0  # the logistic regression's penalty on the standardized weights (1 / C)
FEATURES = ("received", "received_count", "received_recent", "received_last", "received_last_count",
            "received_mean_grade", "received_lowest_grade", "rater_given", "rater_given_count",
            "rater_mean_grade", "rater_received", "trustee_given", "reverse_grade", "reverse_known",
            "reverse_distrust")


@dataclass(frozen=True)
class RatingLog:
    """Ratings known at the time of a forecast: rater and trustee ids, grades in [0, 1], ages in snapshots."""

    owner: np.ndarray
    collaborator: np.ndarray
    grade: np.ndarray
    age: np.ndarray

    def __post_init__(self) -> None:
        if len({len(self.owner), len(self.collaborator), len(self.grade), len(self.age)}) != 1:
            raise ValueError("RatingLog: owner, collaborator, grade and age must have one length")


class _Tally:
    """Weighted sums of a value per id, read back smoothed toward a prior."""

    def __init__(self, ids: np.ndarray, value: np.ndarray, weight: np.ndarray) -> None:
        self.names, inverse = np.unique(ids, return_inverse=True)
        self.total = np.bincount(inverse, value * weight, len(self.names))
        self.weight = np.bincount(inverse, weight, len(self.names))

    def at(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sum, weight) per id, zeros for an id never tallied."""
        if not len(self.names):
            return np.zeros(len(ids)), np.zeros(len(ids))
        where = np.minimum(np.searchsorted(self.names, ids), len(self.names) - 1)
        found = self.names[where] == ids
        return np.where(found, self.total[where], 0.0), np.where(found, self.weight[where], 0.0)

    def smoothed(self, ids: np.ndarray, prior: float) -> np.ndarray:
        total, weight = self.at(ids)
        return (total + SMOOTHING * prior) / (weight + SMOOTHING)


def _distrust(log: RatingLog) -> tuple[np.ndarray, float]:
    """(each rating's distrust as 0/1 (n,), the log's share of distrust, Laplace-smoothed)."""
    distrust = (log.grade < DISTRUST).astype(np.float64)
    return distrust, (distrust.sum() + 1) / (len(distrust) + 2)


def received_share(log: RatingLog, ids: np.ndarray) -> np.ndarray:
    """(n,) each id's share of distrust among the ratings it received in ``log``, smoothed toward the log's share
    (the simple rule; the learned rule reads its log as a feature)."""
    distrust, share = _distrust(log)
    return _Tally(log.collaborator, distrust, np.ones(len(distrust))).smoothed(ids, share)


def features(log: RatingLog, owner: np.ndarray, collaborator: np.ndarray) -> np.ndarray:
    """(n, len(FEATURES)) the features of ratings ``owner`` -> ``collaborator`` from the ratings in ``log``."""
    distrust, share = _distrust(log)
    ones = np.ones(len(distrust))
    mean_grade = float(log.grade.mean()) if len(log.grade) else 0.5
    received = _Tally(log.collaborator, distrust, ones)
    recent = _Tally(log.collaborator, distrust, RECENCY ** log.age)
    last = _Tally(log.collaborator, distrust, (log.age == 0).astype(np.float64))
    grades = _Tally(log.collaborator, log.grade, ones)
    given = _Tally(log.owner, distrust, ones)
    grades_given = _Tally(log.owner, log.grade, ones)
    reverse = _reverse_grades(log, owner, collaborator)
    known = ~np.isnan(reverse)
    columns = {
        "received": np.log(received.smoothed(collaborator, share)),
        "received_count": np.log1p(received.at(collaborator)[1]),
        "received_recent": np.log(recent.smoothed(collaborator, share)),
        "received_last": np.log(last.smoothed(collaborator, share)),
        "received_last_count": np.log1p(last.at(collaborator)[1]),
        "received_mean_grade": grades.smoothed(collaborator, mean_grade),
        "received_lowest_grade": _lowest(log, collaborator, mean_grade),
        "rater_given": np.log(given.smoothed(owner, share)),
        "rater_given_count": np.log1p(given.at(owner)[1]),
        "rater_mean_grade": grades_given.smoothed(owner, mean_grade),
        "rater_received": np.log(received.smoothed(owner, share)),
        "trustee_given": np.log(given.smoothed(collaborator, share)),
        "reverse_grade": np.where(known, np.nan_to_num(reverse) - mean_grade, 0.0),
        "reverse_known": known.astype(np.float64),
        "reverse_distrust": (known & (np.nan_to_num(reverse, nan=1.0) < DISTRUST)).astype(np.float64),
    }
    return np.stack([columns[name] for name in FEATURES], axis=1)


def _lowest(log: RatingLog, ids: np.ndarray, default: float) -> np.ndarray:
    """(n,) the lowest grade each id received, ``default`` where it received none."""
    names, inverse = np.unique(log.collaborator, return_inverse=True)
    lowest = np.full(len(names), np.inf)
    np.minimum.at(lowest, inverse, log.grade)
    table = dict(zip(names.tolist(), lowest.tolist()))
    return np.array([table.get(i, default) for i in ids.tolist()], np.float64)


def _reverse_grades(log: RatingLog, owner: np.ndarray, collaborator: np.ndarray) -> np.ndarray:
    """(n,) the latest grade the collaborator gave the owner, NaN where it gave none."""
    order = np.argsort(-log.age, kind="stable")  # oldest first, so a younger rating overwrites an older one
    latest = dict(zip(zip(log.owner[order].tolist(), log.collaborator[order].tolist()), log.grade[order].tolist()))
    return np.array([latest.get((c, o), np.nan) for o, c in zip(owner.tolist(), collaborator.tolist())], np.float64)


class DistrustLogit:
    """L2-regularized logistic regression of distrust on :func:`features`, standardized on its training rows."""

    def __init__(self, l2: float = L2) -> None:
        self.l2 = l2
        self.center = self.scale = self.weights = None

    def fit(self, x: np.ndarray, distrust: np.ndarray) -> "DistrustLogit":
        """Fit on (n, F) features and (n,) boolean labels; raises on a training set without both classes."""
        if not distrust.any() or distrust.all():
            raise ValueError("DistrustLogit.fit: needs both trust and distrust among the training ratings")
        self.center, self.scale = x.mean(axis=0), x.std(axis=0) + 1e-9
        design = self._design(x)
        target = distrust.astype(np.float64)

        def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
            z = design @ w
            gradient = design.T @ (1 / (1 + np.exp(-z)) - target)
            gradient[:-1] += self.l2 * w[:-1]  # the intercept (last) is not penalized
            return float(np.logaddexp(0, z).sum() - target @ z + 0.5 * self.l2 * w[:-1] @ w[:-1]), gradient

        self.weights = minimize(loss, np.zeros(design.shape[1]), jac=True, method="L-BFGS-B").x
        return self

    def probability(self, x: np.ndarray) -> np.ndarray:
        """(n,) P(distrust) of each row."""
        return 1 / (1 + np.exp(-self._design(x) @ self.weights))

    def _design(self, x: np.ndarray) -> np.ndarray:
        return np.concatenate([(x - self.center) / self.scale, np.ones((len(x), 1))], axis=1)


def expected_count_threshold(probability: np.ndarray) -> float:
    """The threshold that flags as many ratings (the highest probabilities) as the probabilities expect to be
    distrust, round(sum p), at least one; needs no labels."""
    if not len(probability):
        return 0.5
    flagged = int(np.clip(round(float(probability.sum())), 1, len(probability)))
    return float(np.sort(probability)[::-1][flagged - 1])
