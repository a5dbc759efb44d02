"""Rule-based trust baselines, online over the same histories as BM.

Each scorer is advanced slot by slot (:meth:`advance`, reading a slot's edges
after it has been scored) and answers for any (owner, collaborator) pair from
the slots it has read. Each slot edge is one unit of evidence: ``T_col``
successes and ``1 - T_col`` failures.

* Beta reputation (Josang and Ismail) with forgetting factor ``lam`` per slot:
  ``E = (r_ij + w*R_j + 1) / (r_ij + s_ij + w*(R_j + S_j) + 2)`` where r, s is the
  owner's own evidence about j and R, S everyone's, discounted by ``w``.
* QS-Trust-style QoS trust: direct trust ``D_ij`` is an exponentially weighted
  mean (weight ``beta`` on the newest slot) of T_col from i's own tasks with j;
  the recommendation ``Rec_j`` is the mean of the other owners' direct trust in j,
  weighted by their observation counts; ``T = a*D_ij + (1 - a)*Rec_j`` with
  ``a = n_ij / (n_ij + k)`` (more own observations, more own weight), and 0.5
  when nothing is known.
* Running mean (``mean``): the mean T_col of every edge read so far, the same for
  every pair; a method that beats it knows something about the devices, not
  only the log's level.
* Channel x beta (``channel_beta``), the physics-aware rule: ``T = P_tr(d_ij) * (a1 + a2 * P(com | tr, j))``
  with P_tr the outage curve fitted to the training period's transmissions (:mod:`model.channel`),
  and P(com | tr, j) the collaborator's forgetting-weighted beta estimate times an on-time factor
  (the training period's P(com | tr) per bin of offload time over the owner's local time, relative
  to its mean; from the statuses' physics for the pair scored, and j's evidence counted against the
  factor of its tasks' reported times). lambda and the prior strength are chosen on the training
  period only. Graded logs: the beta estimate of j's T_col with forgetting.
* Channel x beta by task size (``channel_beta_sized``): ``channel_beta`` with P(com | tr, j) a line in the task's
  size class (above the training period's typical size or not), fitted per collaborator and shrunk toward flat
  (:class:`SizedChannelBeta`): a defence against opportunistic service; equal to ``channel_beta`` where every task
  has one size.
* Fairness and goodness (``fxg``, Kumar et al. 2016), on the weights ``2 * T_col - 1``: the goodness of
  j is the fairness-weighted mean of its incoming weights, the fairness of i one minus half its mean
  deviation from the goodness of those it rated, iterated to a fixed point over every edge read;
  ``T = (f(i) * g(j) + 1) / 2`` (0.5 for a j nobody rated).

Every scorer is built by a factory ``(history, training slots) -> scorer`` (:data:`RULES`), so a rule
may fit itself to the training period and read the pairs' statuses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Protocol

import numpy as np

from model.channel import OnTimeCurve, OutageCurve
from model.config import SystemParams, TrustWeights
from model.evidence import size_x
from model.graphs import SlotGraph
from model.history import History
from model.metrics import rmse
from model.targets import fit_outage, targets


@dataclass(frozen=True)
class BetaParams:
    lam: float = 0.9  # forgetting factor per slot
    w: float = 0.1  # weight of other owners' evidence


@dataclass(frozen=True)
class QSParams:
    beta: float = 0.5  # weight of the newest observation in direct trust
    k: float = 2.0  # observations at which own and recommended trust weigh equally


class OnlineScorer(Protocol):
    def advance(self, graph: SlotGraph | None) -> None: ...

    def score(self, src: np.ndarray, dst: np.ndarray, profile: np.ndarray | None = None) -> np.ndarray:
        """T_beh of each pair for a task of ``profile`` (P, 2) size and density (None: unknown)."""


class _PairTable:
    """Per-pair values over n devices, in a dict keyed by src * n + dst (pairs are sparse)."""

    def __init__(self, n: int, default: float) -> None:
        self.n, self.default, self.values = n, default, {}

    def get(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        keys = (src * self.n + dst).tolist()
        return np.array([self.values.get(k, self.default) for k in keys], dtype=np.float64)

    def put(self, src: np.ndarray, dst: np.ndarray, values: np.ndarray) -> None:
        self.values.update(zip((src * self.n + dst).tolist(), values.tolist()))


class BetaReputation:
    def __init__(self, n: int, params: BetaParams = BetaParams()) -> None:
        self.params, self.slots = params, 0
        self.r, self.s = _PairTable(n, 0.0), _PairTable(n, 0.0)  # stored undecayed; scaled by lam**-slot
        self.big_r, self.big_s = np.zeros(n), np.zeros(n)

    def _decay(self) -> float:
        return self.params.lam ** self.slots

    def advance(self, graph: SlotGraph | None) -> None:
        self.slots += 1
        if self._decay() < 1e-150:  # fold the pending decay into the stored values before it underflows
            for table in (self.r, self.s):
                table.values = {k: v * self._decay() for k, v in table.values.items()}
            self.slots = 0
        self.big_r *= self.params.lam
        self.big_s *= self.params.lam
        if graph is None:
            return
        scale = 1.0 / self._decay()  # evidence added now, expressed in undecayed units
        good, bad = graph.t_col, 1 - graph.t_col
        self.r.put(graph.src, graph.dst, self.r.get(graph.src, graph.dst) + good * scale)
        self.s.put(graph.src, graph.dst, self.s.get(graph.src, graph.dst) + bad * scale)
        np.add.at(self.big_r, graph.dst, good)
        np.add.at(self.big_s, graph.dst, bad)

    def score(self, src: np.ndarray, dst: np.ndarray, profile: np.ndarray | None = None) -> np.ndarray:
        decay, w = self._decay(), self.params.w
        r, s = self.r.get(src, dst) * decay, self.s.get(src, dst) * decay
        return (r + w * self.big_r[dst] + 1) / (r + s + w * (self.big_r[dst] + self.big_s[dst]) + 2)


class QSTrust:
    def __init__(self, n: int, params: QSParams = QSParams()) -> None:
        self.params = params
        self.direct, self.count = _PairTable(n, 0.5), _PairTable(n, 0.0)
        self.weighted, self.total = np.zeros(n), np.zeros(n)  # per collaborator: sum(D * count), sum(count)

    def advance(self, graph: SlotGraph | None) -> None:
        if graph is None:
            return
        direct, count = self.direct.get(graph.src, graph.dst), self.count.get(graph.src, graph.dst)
        updated = np.where(count > 0, (1 - self.params.beta) * direct + self.params.beta * graph.t_col, graph.t_col)
        np.add.at(self.weighted, graph.dst, updated * (count + 1) - direct * count)
        np.add.at(self.total, graph.dst, 1.0)
        self.direct.put(graph.src, graph.dst, updated)
        self.count.put(graph.src, graph.dst, count + 1)

    def score(self, src: np.ndarray, dst: np.ndarray, profile: np.ndarray | None = None) -> np.ndarray:
        direct, count = self.direct.get(src, dst), self.count.get(src, dst)
        others = self.total[dst] - count
        recommended = np.where(others > 0, (self.weighted[dst] - direct * count) / np.maximum(others, 1e-12), 0.5)
        own = count / (count + self.params.k)
        return own * direct + (1 - own) * recommended


class RunningMean:
    def __init__(self, n: int) -> None:
        self.total, self.count = 0.0, 0

    def advance(self, graph: SlotGraph | None) -> None:
        if graph is not None:
            self.total += float(graph.t_col.sum())
            self.count += len(graph.t_col)

    def score(self, src: np.ndarray, dst: np.ndarray, profile: np.ndarray | None = None) -> np.ndarray:
        return np.full(len(src), self.total / self.count if self.count else 0.5)


@dataclass(frozen=True)
class ChannelBetaParams:
    lam: float = 0.98  # forgetting factor per slot
    strength: float = 2.0  # prior pseudo-tasks at the prior mean


class ChannelBeta:
    """P_tr(d_ij) * (a1 + a2 * P(com | tr, j)): the physics-aware rule (see the module docstring)."""

    def __init__(self, history: History, outage: OutageCurve, on_time: OnTimeCurve | None,
                 reported_on_time: OnTimeCurve | None, prior_mean: float, params: ChannelBetaParams = ChannelBetaParams(),
                 tr_rate: float = 1.0, weights: TrustWeights = TrustWeights(), system: SystemParams = SystemParams()
                 ) -> None:
        """on_time: the factor over the physics' time ratio (pairs scored); reported_on_time: over the tasks'
        reported ratio (j's evidence)."""
        n = len(history.index)
        self.history, self.outage, self.on_time, self.params = history, outage, on_time, params
        self.reported_on_time = reported_on_time
        self.prior_mean, self.tr_rate, self.weights, self.system = prior_mean, tr_rate, weights, system
        self.flags = history.has_flags
        self.hits, self.trials = np.zeros(n), np.zeros(n)  # j's decayed successes and expected-success weight
        self.read = 0  # relative slots read

    def _physics(self, src: np.ndarray, dst: np.ndarray, end: int, profile: np.ndarray | None
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(offload over local time, distance) of each pair from the statuses before the end of slot ``end``."""
        profile = np.full((len(src), 2), np.nan) if profile is None else profile
        physics = self.history.pair_physics(src, dst, np.full(len(src), end), profile, self.system)
        return physics[:, 3].astype(np.float64), physics[:, 0].astype(np.float64)

    def advance(self, graph: SlotGraph | None) -> None:
        self.hits *= self.params.lam
        self.trials *= self.params.lam
        if graph is not None and len(graph.src):
            if self.flags:
                np.add.at(self.hits, graph.dst, graph.com)
                np.add.at(self.trials, graph.dst, self._weight(graph))
            else:
                np.add.at(self.hits, graph.dst, graph.t_col * graph.tasks)
                np.add.at(self.trials, graph.dst, graph.tasks)
        self.read += 1

    def _weight(self, graph: SlotGraph) -> np.ndarray:
        """(E,) each edge's expected-success weight: its transmissions, times the on-time factor of its reported time."""
        if self.reported_on_time is None:
            return graph.tr
        return graph.tr * self.reported_on_time(graph.time_ratio)

    def score(self, src: np.ndarray, dst: np.ndarray, profile: np.ndarray | None = None) -> np.ndarray:
        if not self.flags:
            return np.clip(self._rate(dst), 0.0, 1.0)
        return self._trust(self._rate(dst), self._pair_terms(src, dst, profile))

    def _rate(self, dst: np.ndarray) -> np.ndarray:
        """j's forgetting-weighted beta estimate of P(com | tr), shrunk toward the prior mean by the strength."""
        k = self.params.strength
        return (self.hits[dst] + k * self.prior_mean) / (self.trials[dst] + k)

    def _pair_terms(self, src: np.ndarray, dst: np.ndarray, profile: np.ndarray | None
                    ) -> tuple[np.ndarray | float, np.ndarray]:
        """(the on-time factor of each pair's task, P_tr(d_ij)) from the statuses' physics."""
        ratio, distance = self._physics(src, dst, self.read - 1, profile)
        factor = self.on_time(ratio) if self.on_time is not None else 1.0
        return factor, self.outage.read(distance, self.tr_rate)

    def _trust(self, rate: np.ndarray, terms: tuple[np.ndarray | float, np.ndarray]) -> np.ndarray:
        """P_tr(d_ij) * (a1 + a2 * rate * the on-time factor), ``terms`` from :meth:`_pair_terms`."""
        factor, p_tr = terms
        return p_tr * (self.weights.a_tr + self.weights.a_com * np.clip(rate * factor, 0.0, 1.0))


STRENGTHS = (1.0, 2.0, 4.0, 8.0)  # the prior pseudo-tasks channel_beta's fit chooses among


def channel_beta_grid(lams: Iterable[float]) -> tuple[ChannelBetaParams, ...]:
    """channel_beta's candidates: every forgetting factor of ``lams`` with every prior strength of STRENGTHS."""
    return tuple(ChannelBetaParams(lam, k) for lam in lams for k in STRENGTHS)


CHANNEL_BETA_GRID = channel_beta_grid((0.9, 0.95, 0.98, 0.99))


@dataclass(frozen=True)
class SizedParams(ChannelBetaParams):
    ridge: float = 1.0  # the size class's variance (x = +-1) a collaborator's slope is shrunk by


SIZED_GRID = tuple(SizedParams(p.lam, p.strength, ridge) for p in CHANNEL_BETA_GRID for ridge in (0.25, 1.0, 4.0))


class SizedChannelBeta(ChannelBeta):
    """``channel_beta`` whose P(com | tr, j) is a line in the task's size class: per collaborator, the
    forgetting-weighted least-squares line of its computation outcomes on x (+1 for a task larger than the training
    period's typical size, -1 else: :func:`model.evidence.size_x`), its slope shrunk toward zero by ``ridge`` times
    its evidence, read at the class of the task scored (at j's mean x where a size is unknown). A device that serves
    small tasks and fails large ones (opportunistic service) keeps its trust for the former and loses it for the
    latter; where every task has one size it is ``channel_beta``.

    Glossary: W, H j's weight and successes over tasks of known size; WX, HX, WXX their sums times x, x^2."""

    def __init__(self, *args, split_bits: float | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        n = len(self.hits)
        self.split_bits = split_bits  # None: no size split (then it is channel_beta)
        self.sized = np.zeros((5, n))  # W, H, WX, HX, WXX

    def advance(self, graph: SlotGraph | None) -> None:
        self.sized *= self.params.lam
        if graph is not None and len(graph.src) and self.flags:
            x = self._x(graph.profile[:, 0])
            known = np.isfinite(x)
            w, h, u, dst = self._weight(graph)[known], graph.com[known], x[known], graph.dst[known]
            for row, values in enumerate((w, h, w * u, h * u, w * u * u)):
                np.add.at(self.sized[row], dst, values)
        super().advance(graph)

    def score(self, src: np.ndarray, dst: np.ndarray, profile: np.ndarray | None = None) -> np.ndarray:
        if not self.flags or profile is None:
            return super().score(src, dst, profile)
        return self._trust(self._rate(dst) + self._size_term(dst, profile), self._pair_terms(src, dst, profile))

    def size_shift(self, src: np.ndarray, dst: np.ndarray, profile: np.ndarray | None = None) -> np.ndarray:
        """What the task's size moves each pair's trust by: this rule's score minus ``channel_beta``'s with the same
        evidence and parameters (the pairs' physics computed once for both)."""
        if not self.flags or profile is None:
            return np.zeros(len(src))
        terms, rate = self._pair_terms(src, dst, profile), self._rate(dst)
        return self._trust(rate + self._size_term(dst, profile), terms) - self._trust(rate, terms)

    def _size_term(self, dst: np.ndarray, profile: np.ndarray) -> np.ndarray:
        """(P,) the slope of j's line times how far the task's x lies from j's mean x (0 where either is unknown)."""
        x = self._x(profile[:, 0])
        w, h, wx, hx, wxx = self.sized[:, dst]
        mean_x = wx / np.maximum(w, 1e-12)
        slope = (hx - h * mean_x) / (wxx - wx * mean_x + self.params.ridge * w + 1e-12)
        return np.where(np.isfinite(x) & (w > 0), slope * (np.nan_to_num(x) - mean_x), 0.0)

    def _x(self, size_bits: np.ndarray) -> np.ndarray:
        return size_x(size_bits, self.split_bits)


def channel_beta(history: History, train_slots: list[int], grid: Iterable[ChannelBetaParams] = CHANNEL_BETA_GRID,
                 system: SystemParams = SystemParams()) -> ChannelBeta:
    """The rule fitted to the training period: its curves from the training edges, lambda and the prior
    strength chosen by RMSE against T_col on the training period's last fifth."""
    return _fitted(history, train_slots, grid, lambda common, params: ChannelBeta(**common, params=params,
                                                                                  system=system), system)


def task_sizes(history: History, slots: Iterable[int]) -> np.ndarray:
    """The known mean task sizes (bits) of the edges of ``slots``."""
    wanted = set(slots)
    sizes = np.concatenate([g.profile[:, 0] for t, g in enumerate(history.graphs) if t in wanted and g is not None]
                           or [np.zeros(0)])
    return sizes[np.isfinite(sizes) & (sizes > 0)]


def size_split(history: History, slots: Iterable[int]) -> float | None:
    """The typical known task size of the edges of ``slots``, which parts large tasks from small ones: their geometric
    mean (the median of log-uniform sizes, and strictly between the smallest and the largest however few sizes there
    are); None where they have fewer than two sizes (nothing to part)."""
    sizes = task_sizes(history, slots)
    return float(np.exp(np.log(sizes).mean())) if len(np.unique(sizes)) > 1 else None


def channel_beta_sized(history: History, train_slots: list[int], grid: Iterable[SizedParams] = SIZED_GRID,
                       system: SystemParams = SystemParams()) -> SizedChannelBeta:
    """:class:`SizedChannelBeta` fitted as :func:`channel_beta` is, its ridge chosen with lambda and the prior strength;
    tasks are split at the training edges' typical task size (:func:`size_split`)."""
    split = size_split(history, train_slots)
    return _fitted(history, train_slots, grid, lambda common, params: SizedChannelBeta(
        **common, params=params, system=system, split_bits=split), system)


def size_matters(history: History, train_slots: list[int], z: float = 0.0,
                 sized: SizedChannelBeta | None = None) -> bool:
    """Whether the task's size is worth reading: :func:`channel_beta_sized`'s one-slot-ahead forecasts (``sized``: that
    rule already fitted, not yet advanced) beat :func:`channel_beta`'s over the training period after its first fifth
    (a burn-in) by more than ``z`` standard errors of the paired squared errors. A fleet whose behaviour does not
    depend on size would pay for the correction's noise (README: *Manipulation*), so it is read only where the log
    shows it helps. (Chosen on seeds 610-612 and 620-622, where the statistic parts the opportunistic runs, -2.0 to
    -1.4, from the honest ones, +2.1 to +3.5; the last fifth alone gave -2.1 to 0.0 against +1.3 to +1.8.)"""
    window = train_slots[len(train_slots) // 5:]
    observed = targets(history, window).t_col
    if len(observed) < 2:
        return False
    sized = channel_beta_sized(history, train_slots) if sized is None else sized
    difference = ((predict_edges(sized, history, window) - observed) ** 2
                  - (predict_edges(channel_beta(history, train_slots), history, window) - observed) ** 2)
    return bool(difference.mean() < -z * difference.std(ddof=1) / np.sqrt(len(difference)))


@dataclass(frozen=True)
class RuleChoice:
    """The rule BM's head carries as an expert (:meth:`model.experts.RuleExperts.adopt_rule`): ``channel_beta``'s
    parameters, its lambda among the evidence's memories."""

    lam: float
    strength: float
    prior_mean: float


@dataclass(frozen=True)
class SizeChoice(RuleChoice):
    """The size correction BM's head adopts (:class:`model.experts.SizeCorrection`): the sized rule's parameters."""

    ridge: float


def rule_choice(history: History, train_slots: list[int], lams: tuple[float, ...]) -> RuleChoice:
    """:func:`channel_beta` fitted with lambda among the evidence's memories ``lams`` (what the head's sums are kept
    at), as the head's rule expert reads it."""
    fitted = channel_beta(history, train_slots, channel_beta_grid(lams))
    return RuleChoice(fitted.params.lam, fitted.params.strength, float(fitted.prior_mean))


def size_choice(history: History, train_slots: list[int], lams: tuple[float, ...]) -> SizeChoice | None:
    """The size correction the training period supports: :func:`channel_beta_sized` fitted with lambda among the
    evidence's memories ``lams`` (what the head's sums are kept at), where the log has flags and more than one task
    size and :func:`size_matters` says it helps; else None."""
    if not history.has_flags or size_split(history, train_slots) is None:
        return None
    grid = [params for params in SIZED_GRID if params.lam in lams]
    sized = channel_beta_sized(history, train_slots, grid)
    choice = SizeChoice(sized.params.lam, sized.params.strength, sized.prior_mean, sized.params.ridge)
    return choice if size_matters(history, train_slots, sized=sized) else None


def _fitted(history: History, train_slots: list[int], grid: Iterable[ChannelBetaParams],
            build: Callable[[dict, ChannelBetaParams], ChannelBeta], system: SystemParams) -> ChannelBeta:
    """The member of ``grid``, built by ``build(common, params)`` (common: :class:`ChannelBeta`'s keywords fitted to the
    training period: its curves, prior mean and transmission rate), with the best RMSE against T_col on the training
    period's last fifth."""
    batch = targets(history, train_slots)
    on_time, reported_on_time, tr_rate = None, None, 1.0
    if history.has_flags:
        q = batch.query
        ratio = history.pair_physics(q.src, q.dst, q.end + 1, q.profile, system)[:, 3].astype(np.float64)
        on_time = OnTimeCurve.fit(ratio, batch.tr, batch.com)
        reported_on_time = OnTimeCurve.fit(batch.time_ratio, batch.tr, batch.com)
        prior_mean = (batch.com.sum() + 1) / (batch.tr.sum() + 2)
        tr_rate = (batch.tr.sum() + 1) / (batch.flagged.sum() + 2)
    else:
        prior_mean = float(np.average(batch.t_col, weights=batch.tasks)) if len(batch) else 0.5
    common = {"history": history, "outage": fit_outage(history, train_slots, system), "on_time": on_time,
              "reported_on_time": reported_on_time, "prior_mean": prior_mean, "tr_rate": tr_rate}
    tail = train_slots[int(len(train_slots) * 0.8):]
    observed = targets(history, tail).t_col
    best = min(grid, key=lambda params: rmse(predict_edges(build(common, params), history, tail), observed))
    return build(common, best)


class FairnessGoodness:
    """Kumar et al.'s fairness and goodness over every edge read (see the module docstring)."""

    def __init__(self, n: int, iterations: int = 100, tolerance: float = 1e-6) -> None:
        self.n, self.iterations, self.tolerance = n, iterations, tolerance
        self.sums: dict[int, list[float]] = {}  # pair key -> [sum of weights, count]
        self.fairness, self.goodness = np.ones(n), np.zeros(n)
        self.stale = False

    def advance(self, graph: SlotGraph | None) -> None:
        if graph is None or not len(graph.src):
            return
        for key, weight in zip((graph.src * self.n + graph.dst).tolist(), (2 * graph.t_col - 1).tolist()):
            entry = self.sums.setdefault(key, [0.0, 0.0])
            entry[0] += weight
            entry[1] += 1.0
        self.stale = True

    def _solve(self) -> None:
        keys = np.fromiter(self.sums, np.int64, len(self.sums))
        values = np.array(list(self.sums.values()))
        weight = values[:, 0] / values[:, 1]  # the pair's mean weight in [-1, 1]
        src, dst = keys // self.n, keys % self.n
        indegree = np.bincount(dst, minlength=self.n)
        outdegree = np.bincount(src, minlength=self.n)
        fairness, goodness = np.ones(self.n), np.zeros(self.n)
        for _ in range(self.iterations):
            new_goodness = np.bincount(dst, fairness[src] * weight, self.n) / np.maximum(indegree, 1)
            deviation = np.bincount(src, np.abs(weight - new_goodness[dst]), self.n)
            new_fairness = np.where(outdegree > 0, 1 - deviation / (2 * np.maximum(outdegree, 1)), 1.0)
            change = max(np.abs(new_goodness - goodness).max(), np.abs(new_fairness - fairness).max())
            fairness, goodness = new_fairness, new_goodness
            if change < self.tolerance:
                break
        self.fairness, self.goodness, self.stale = fairness, goodness, False

    def score(self, src: np.ndarray, dst: np.ndarray, profile: np.ndarray | None = None) -> np.ndarray:
        if self.stale:
            self._solve()
        return (self.fairness[src] * self.goodness[dst] + 1) / 2


def predict_edges(scorer: OnlineScorer, history: History, slots: Iterable[int]) -> np.ndarray:
    """Scores for every edge of the target slots (in :func:`model.targets.targets` order), online."""
    wanted, out = set(slots), []
    for t, graph in enumerate(history.graphs):
        if t in wanted and graph is not None:
            out.append(scorer.score(graph.src, graph.dst, graph.profile))
        scorer.advance(graph)
    return np.concatenate(out) if out else np.zeros(0)


def beta_reputation(history: History, slots: Iterable[int], params: BetaParams = BetaParams()) -> np.ndarray:
    return predict_edges(BetaReputation(len(history.index), params), history, slots)


def qs_trust(history: History, slots: Iterable[int], params: QSParams = QSParams()) -> np.ndarray:
    return predict_edges(QSTrust(len(history.index), params), history, slots)


RuleFactory = Callable[[History, list[int]], OnlineScorer]
RULES: dict[str, RuleFactory] = {
    "channel_beta": channel_beta,
    "channel_beta_sized": channel_beta_sized,
    "fxg": lambda history, train_slots: FairnessGoodness(len(history.index)),
    "beta": lambda history, train_slots: BetaReputation(len(history.index)),
    "qs_trust": lambda history, train_slots: QSTrust(len(history.index)),
    "mean": lambda history, train_slots: RunningMean(len(history.index)),
}
