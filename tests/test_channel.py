"""The fitted channel curves: the paper's outage curve as the prior, recovered by the fit, on-time by hand."""

from __future__ import annotations

import numpy as np
import pytest

from model import physics
from model.channel import ON_TIME_BINS, OnTimeCurve, OutageCurve
from model.config import SystemParams


def test_the_prior_is_the_papers_rayleigh_outage_curve() -> None:
    distance = np.array([1.0, 50.0, 150.0, 300.0, 420.0])
    params = SystemParams()
    want = physics.outage_success(distance, 0.1, params, 0.0)
    np.testing.assert_allclose(OutageCurve.prior(params, tx_w=0.1).p_tr(distance), want, rtol=1e-12)


def test_the_fit_recovers_a_curve_from_outcomes_only() -> None:
    rng = np.random.default_rng(1)
    truth = OutageCurve(log_c=-3.0, alpha=3.0)
    distance = rng.uniform(20, 400, size=4000)
    trials = rng.integers(1, 4, size=4000).astype(float)
    successes = rng.binomial(trials.astype(int), truth.p_tr(distance)).astype(float)
    fitted = OutageCurve.fit(distance, trials, successes)  # starting from the paper's (-4.6, 4)
    assert fitted.log_c == pytest.approx(-3.0, abs=0.15) and fitted.alpha == pytest.approx(3.0, abs=0.15)
    grid = np.linspace(10, 400, 50)
    assert np.abs(fitted.p_tr(grid) - truth.p_tr(grid)).max() < 0.03
    assert (np.diff(fitted.p_tr(grid)) <= 0).all()  # monotone in distance


def test_nothing_to_fit_keeps_the_prior() -> None:
    prior = OutageCurve(-4.0, 4.0)
    assert OutageCurve.fit(np.array([np.nan, 10.0]), np.array([1.0, 2.0]), np.array([1.0, 2.0]), prior) == prior


def test_on_time_curve_by_hand() -> None:
    # two bins: ratio 0.5 (log -0.69) with 8 of 8 computed, ratio 2 (log 0.69) with 2 of 8
    ratio = np.array([0.5, 2.0])
    curve = OnTimeCurve.fit(ratio, np.array([8.0, 8.0]), np.array([8.0, 2.0]))
    mean = (10 + 1) / (16 + 2)
    fast, slow = np.digitize(np.log(ratio), ON_TIME_BINS)
    assert curve.factor[fast] == pytest.approx((8 + 2 * mean) / 10 / mean)
    assert curve.factor[slow] == pytest.approx((2 + 2 * mean) / 10 / mean)
    assert curve(np.array([0.5, 2.0, np.nan, 0.0])).tolist() == pytest.approx(
        [curve.factor[fast], curve.factor[slow], 1.0, 1.0])
    empty = next(k for k in range(len(curve.factor)) if k not in (fast, slow))
    assert curve.factor[empty] == pytest.approx(1.0)
