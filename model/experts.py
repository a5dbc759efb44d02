"""Rule experts inside the pair head, and the stack that combines them with the head's own forecast.

A published T_beh must never be worse than what a simple rule would have published. The head therefore
carries the rules themselves, computed from the same inputs (the pair's physics and the evidence's raw
sums, :data:`model.evidence.STATS`), so that PyTorch, ONNX, the offline scorer and the streaming job all
publish the same combination:

* per memory lambda, the collaborator's empirical-Bayes rate (:class:`EmpiricalBayes`: the posterior
  mean under the population's prior over rates, fitted by :func:`fit_rate_prior`), read as the
  channel rule ``P_tr(d) * (a1 + a2 * rate * on_time(ratio))`` on flagged logs and as the rate of T_col on
  graded ones;
* the population's rate at each memory (the level a log drifts to, tracked online);
* the rule: ``channel_beta`` itself (:func:`model.baselines.rule_choice`: the collaborator's forgetting-weighted
  beta estimate at one memory, shrunk toward the training period's rate by a few pseudo-tasks), read as the
  others are;
* the head's own forecast.

:func:`fit_stack` chooses the weights of a convex combination of them on validation slots the head did
not fit (squared error against T_col, weighted by tasks): unless those slots show a mixture clearly better, the
head's forecast and the rule's averaged where the head reads nothing the rule does not (no loads, no owners'
reports), else the head's alone. Two forecasts of the same evidence that err alike and about as much are best
averaged, and weights fitted on slots that need not resemble the next ones rarely beat the average (README:
*The head and the rule, averaged*).

Glossary: ``K`` experts; ``w`` (``stack``) their weights, non-negative and summing to one.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from model.channel import ON_TIME_BINS, REFERENCE_M, OnTimeCurve, OutageCurve
from model.config import TrustWeights
from model.evidence import COM, SIZED, STATS, TON, N, W

# where each rule reads its raw sums among STATS
COLLABORATOR_RATE = {True: (STATS.index(("collaborator", COM)), STATS.index(("collaborator", TON))),
                     False: (STATS.index(("collaborator", W)), STATS.index(("collaborator", N)))}
POPULATION_RATE = {True: (STATS.index(("population", COM)), STATS.index(("population", TON))),
                   False: (STATS.index(("population", W)), STATS.index(("population", N)))}
SIZE_SUMS = [STATS.index(("collaborator", channel)) for channel in SIZED]

LEVELS = 16  # points of the grid of rates the empirical-Bayes prior lives on


def rate_grid(levels: int = LEVELS) -> np.ndarray:
    return (np.arange(levels) + 0.5) / levels


def fit_rate_prior(successes: np.ndarray, trials: np.ndarray, levels: int = LEVELS, iterations: int = 500
                   ) -> np.ndarray:
    """(levels,) log weights of the prior over :func:`rate_grid` that best explains the devices' (fractional)
    successes in their trials: the nonparametric maximum-likelihood prior, by EM. A device without trials
    says nothing; none at all gives the uniform prior."""
    grid = rate_grid(levels)
    keep = trials > 0
    hits, misses = np.clip(successes[keep], 0, None), np.clip(trials[keep] - successes[keep], 0, None)
    log_like = hits[:, None] * np.log(grid) + misses[:, None] * np.log1p(-grid)  # (devices, levels)
    weights = np.full(levels, 1.0 / levels)
    for _ in range(iterations if keep.any() else 0):
        log_post = np.log(weights) + log_like
        post = np.exp(log_post - log_post.max(axis=1, keepdims=True))
        weights = np.maximum((post / post.sum(axis=1, keepdims=True)).mean(axis=0), 1e-6)
        weights /= weights.sum()
    return np.log(weights)


class EmpiricalBayes(nn.Module):
    """The posterior mean of a success rate given (fractional) successes and trials under a fixed prior over
    :func:`rate_grid`: with a population of reliable and unreliable devices, three successes in three tasks
    say "one of the reliable ones", which no single Beta prior says."""

    def __init__(self, log_prior: np.ndarray | None = None) -> None:
        super().__init__()
        grid = torch.as_tensor(rate_grid(), dtype=torch.float32)
        prior = torch.full((LEVELS,), -np.log(LEVELS)) if log_prior is None else torch.as_tensor(log_prior)
        self.register_buffer("log_rate", torch.log(grid))
        self.register_buffer("log_miss", torch.log1p(-grid))
        self.register_buffer("log_prior", prior.float())

    def forward(self, successes: torch.Tensor, trials: torch.Tensor) -> torch.Tensor:
        """(...) successes and trials -> (...) posterior mean rates."""
        hits, misses = successes.clamp(min=0), (trials - successes).clamp(min=0)
        log_post = self.log_prior + hits[..., None] * self.log_rate + misses[..., None] * self.log_miss
        return (log_post.softmax(-1) * self.log_rate.exp()).sum(-1)


class RuleExperts(nn.Module):
    """Rule forecasts of T_col, (P, 2L + 1): the collaborator's empirical-Bayes rate at each memory, then the
    population's rate at each (:meth:`rates`, which the head's networks read too), then the rule's
    (:meth:`rule_rate`), read through the physics' P_tr(d) and on-time factor of the time ratio on flagged logs
    (:meth:`forecasts`)."""

    def __init__(self, lams: int, flags: bool, weights: TrustWeights, outage: OutageCurve,
                 log_prior: np.ndarray | None = None, on_time: OnTimeCurve | None = None, tr_rate: float = 1.0) -> None:
        super().__init__()
        self.lams, self.flags, self.a_tr, self.a_com = lams, flags, weights.a_tr, weights.a_com
        self.register_buffer("outage", torch.tensor([outage.log_c, outage.alpha, tr_rate], dtype=torch.float32))
        self.rate = EmpiricalBayes(log_prior)
        factor = np.ones(len(ON_TIME_BINS) + 1) if on_time is None else np.asarray(on_time.factor)
        self.register_buffer("on_time_edges", torch.as_tensor(ON_TIME_BINS, dtype=torch.float32))
        self.register_buffer("on_time_factor", torch.as_tensor(factor, dtype=torch.float32))
        self.register_buffer("rule", torch.tensor([1.0, 0.5]))  # the rule's prior strength and mean, until adopted
        self.register_buffer("rule_memory", torch.eye(lams)[-1])  # (L,) one-hot: the lambda the rule reads

    @property
    def count(self) -> int:
        """The rates of :meth:`rates`."""
        return 2 * self.lams

    @property
    def forecast_count(self) -> int:
        """The forecasts of :meth:`forecasts`: the rates', then the rule's."""
        return self.count + 1

    def adopt_rule(self, lam_index: int, strength: float, prior_mean: float) -> None:
        """The rule's memory (an index among the evidence's), prior strength and mean, fitted on the training period."""
        self.rule.copy_(torch.tensor([strength, prior_mean]))
        self.rule_memory.copy_(torch.eye(len(self.rule_memory))[lam_index])

    def transmission(self) -> tuple[OutageCurve, float] | None:
        """The fitted P_tr(d) curve and P(tr) where the distance is unknown, as the rules read them; None on graded
        logs (no transmission flags)."""
        if not self.flags:
            return None
        log_c, alpha, tr_rate = self.outage.tolist()
        return OutageCurve(log_c, alpha), tr_rate

    def rates(self, stats: torch.Tensor) -> torch.Tensor:
        """(P, STATS, L) raw sums -> (P, 2L) the collaborator's empirical-Bayes rates, then the population's."""
        hits, trials = stats[:, COLLABORATOR_RATE[self.flags][0]], stats[:, COLLABORATOR_RATE[self.flags][1]]
        pop_hits, pop_trials = stats[:, POPULATION_RATE[self.flags][0]], stats[:, POPULATION_RATE[self.flags][1]]
        return torch.cat([self.rate(hits, trials), (pop_hits.clamp(min=0) + 1) / (pop_trials.clamp(min=0) + 2)], dim=-1)

    def rule_rate(self, stats: torch.Tensor) -> torch.Tensor:
        """(P, STATS, L) raw sums -> (P, 1) the rule's rate: the collaborator's successes and trials at the rule's
        memory, with ``strength`` pseudo-trials at the prior mean."""
        hits, trials = stats[:, COLLABORATOR_RATE[self.flags][0]], stats[:, COLLABORATOR_RATE[self.flags][1]]
        strength, mean = self.rule.unbind()
        return ((hits.clamp(min=0) @ self.rule_memory + strength * mean)
                / (trials.clamp(min=0) @ self.rule_memory + strength))[:, None]

    def forecasts(self, physics: torch.Tensor, rates: torch.Tensor) -> torch.Tensor:
        """The rules' forecasts of T_col from the pairs' raw physics (P, 5) and the rates of :meth:`rates`: the
        rates themselves (graded) or read through the fitted P_tr(d) (the training period's share of
        transmissions where the distance is unknown) and the on-time factor (flags)."""
        if not self.flags:
            return rates
        distance, ratio = physics[:, 0], physics[:, 3]
        log_c, alpha, tr_rate = self.outage.unbind()
        d = torch.nan_to_num(distance, nan=REFERENCE_M).clamp(min=1.0) / REFERENCE_M
        p_tr = torch.where(torch.isnan(distance), tr_rate.expand_as(d), torch.exp(-torch.exp(log_c) * d ** alpha))
        known = torch.isfinite(ratio) & (ratio > 0)
        log_ratio = torch.log(torch.where(known, ratio, torch.ones_like(ratio)))
        bins = (log_ratio[:, None] >= self.on_time_edges).sum(-1)  # np.digitize's bin (ONNX has no bucketize)
        factor = torch.where(known, self.on_time_factor[bins], torch.ones_like(ratio))
        return p_tr[:, None] * (self.a_tr + self.a_com * (rates * factor[:, None]).clamp(0, 1))


class SizeCorrection(nn.Module):
    """What the task's size moves a pair's forecast by, read from the same inputs as the rules: the size rule
    ``channel_beta_sized`` (:class:`model.baselines.SizedChannelBeta`) minus its flat twin, both read through the
    experts' physics (:meth:`RuleExperts.forecasts`). Per collaborator, at one memory lambda: its rate
    P(com | tr) = (COM + k * prior) / (TON + k) and the line of its computation outcomes on the task's size class x
    (+1 above the split, the training period's typical size, -1 else: :func:`model.evidence.size_x`; the
    :data:`model.evidence.SIZED` sums), its slope shrunk toward flat by ``ridge`` times its evidence, read at the
    scored task's x. Zero until :meth:`adopt` is given the training period's choice
    (:func:`model.baselines.size_choice`): a fleet whose behaviour does not depend on size would pay for the slopes'
    noise.

    Glossary: TS, CS j's on-time-weighted transmissions and computations of tasks of known size; TX, CX, TXX those
    times x, x^2; k the prior strength."""

    def __init__(self, lams: int, split_bits: float | None) -> None:
        super().__init__()
        self.register_buffer("params", torch.tensor([0.0, 1.0, 0.5, 1.0]))  # adopted (0 or 1), k, prior mean, ridge
        self.register_buffer("split", torch.tensor(split_bits or 0.0))  # bits; 0: none (no size evidence)
        self.register_buffer("memory", torch.eye(lams)[-1])  # (L,) one-hot: the lambda the sums are read at

    def adopt(self, lam_index: int, strength: float, prior_mean: float, ridge: float) -> None:
        self.params.copy_(torch.tensor([1.0, strength, prior_mean, ridge]))
        self.memory.copy_(torch.eye(len(self.memory))[lam_index])

    @property
    def adopted(self) -> bool:
        return bool(self.params[0] > 0)

    def forward(self, experts: RuleExperts, stats: torch.Tensor, dst: torch.Tensor | None, physics: torch.Tensor
                ) -> torch.Tensor:
        """stats (n_c, STATS, L) the collaborators' raw sums, dst (P,) each pair's row in them (None: row p), physics
        (P, 5) raw PHYSICS_COLUMNS (the task's size last) -> (P,) the shift of T_beh: zero where the size or j's sized
        evidence is unknown; nothing computed where the correction is not adopted or the log is graded (an export
        traces the model as it stands)."""
        if not experts.flags or not self.adopted:
            return torch.zeros_like(physics[:, 0])  # of the traced input's length (an export's axis is dynamic)
        _, k, prior, ridge = self.params.unbind()
        at = stats @ self.memory  # (n_c, STATS) at the adopted memory
        at = at if dst is None else at.index_select(0, dst)  # (P, STATS)
        com, ton = at[:, COLLABORATOR_RATE[True][0]], at[:, COLLABORATOR_RATE[True][1]]
        ts, cs, tx, cx, txx = at[:, SIZE_SUMS].unbind(-1)
        rate = (com + k * prior) / (ton + k)
        mean_x = tx / ts.clamp(min=1e-12)
        slope = (cx - cs * mean_x) / (txx - tx * mean_x + ridge * ts + 1e-12)
        size = physics[:, 4]
        known = ~torch.isnan(size) & (size > 0) & (ts > 0) & (self.split > 0)
        x = torch.where(size > self.split, torch.ones_like(size), -torch.ones_like(size))  # (P,) its size class
        term = torch.where(known, slope * (x - mean_x), torch.zeros_like(x))
        return (experts.forecasts(physics, (rate + term)[:, None]) - experts.forecasts(physics, rate[:, None]))[:, 0]


def fit_stack(forecasts: np.ndarray, target: np.ndarray, weight: np.ndarray, average: bool, z: float = 2.0
              ) -> np.ndarray:
    """(K,) convex weights of ``forecasts`` (N, K) for ``target`` (N,): a base, unless a mixture beats it clearly,
    i.e. the weighted squared error over the simplex (a quadratic program from the best single column) is lower than
    the base's by more than ``z`` standard errors of the paired per-row differences. The base: the first column (the
    head's own forecast) and the last (the rule's) averaged where ``average`` (the head reads nothing the rule does
    not: two forecasts of the same evidence that err alike and about as much), else the first alone (it reads more).
    A mixture fitted on slots that need not resemble the next ones (a device's change may be over by then) is kept
    only when those slots leave no doubt."""
    w = mixture(forecasts, target, weight)
    base = np.eye(forecasts.shape[1])[0]
    if average:
        base = (base + np.eye(forecasts.shape[1])[-1]) / 2
    difference = (forecasts @ w - target) ** 2 - (forecasts @ base - target) ** 2
    p = weight / weight.sum()
    mean = float(p @ difference)
    se = float(np.sqrt(p @ (difference - mean) ** 2 / max(len(target) - 1, 1)))
    return w if mean < -z * se else base


def mixture(forecasts: np.ndarray, target: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """(K,) convex weights minimizing the weighted squared error of ``forecasts`` (N, K) mixed against
    ``target`` (N,): a quadratic program over the simplex, from the best single column."""
    k = forecasts.shape[1]
    weight = weight / weight.sum()
    gram = (forecasts * weight[:, None]).T @ forecasts
    cross = (forecasts * weight[:, None]).T @ target
    errors = np.diag(gram) - 2 * cross
    start = np.eye(k)[int(np.argmin(errors))]

    def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
        return float(w @ gram @ w - 2 * cross @ w), 2 * gram @ w - 2 * cross

    from scipy.optimize import minimize  # here: training fits, scoring does not (scipy.optimize ~0.5 s to import)

    result = minimize(loss, start, jac=True, method="SLSQP", bounds=[(0.0, 1.0)] * k,
                      constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1.0, "jac": lambda w: np.ones(k)}],
                      options={"ftol": 1e-12, "maxiter": 500})
    w = np.clip(result.x, 0.0, None)
    w = w / w.sum()
    return w if loss(w)[0] <= loss(start)[0] else start
