"""The head's rule experts and the stack: posteriors, priors and mixtures against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.channel import ON_TIME_BINS, OnTimeCurve, OutageCurve
from model.config import TrustWeights
from model.evidence import STATS
from model.experts import EmpiricalBayes, RuleExperts, fit_rate_prior, fit_stack, mixture, rate_grid


def test_empirical_bayes_posterior_mean_by_hand() -> None:
    log_prior = np.log(np.r_[np.full(8, 0.5 / 8), np.full(8, 0.5 / 8)])
    rate = EmpiricalBayes(log_prior)
    grid = rate_grid()
    for hits, trials in ((3.0, 3.0), (0.5, 2.5), (0.0, 0.0)):
        like = grid ** hits * (1 - grid) ** (trials - hits) * np.exp(log_prior)
        want = (like * grid).sum() / like.sum()
        got = rate(torch.tensor([hits]), torch.tensor([trials])).item()
        assert got == pytest.approx(want, rel=1e-5)


def test_a_bimodal_population_gives_a_bimodal_prior() -> None:
    rng = np.random.default_rng(0)
    rates = np.where(rng.random(400) < 0.5, 0.9, 0.2)
    trials = rng.integers(5, 30, size=400).astype(float)
    hits = rng.binomial(trials.astype(int), rates).astype(float)
    prior = np.exp(fit_rate_prior(hits, trials))
    grid = rate_grid()
    assert prior.sum() == pytest.approx(1.0)
    assert prior[np.abs(grid - 0.9) < 0.1].sum() > 0.35 and prior[np.abs(grid - 0.2) < 0.1].sum() > 0.35
    assert prior[(grid > 0.4) & (grid < 0.7)].sum() < 0.05  # nobody lives in between
    # under it, three successes in three say "reliable" much more than a Beta(1, 1) prior's 0.8 does
    three = EmpiricalBayes(np.log(prior))(torch.tensor([3.0]), torch.tensor([3.0])).item()
    assert three > 0.85
    np.testing.assert_allclose(np.exp(fit_rate_prior(np.zeros(3), np.zeros(3))), 1 / len(grid))  # nothing known


def test_rule_forecasts_by_hand() -> None:
    outage = OutageCurve(log_c=np.log(0.5), alpha=2.0)
    on_time = OnTimeCurve(tuple(np.linspace(0.5, 1.5, len(ON_TIME_BINS) + 1)))
    experts = RuleExperts(2, True, TrustWeights(), outage, on_time=on_time, tr_rate=0.7)
    stats = torch.zeros(2, len(STATS), 2)
    stats[:, 0] = torch.tensor([[3.0, 1.0], [0.0, 0.0]])  # j's COM per lambda
    stats[:, 1] = torch.tensor([[4.0, 1.0], [0.0, 0.0]])  # j's TON
    stats[:, 4] = 30.0  # the population's COM
    stats[:, 5] = 40.0  # ... and TON
    rates = experts.rates(stats)
    uniform = EmpiricalBayes()
    want_rates = [uniform(torch.tensor(3.0), torch.tensor(4.0)).item(), uniform(torch.tensor(1.0), torch.tensor(1.0)).item(),
                  31 / 42, 31 / 42]
    np.testing.assert_allclose(rates[0].numpy(), want_rates, rtol=1e-5)
    physics = torch.tensor([[200.0, 2e9, 4e9, 1.0, 1e6], [float("nan")] * 5])
    got = experts.forecasts(physics, rates)
    p_tr = float(outage.p_tr(np.array([200.0]))[0])
    factor = float(on_time(np.array([1.0]))[0])
    want = p_tr * (0.6 + 0.4 * np.minimum(np.array(want_rates) * factor, 1.0))
    np.testing.assert_allclose(got[0].numpy(), want, rtol=1e-5)
    # unknown distance: the training period's share of transmissions; unknown ratio: no on-time factor
    np.testing.assert_allclose(got[1].numpy(), 0.7 * (0.6 + 0.4 * rates[1].numpy()), rtol=1e-5)
    graded = RuleExperts(2, False, TrustWeights(), outage)
    assert torch.equal(graded.forecasts(physics, rates), rates)


def test_the_rule_expert_by_hand() -> None:
    """channel_beta's estimate at the adopted memory: (successes + k * prior mean) / (trials + k)."""
    experts = RuleExperts(2, True, TrustWeights(), OutageCurve(log_c=np.log(0.5), alpha=2.0))
    stats = torch.zeros(2, len(STATS), 2)
    stats[:, 0] = torch.tensor([[3.0, 1.0], [0.0, 0.0]])  # j's COM per lambda
    stats[:, 1] = torch.tensor([[4.0, 2.0], [0.0, 0.0]])  # j's TON
    experts.adopt_rule(0, 2.0, 0.6)
    np.testing.assert_allclose(experts.rule_rate(stats)[:, 0].numpy(), [(3 + 1.2) / (4 + 2), 0.6], rtol=1e-6)
    experts.adopt_rule(1, 1.0, 0.5)
    np.testing.assert_allclose(experts.rule_rate(stats)[:, 0].numpy(), [(1 + 0.5) / (2 + 1), 0.5], rtol=1e-6)
    assert experts.forecast_count == experts.count + 1


def test_mixture_by_hand() -> None:
    target = np.array([0.0, 1.0, 0.0, 1.0])
    # one forecast too high on the zeros, the other too low on the ones: a*f1 + (1-a)*f2 errs by 0.4a on the
    # zeros and 0.4(1-a) on the ones, least at a = 1/2
    forecasts = np.array([[0.4, 0.0], [1.0, 0.6], [0.4, 0.0], [1.0, 0.6]])
    np.testing.assert_allclose(mixture(forecasts, target, np.ones(4)), [0.5, 0.5], atol=1e-6)
    # with the ones weighing three times as much: (0.4a)^2 + 3(0.4(1-a))^2 is least at a = 3/4
    np.testing.assert_allclose(mixture(forecasts, target, np.array([1.0, 3.0, 1.0, 3.0])), [0.75, 0.25], atol=1e-6)


def test_the_stack_averages_the_own_forecast_and_the_rule_unless_a_mixture_wins_clearly() -> None:
    rng = np.random.default_rng(1)
    truth = rng.uniform(0.2, 0.9, 4000)
    target = (rng.random(4000) < truth).astype(float)
    good, noisy = truth, np.clip(truth + rng.normal(0, 0.3, 4000), 0, 1)
    # columns: the head's own forecast, another expert, the rule (last)
    near = np.clip(truth + rng.normal(0, 0.01, 4000), 0, 1)  # a rule barely different from the own forecast
    columns = np.stack([good, noisy, near], 1)
    assert fit_stack(columns, target, np.ones(4000), average=True).tolist() == [0.5, 0.0, 0.5]
    assert fit_stack(columns, target, np.ones(4000), average=False).tolist() == [1.0, 0.0, 0.0]  # the head reads more
    # an expert that is the truth where the own forecast and the rule are noisy: the mixture leans on it either way
    for average in (True, False):
        assert fit_stack(np.stack([noisy, good, noisy[::-1]], 1), target, np.ones(4000), average)[1] > 0.8
    # a head far better than a noisy rule is published (nearly) alone, not averaged with it
    assert fit_stack(np.stack([good, noisy, noisy], 1), target, np.ones(4000), average=True)[0] > 0.8
