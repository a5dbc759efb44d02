"""The learned distrust rule for graded logs: its features by hand, its fit, and its label-free threshold."""

from __future__ import annotations

import numpy as np
import pytest

from model.distrust import FEATURES, DistrustLogit, RatingLog, expected_count_threshold, features


def column(x: np.ndarray, name: str) -> np.ndarray:
    return x[:, FEATURES.index(name)]


def test_features_by_hand() -> None:
    # a rated b twice (distrust 0.2 two snapshots ago, trust 0.9 in the last), c rated b (trust 0.8, last),
    # b rated a (distrust 0.1, last); 2 distrust in 4 -> the log's share (2 + 1) / (4 + 2) = 1/2, mean grade 0.5
    log = RatingLog(np.array(["a", "a", "c", "b"]), np.array(["b", "b", "b", "a"]), np.array([0.2, 0.9, 0.8, 0.1]),
                    np.array([2.0, 0.0, 0.0, 0.0]))
    x = features(log, np.array(["a", "c"]), np.array(["b", "b"]))
    share = 1 / 2
    # b received 3, one distrust: (1 + 2 * 1/2) / (3 + 2)
    np.testing.assert_allclose(column(x, "received"), np.log((1 + 2 * share) / 5))
    np.testing.assert_allclose(column(x, "received_count"), np.log1p(3))
    # recency weights 0.25, 1, 1: (0.25 + 1) / (2.25 + 2); in the last snapshot none of 2 was distrust
    np.testing.assert_allclose(column(x, "received_recent"), np.log((0.25 + 2 * share) / 4.25))
    np.testing.assert_allclose(column(x, "received_last"), np.log(2 * share / 4))
    np.testing.assert_allclose(column(x, "received_mean_grade"), (1.9 + 1.0) / 5)
    np.testing.assert_allclose(column(x, "received_lowest_grade"), 0.2)
    # rater a gave 2, one distrust; rater c gave 1, none; a received b's distrust, c received nothing
    np.testing.assert_allclose(column(x, "rater_given"), np.log([(1 + 2 * share) / 4, 2 * share / 3]))
    np.testing.assert_allclose(column(x, "rater_received"), np.log([(1 + 2 * share) / 3, share]))
    np.testing.assert_allclose(column(x, "trustee_given"), np.log((1 + 2 * share) / 3))  # b gave one, distrust
    # b rated a (0.1): the reverse of a -> b; nobody's rating of c by b
    np.testing.assert_allclose(column(x, "reverse_known"), [1, 0])
    np.testing.assert_allclose(column(x, "reverse_grade"), [0.1 - 0.5, 0])
    np.testing.assert_allclose(column(x, "reverse_distrust"), [1, 0])


def test_a_fresh_account_reads_the_log_prior() -> None:
    log = RatingLog(np.array(["a"]), np.array(["b"]), np.array([0.9]), np.array([0.0]))
    x = features(log, np.array(["z"]), np.array(["y"]))
    np.testing.assert_allclose(column(x, "received"), np.log(1 / 3))  # (0 + 1) / (1 + 2)
    np.testing.assert_allclose(column(x, "received_lowest_grade"), 0.9)  # the log's mean grade
    assert column(x, "received_count")[0] == 0 and column(x, "reverse_known")[0] == 0


def test_the_logit_learns_a_separating_feature_and_ranks_by_it() -> None:
    rng = np.random.default_rng(0)
    signal = rng.normal(size=400)
    x = np.stack([signal, rng.normal(size=400)], axis=1)
    label = rng.random(400) < 1 / (1 + np.exp(-3 * signal))
    model = DistrustLogit().fit(x, label)
    p = model.probability(x)
    assert abs(model.weights[0]) > 5 * abs(model.weights[1])  # the noise column barely counts
    assert p.sum() == pytest.approx(label.sum(), rel=0.05)  # calibrated: the intercept is fitted
    assert np.all(np.diff(model.probability(np.array([[-1.0, 0], [0, 0], [1, 0]]))) > 0)
    with pytest.raises(ValueError, match="both trust and distrust"):
        DistrustLogit().fit(x, np.zeros(400, bool))


def test_expected_count_threshold_by_hand() -> None:
    p = np.array([0.9, 0.6, 0.3, 0.1, 0.05])  # sum 1.95 -> flag the two highest
    assert expected_count_threshold(p) == 0.6
    assert expected_count_threshold(np.array([0.01, 0.02])) == 0.02  # at least one flagged
    assert expected_count_threshold(np.array([])) == 0.5


def test_the_learned_rule_reads_harsh_raters_the_simple_rule_misses() -> None:
    """Distrust follows the rater (a fifth of raters are harsh) as much as the trustee: fitted on earlier snapshots,
    the learned rule ranks the next snapshot's ratings better than the trustee's share alone."""
    from model.snapshots import auc, learned_rule

    rng = np.random.default_rng(1)
    owner, collaborator = rng.integers(0, 50, (2, 6000))
    p = 0.05 + 0.5 * (owner < 10) + 0.3 * (collaborator < 5)
    grade = np.where(rng.random(6000) < p, 0.1, 0.9)
    snapshot = np.repeat(np.arange(4), 1500)
    ids = np.char.add("d", owner.astype(str)), np.char.add("d", collaborator.astype(str))
    labelled = []
    for j in range(1, 4):
        before, now = snapshot < j, snapshot == j
        log = RatingLog(ids[0][before], ids[1][before], grade[before], (j - 1 - snapshot[before]).astype(float))
        labelled.append((features(log, ids[0][now], ids[1][now]), grade[now] < 0.5))
    learned = learned_rule(labelled[:-1], labelled[-1][0])
    simple = labelled[-1][0][:, FEATURES.index("received")]
    label = labelled[-1][1]
    assert auc(learned, label) > auc(simple, label) + 0.1
    assert learned_rule([(labelled[0][0], np.zeros(len(labelled[0][1]), bool))], labelled[1][0]) is None
