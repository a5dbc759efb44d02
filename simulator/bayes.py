"""The Bayes filter: the best forecast of the hidden truth that anything learning from the log could make.

It knows the simulator's generative model: the behaviour classes, their shares (the mix, an attack's share
included) and each parameter's prior (:mod:`simulator.behaviour`), and the physics: the channel, the devices'
positions and CPUs, each past task's on-time factor (from the times the event reports) and, for a forecast, the
on-time factor at the load a scheduler can know (the usage cycle's mean). It does not know any device's
behaviour parameters or class: it infers them from the collaborator's computation outcomes
(com | tr) before the forecast's slot, on a grid of hypotheses per class, and forecasts the posterior
mean of the truth ``a1 * P(tr) + a2 * P(tr) * E[b] * on_time``. Its error against the truth is the floor
(the "ceiling" of accuracy) for any learner of that data, up to the grid's resolution and the
load it cannot know. With telemetry it also reads what the loads reveal (:class:`Revealed`).

Selective devices misbehave toward a hidden 30 % of owners: under a selective hypothesis each owner's
targeting is a latent flag, marginalized per owner, and the forecast for an owner uses that owner's
posterior of being targeted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from scipy.special import logsumexp

from simulator.behaviour import (HIGH, LOW, OFF_LEN, ON_LEN, PERIOD, SPAN, START, BehaviourParams, change_ramp,
                                 class_prior, drift_share, usage_cycle)
from simulator.config import Behaviour
from simulator.world import World, on_time_factor

EPS = 1e-9
PERIODS = np.arange(PERIOD[0], PERIOD[1] + 1e-9, 0.05)  # the grid a device's usage cycle's period is fitted on
KEPT_CHANGES = 64  # a device's likeliest changes (by its loads) that its hypotheses carry, per class
MIN_REPORTS = 6  # reports a device's loads are fitted from at least
CHANGING = (int(Behaviour.DEGRADING), int(Behaviour.RECOVERING))


@dataclass(frozen=True)
class Revealed:
    """What the loads a device reports reveal, per id: its usage cycle (period, phase: :meth:`BehaviourParams.cycle`),
    and the changes its load could be making (a degrading device takes ``load_drift`` on over its change, a
    recovering one sheds it): per id, candidate changes (class, start, span) with their log-likelihoods against no
    change (``steady``: that of no change, 0 or -inf), as the loads weigh them."""

    period: np.ndarray  # (n,)
    phase: np.ndarray  # (n,)
    steady: np.ndarray  # (n,) log weight of no change
    changes: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]  # per id: kind, start, span, log weight (k,)

    @classmethod
    def exact(cls, world: World) -> "Revealed":
        """The simulator's own values, a changing device's change certain (an optimistic reading: what many slots
        of reports tend to)."""
        p = world.params
        changing = np.isin(p.kind, CHANGING)
        changes = [tuple(np.array([v]) for v in (p.kind[i], p.start[i], p.span[i], 0.0)) if changing[i] else
                   tuple(np.zeros(0) for _ in range(4)) for i in range(world.size)]
        return cls(p.period, p.phase, np.where(changing, -np.inf, 0.0), changes)

    @classmethod
    def fitted(cls, world: World, status: pa.Table, before: int) -> "Revealed":
        """Each id's loads reported in slots before ``before`` (:func:`reported_loads`): its cycle the least-squares
        sine (with a level and a trend) over :data:`PERIODS`; then, at that period, each change the simulator's
        prior allows (every start and span of whole slots) weighed against none by the Gaussian log-likelihood of
        the loads less its drift, fitted by a level and the sine, at the noise the simulator draws. An id with fewer
        than :data:`MIN_REPORTS` reports keeps the prior's mean period, phase 0, and every change as likely as
        none."""
        config = world.config
        loads, reported = reported_loads(world, status, before)
        t = np.arange(loads.shape[1], dtype=np.float64)
        enough = reported.sum(axis=1) >= MIN_REPORTS
        period, phase = np.full(world.size, float(np.mean(PERIOD))), np.zeros(world.size)
        best = np.full(world.size, np.inf)
        for candidate in PERIODS:
            wave = [np.sin(2 * np.pi * t / candidate), np.cos(2 * np.pi * t / candidate)]
            coef, error = _least_squares(loads, reported, np.stack([np.ones_like(t), t / len(t), *wave], axis=1))
            better = enough & (error < best)
            best[better], period[better] = error[better], candidate
            phase[better] = np.arctan2(coef[better, 3], coef[better, 2])  # a sin + b cos = r sin(. + atan2(b, a))
        angle = 2 * np.pi * t[None, :] / period[:, None]  # (n, T) each id's own cycle
        basis = np.stack([np.ones_like(angle), np.sin(angle), np.cos(angle)], axis=-1)  # (n, T, 3)
        coef, _ = _least_squares(loads, reported, basis)
        residual = reported * (loads - np.einsum("nti,ni->nt", basis, coef))  # the loads off the steady fit
        start, span = (a.ravel() for a in np.meshgrid(np.arange(np.ceil(START[0] * config.slots),
                                                                 np.floor(START[1] * config.slots) + 1),
                                                       np.arange(max(1.0, np.ceil(SPAN[0] * config.slots)),
                                                                 np.floor(SPAN[1] * config.slots) + 1), indexing="ij"))
        ramps = change_ramp(t[None, :], start[:, None], span[:, None])  # (R, T)
        along = residual @ ramps.T  # (n, R) <ramp, the residual> (weighted)
        gram = np.einsum("nt,nti,ntj->nij", reported, basis, basis) + 1e-9 * np.eye(3)
        cross = np.einsum("nt,nti,rt->nir", reported, basis, ramps)  # (n, 3, R)
        power = reported @ (ramps ** 2).T - np.einsum("nir,nir->nr", cross, np.linalg.solve(gram, cross))  # (n, R)
        noise = (0.4 * config.load_swing) ** 2 / 3  # the variance of a slot's noise (World.load)
        changes = []
        for i in range(world.size):
            kinds, starts, spans, weights = [], [], [], []
            for kind, drift in zip(CHANGING, (config.load_drift, -config.load_drift)):  # a recovering device's drift
                gain = (2 * drift * along[i] - drift ** 2 * power[i]) / (2 * noise) if enough[i] else \
                    np.zeros(len(start))                                  # falls as its ramp rises
                kept = np.argsort(-gain, kind="stable")[:KEPT_CHANGES]  # carrying the class's whole likelihood,
                whole = logsumexp(gain) - np.log(len(start))  # each start and span equally likely a priori
                kinds.append(np.full(len(kept), kind))
                starts.append(start[kept])
                spans.append(span[kept])
                weights.append(gain[kept] - logsumexp(gain[kept]) + whole)
            changes.append(tuple(np.concatenate(v) for v in (kinds, starts, spans, weights)))
        return cls(period, phase, np.zeros(world.size), changes)

    def cycle(self, rows: np.ndarray, slot: np.ndarray | int) -> np.ndarray:
        """The usage cycle of ids ``rows`` at ``slot`` (:meth:`BehaviourParams.cycle`)."""
        return usage_cycle(slot, self.period[rows], self.phase[rows])

    def drift(self, rows: np.ndarray, slot: int, shares: dict[Behaviour, float], load_drift: float) -> np.ndarray:
        """The load ids ``rows``' changes are expected to add at ``slot`` (:meth:`World.drift`), each change weighed
        by its loads' likelihood and its class's share ``shares``."""
        unique, inverse = np.unique(rows, return_inverse=True)
        out = np.zeros(len(unique))
        steady = 1.0 - sum(shares[Behaviour(k)] for k in CHANGING)
        for at, row in enumerate(unique):
            kind, start, span, weight = self.changes[row]
            if not len(kind):
                continue
            with np.errstate(divide="ignore"):  # a class the mix leaves out: log 0
                log_w = np.log([shares[Behaviour(int(k))] for k in kind] + [steady]) + np.r_[weight, self.steady[row]]
            w = np.exp(log_w - logsumexp(log_w))[:-1]
            out[at] = load_drift * (w @ drift_share(kind, change_ramp(slot, start, span)))
        return out[inverse]


def reported_loads(world: World, status: pa.Table, before: int) -> tuple[np.ndarray, np.ndarray]:
    """(loads, reported), each (ids, before): the load each id of ``world`` reported in each slot before ``before``,
    and 1 where it reported one (0 and 0 where not)."""
    rows = pc.index_in(status["device"], value_set=world.ids).to_numpy(zero_copy_only=False)
    slot = world.config.clock.slot_of(status["time_ms"].to_numpy())
    load = status["cpu_load"].to_numpy(zero_copy_only=False).astype(np.float64)
    keep = (slot < before) & np.isfinite(load) & (rows >= 0)
    loads = np.zeros((world.size, max(before, 1)))
    reported = np.zeros_like(loads)
    loads[rows[keep], slot[keep]], reported[rows[keep], slot[keep]] = load[keep], 1.0
    return loads, reported


def _least_squares(values: np.ndarray, weight: np.ndarray, basis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(coefficients (n, k), weighted squared error (n,)) of each row of ``values`` (n, T) on ``basis`` ((T, k), or
    (n, T, k) a row's own), weighted by ``weight`` (n, T)."""
    per_row = basis if basis.ndim == 3 else np.broadcast_to(basis, (len(values), *basis.shape))
    gram = np.einsum("nt,nti,ntj->nij", weight, per_row, per_row) + 1e-9 * np.eye(basis.shape[-1])
    coef = np.linalg.solve(gram, np.einsum("nt,nti->ni", weight * values, per_row)[:, :, None])[:, :, 0]
    error = (weight * (values - np.einsum("nti,ni->nt", per_row, coef)) ** 2).sum(axis=1)
    return coef, error


@dataclass(frozen=True)
class Grid:
    """Points per parameter (midpoints of equal-probability bins of each uniform prior). On the paper setting
    (seed 101) this grid and one with 2-4x the points per axis forecast within 0.0001 RMSE of each other."""

    levels: int = 3  # high and low of the classes that move between them
    stable_levels: int = 12  # the one level of a stable class
    starts: int = 8
    spans: int = 4
    periods: int = 16
    phases: int = 12


def midpoints(bounds: tuple[float, float], n: int) -> np.ndarray:
    lo, hi = bounds
    return lo + (np.arange(n) + 0.5) * (hi - lo) / n


def _product(*axes: np.ndarray) -> list[np.ndarray]:
    return [a.ravel() for a in np.meshgrid(*axes, indexing="ij")]


@dataclass(frozen=True)
class Hypotheses:
    """Every owner-independent hypothesis (all classes but selective) and the selective ones' levels, with
    log prior weights that sum (in probability) to one over both."""

    params: BehaviourParams  # (H,)
    log_prior: np.ndarray  # (H,)
    selective_high: np.ndarray  # (G,)
    selective_low: np.ndarray  # (G,)
    selective_log_prior: np.ndarray  # (G,)


def hypotheses(mix: dict[Behaviour, float], slots: int, grid: Grid = Grid(), revealed: bool = False) -> Hypotheses:
    """The grid of hypotheses under the simulator's priors (:meth:`BehaviourParams.draw`) for a run of ``slots``.
    ``revealed`` (telemetry): the usage cycle and a changing device's change are read off its reported load,
    so the periodic and changing classes vary only in their levels (their period, phase, start and span are
    each device's own, filled in by :meth:`BayesFilter.device_hypotheses`)."""
    high, low = midpoints(HIGH, grid.levels), midpoints(LOW, grid.levels)
    parts: list[tuple[Behaviour, dict[str, np.ndarray]]] = []
    parts.append((Behaviour.STABLE_RELIABLE, {"high": midpoints(HIGH, grid.stable_levels)}))
    parts.append((Behaviour.STABLE_UNRELIABLE, {"low": midpoints(LOW, grid.stable_levels)}))
    starts = midpoints(START, grid.starts) * slots
    spans = np.maximum(1.0, midpoints(SPAN, grid.spans) * slots)
    for kind in (Behaviour.DEGRADING, Behaviour.RECOVERING):
        if revealed:
            h, lo = _product(high, low)
            parts.append((kind, {"high": h, "low": lo}))
        else:
            h, lo, st, sp = _product(high, low, starts, spans)
            parts.append((kind, {"high": h, "low": lo, "start": st, "span": sp}))
    cycles = [(on, off, r) for on in range(ON_LEN[0], ON_LEN[1] + 1) for off in range(OFF_LEN[0], OFF_LEN[1] + 1)
              for r in range(on + off)]
    on, off, r = (np.array(c, np.float64) for c in zip(*cycles))
    weight = 1.0 / (on + off)  # each (on, off) equally likely, its offsets uniform over its cycle
    index, h, lo = _product(np.arange(len(on)), high, low)
    index = index.astype(np.int64)
    parts.append((Behaviour.INTERMITTENT, {"high": h, "low": lo, "on_len": on[index], "off_len": off[index],
                                           "offset": r[index], "weight": weight[index]}))
    if revealed:
        h, lo = _product(high, low)
        parts.append((Behaviour.PERIODIC, {"high": h, "low": lo}))
    else:
        period, phase, h, lo = _product(midpoints(PERIOD, grid.periods), midpoints((0.0, 2 * np.pi), grid.phases),
                                        high, low)
        parts.append((Behaviour.PERIODIC, {"high": h, "low": lo, "period": period, "phase": phase}))
    shares = class_prior(mix)
    columns: dict[str, list[np.ndarray]] = {name: [] for name in
                                            ("kind", "high", "low", "start", "span", "on_len", "off_len", "offset",
                                             "period", "phase", "log_prior")}
    defaults = {"high": np.mean(HIGH), "low": np.mean(LOW), "start": 0.0, "span": 1.0, "on_len": 1.0, "off_len": 1.0,
                "offset": 0.0, "period": np.mean(PERIOD), "phase": 0.0}
    for kind, values in parts:
        if shares[kind] <= 0:
            continue
        n = len(next(iter(values.values())))
        weight = values.get("weight", np.ones(n))
        columns["kind"].append(np.full(n, int(kind)))
        columns["log_prior"].append(np.log(shares[kind]) + np.log(weight / weight.sum()))
        for name, default in defaults.items():
            columns[name].append(np.asarray(values.get(name, np.full(n, default)), np.float64))
    joined = {name: np.concatenate(parts_) if parts_ else np.zeros(0) for name, parts_ in columns.items()}
    log_prior = joined.pop("log_prior")
    joined["kind"] = joined["kind"].astype(np.int64)
    for name in ("on_len", "off_len", "offset"):
        joined[name] = joined[name].astype(np.int64)
    sel_high, sel_low = _product(high, low)
    sel_prior = (np.full(len(sel_high), np.log(shares[Behaviour.SELECTIVE]) - np.log(len(sel_high)))
                 if shares[Behaviour.SELECTIVE] > 0 else np.zeros(0))
    if shares[Behaviour.SELECTIVE] <= 0:
        sel_high, sel_low = np.zeros(0), np.zeros(0)
    return Hypotheses(BehaviourParams(**joined), log_prior, sel_high, sel_low, sel_prior)


def _bernoulli(success: np.ndarray, p: np.ndarray) -> np.ndarray:
    """log P(success) under each probability, broadcast; each element's one logarithm computed once."""
    p = np.clip(p, EPS, 1 - EPS)
    success = np.broadcast_to(success, p.shape)
    out = np.log(p, where=success, out=np.empty_like(p))
    return np.log1p(-p, where=~success, out=out)


def _by_class(column: BehaviourParams, slot: np.ndarray, tied: bool) -> np.ndarray:
    """(H, S) each hypothesis's reliability at each slot of the (1, S) row ``slot``, a run of one class at a time
    (the grid lists each class's hypotheses together), so no hypothesis computes another class's curve."""
    kind = column.kind[:, 0]
    if not len(kind):
        return np.zeros((0, slot.shape[1]))
    edges = np.flatnonzero(np.diff(kind)) + 1
    runs = zip(np.r_[0, edges], np.r_[edges, len(kind)])
    return np.concatenate([column.take(slice(lo, hi)).reliability(slot, False, tied) for lo, hi in runs])


@dataclass
class Counted:
    """A collaborator's tasks the filter has summed so far, for its next forecast to go on from: how many (in slot
    order), and each hypothesis's log-likelihood of their outcomes (H,), None before any."""

    tasks: int = 0
    log_likelihood: np.ndarray | None = None


@dataclass(frozen=True)
class Tasks:
    """One collaborator's transmitted tasks in slot order: slot, owner row, computation success, on-time factor."""

    slot: np.ndarray
    owner: np.ndarray
    com: np.ndarray
    on_time: np.ndarray


class BayesFilter:
    """Posterior-mean forecasts of the truth for any (owner, collaborator, slot) from the tasks before the slot.

    With telemetry (``world.config.telemetry``) the devices' reported loads reveal, to the filter as to any
    learner that reads them, each device's usage cycle (its period and phase: a periodic device's reliability
    follows it) and whether and when a device is changing (its load drifts with its change: the class, start
    and span of a degrading or recovering device). Given the run's ``status`` and a slot ``fitted_before``, the
    filter reads them from the loads each device reported before that slot (:meth:`Revealed.fitted`), as a
    learner must; without, it is handed them exactly (:meth:`Revealed.exact`, what many slots of reports tend
    to). The forecast's on-time factor is at the load the cycle and the drift predict, without the per-slot
    noise."""

    def __init__(self, world: World, events: pa.Table, grid: Grid = Grid(), status: pa.Table | None = None,
                 fitted_before: int = 0) -> None:
        self.world = world
        config = world.config
        self.revealed = config.telemetry
        self.reveals = Revealed.fitted(world, status, fitted_before) if self.revealed and status is not None else \
            Revealed.exact(world)  # what the filter reads off the reports of each id
        self.hypotheses = hypotheses(config.behaviour_mix, config.slots, grid, self.revealed)
        self.selective_targets = config.selective_targets
        transmitted = events.filter(pc.equal(events["tr_success"], True))
        collab = pc.index_in(transmitted["collaborator"], value_set=world.ids).to_numpy()
        owner = pc.index_in(transmitted["owner"], value_set=world.ids).to_numpy()
        slot = transmitted["slot"].to_numpy()
        on_time = on_time_factor(transmitted["t_total_s"].to_numpy(), transmitted["t_local_s"].to_numpy(),
                                 config.deadline_factor)
        com = transmitted["com_success"].to_numpy(zero_copy_only=False).astype(bool)
        order = np.lexsort((slot, collab))
        self.collab = collab[order]
        self.tasks = (slot[order], owner[order], com[order], on_time[order])
        self.counted: dict[int, Counted] = {}  # per collaborator: where its last forecast's first slot stood
        self._hypotheses: dict[int, Hypotheses] = {}  # per collaborator: device_hypotheses, with telemetry

    def tasks_of(self, collab: int) -> Tasks:
        lo, hi = np.searchsorted(self.collab, [collab, collab + 1])
        return Tasks(*(a[lo:hi] for a in self.tasks))

    def forecast(self, owners: np.ndarray, collabs: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """(P,) E[truth] of each pair at its (absolute) slot, from the collaborator's tasks before that slot.

        Forecasts asked slot after slot (a selection experiment's) go on from the sums of the one before
        (:class:`Counted`), so each task's likelihood under every hypothesis is computed once, not once a slot:
        the same sums, in the same order, as from the first task."""
        owners, collabs, slots = (np.asarray(a, np.int64) for a in (owners, collabs, slots))
        behaviour = np.zeros(len(owners))
        for collab in np.unique(collabs):
            mine = np.flatnonzero(collabs == collab)
            behaviour[mine] = self.expected_behaviour(self.tasks_of(collab), owners[mine], slots[mine], int(collab),
                                                      self.counted.setdefault(int(collab), Counted()))
        out = np.zeros(len(owners))
        config = self.world.config
        for slot in np.unique(slots):  # P(tr) and the on-time factor at the load a scheduler can know, pairwise
            at = np.flatnonzero(slots == slot)
            expected = self.world.expected(owners[at], collabs[at], int(slot), load=self.known_load(collabs[at], int(slot)))
            on_time = on_time_factor(expected.offload.time_s, expected.local.time_s, config.deadline_factor)
            p_com = expected.p_tr * behaviour[at] * on_time
            out[at] = config.weights.a_tr * expected.p_tr + config.weights.a_com * p_com
        return out

    def known_load(self, collabs: np.ndarray, slot: int) -> np.ndarray:
        """The load a forecast assumes: the usage cycle's mean, or with telemetry the cycle and drift the reports
        reveal (the per-slot noise stays unknown)."""
        config = self.world.config
        if not self.revealed:
            return np.full(len(collabs), config.load_mean)
        return (config.load_mean + config.load_swing * 0.6 * self.reveals.cycle(collabs, slot)
                + self.reveals.drift(collabs, slot, class_prior(config.behaviour_mix), config.load_drift))

    def device_hypotheses(self, collab: int) -> Hypotheses:
        """The hypotheses about one collaborator: the shared grid, or with telemetry the grid with what its
        reports reveal filled in (:class:`Revealed`): its cycle; the classes that do not change at the weight of no
        change, and each change its loads could be making as its class's levels at that change's weight
        (cached)."""
        h = self.hypotheses
        if not self.revealed:
            return h
        if collab not in self._hypotheses:
            self._hypotheses[collab] = self._revealed_hypotheses(collab)
        return self._hypotheses[collab]

    def _revealed_hypotheses(self, collab: int) -> Hypotheses:
        """:meth:`device_hypotheses` with telemetry, computed."""
        h = self.hypotheses
        reveals = self.reveals
        changing = np.isin(h.params.kind, CHANGING)
        steady = np.flatnonzero(~changing)  # every other class, at the weight of no change
        kind, start, span, weight = reveals.changes[collab]
        rows = [steady]
        log_prior = [h.log_prior[steady] + reveals.steady[collab]]
        starts, spans = [np.zeros(len(steady))], [np.ones(len(steady))]
        for k, st, sp, w in zip(kind, start, span, weight):  # each change: its class's levels at its ramp
            levels = np.flatnonzero(h.params.kind == k)
            rows.append(levels)
            log_prior.append(h.log_prior[levels] + w)
            starts.append(np.full(len(levels), st))
            spans.append(np.full(len(levels), sp))
        rows = np.concatenate(rows)
        n = len(rows)
        params = BehaviourParams(**{f: getattr(h.params, f)[rows] for f in ("kind", "high", "low", "on_len", "off_len",
                                                                            "offset")},
                                 start=np.concatenate(starts), span=np.concatenate(spans),
                                 period=np.full(n, reveals.period[collab]), phase=np.full(n, reveals.phase[collab]))
        return Hypotheses(params, np.concatenate(log_prior), h.selective_high, h.selective_low,
                          h.selective_log_prior + reveals.steady[collab])

    def expected_behaviour(self, tasks: Tasks, owners: np.ndarray, slots: np.ndarray, collab: int = 0,
                           counted: Counted | None = None) -> np.ndarray:
        """(P,) posterior mean of ``collab``'s honest-computation probability toward each owner at each slot,
        given its tasks before that slot. ``counted``: the sums of ``tasks``' first ones, from an earlier call,
        to go on from where they reach no further than this call's first slot; left at this call's first slot."""
        h = self.device_hypotheses(collab)
        wanted, inverse = np.unique(slots, return_inverse=True)  # (T,)
        before = np.searchsorted(tasks.slot, wanted, side="left")  # tasks counted at each wanted slot
        column = h.params.column()
        tied = self.revealed
        resume = counted is not None and counted.log_likelihood is not None and counted.tasks <= before[0]
        start = counted.tasks if resume else 0
        new = slice(start, before[-1])  # the tasks not yet summed that this call counts
        ll = _bernoulli(tasks.com[None, new], _by_class(column, tasks.slot[None, new], tied) * tasks.on_time[None, new])
        carried = counted.log_likelihood if resume else np.zeros(len(h.log_prior))
        cumulative = np.cumsum(np.concatenate([carried[:, None], ll], axis=1), axis=1)  # (H, 1 + new tasks)
        if counted is not None:
            counted.tasks, counted.log_likelihood = int(before[0]), cumulative[:, before[0] - start].copy()
        log_w = h.log_prior[:, None] + cumulative[:, before - start]  # (H, T)
        b = _by_class(column, wanted[None, :], tied)  # (H, T)
        if not len(h.selective_high):
            w = np.exp(log_w - logsumexp(log_w, axis=0))
            return (w * b).sum(axis=0)[inverse]
        # selective: per owner, log P(its tasks | targeted) and | untargeted), up to each wanted slot
        past, past_owner = np.unique(tasks.owner, return_inverse=True)  # (O,)
        counted = tasks.slot[None, :] < wanted[:, None]  # (T, K)
        one_hot = (past_owner[None, :] == np.arange(len(past))[:, None])  # (O, K)
        tgt = self.selective_targets

        def by_owner(level: np.ndarray) -> np.ndarray:  # (G, O, T)
            per_task = _bernoulli(tasks.com[None, :], level[:, None] * tasks.on_time[None, :])  # (G, K)
            return np.einsum("gk,ok,tk->got", per_task, one_hot, counted)

        on_lo, on_hi = by_owner(h.selective_low), by_owner(h.selective_high)
        marginal = np.logaddexp(np.log(tgt) + on_lo, np.log1p(-tgt) + on_hi).sum(axis=1)  # (G, T)
        log_w_sel = h.selective_log_prior[:, None] + marginal
        total = logsumexp(np.concatenate([log_w, log_w_sel]), axis=0)  # (T,)
        w, w_sel = np.exp(log_w - total), np.exp(log_w_sel - total)
        mean = (w * b).sum(axis=0)[inverse]  # (P,)
        # each queried owner's posterior of being targeted under each selective hypothesis
        at = np.searchsorted(past, owners)
        known = (at < len(past)) & (past[np.minimum(at, max(len(past) - 1, 0))] == owners) if len(past) else \
            np.zeros(len(owners), bool)
        odds = np.full((len(h.selective_high), len(owners)), np.log(tgt) - np.log1p(-tgt))
        rows = np.flatnonzero(known)
        odds[:, rows] += on_lo[:, at[rows], inverse[rows]] - on_hi[:, at[rows], inverse[rows]]
        targeted = 1 / (1 + np.exp(-odds))  # (G, P)
        level = targeted * h.selective_low[:, None] + (1 - targeted) * h.selective_high[:, None]
        return mean + (w_sel[:, inverse] * level).sum(axis=0)
