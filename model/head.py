"""BM's pair heads: T_beh of collaborator j for owner i from their long-term embeddings (and the pair).

* :class:`PaperHead` (``head="paper"``, the ``bm_paper`` ablation): the paper's ``MLP(Y_i (+) Y_j)``
  over ``levels`` reliability levels, trained by cross-entropy against the next slot's T_col (a soft
  label on the two nearest levels); T_beh is the distribution's mean (``readout="expected"``) or the
  most probable level (``"max"``, the paper's literal readout).
* :class:`ContextHead` (``head="context"``, the default): what the paper's system model says T_col is
  made of. A task's T_col is ``a1 * tr + a2 * com`` and computation only follows transmission, so
  ``E[T_col] = P(tr) * (a1 + a2 * P(com | tr))``. The head predicts both factors:

  - ``q_tr = sigmoid(logit P_tr(d_ij) + delta(physics))``: the outage curve (:mod:`model.channel`,
    its two parameters learned from the fitted start) corrected by the pair's physics;
  - ``q_com = sigmoid(b(Y_i, Y_j, evidence, physics)) * sigmoid(o(physics))``: j's behaviour, from
    the long-term embeddings, the forgetting-weighted evidence of j, i and the pair
    (:mod:`model.evidence`) and the physics, times an on-time factor from the physics alone (the
    offload time against the owner's local time);

  trained by the binomial likelihood of the tasks' tr and com flags; the published T_beh is a convex
  combination of that forecast and rule experts computed from the same inputs (:mod:`model.experts`: the head's
  and the rule's averaged where the head reads nothing more), weighted on validation slots (``readout="own"``
  reads the head's forecast alone). Graded logs (no flags) read ``T_beh = sigmoid(b(...))`` trained by
  cross-entropy against T_col, and a second network of the same
  inputs gives the median forecast ``sigmoid(m(...))`` (pinball loss at 0.5), which absolute-error
  metrics read (``readout="median"``; on flagged logs the median readout is the mean). The weights that read Y start
  at zero: training first fits the head on the evidence and physics alone (cheap: no encoder runs,
  :func:`model.train.warm_up_head`), then learns end to end what the long-term embeddings add.

Every head maps (Y_i (P, d), Y_j (P, d), physics (P, 5), evidence (P, F)) to raw outputs (P, k);
``t_beh(raw)`` gives T_beh (P,) and ``loss(raw, targets)`` the training loss. ``read(PairSides)`` gives the same raw
outputs from inputs split by what they depend on (the owner, the collaborator, the pair): a scorer's candidates
share devices, and the context head's collaborator columns (most of its input, and its rule experts' rates) are
then computed once per device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model.channel import REFERENCE_M, OnTimeCurve, OutageCurve
from model.config import TrustWeights
from model.evidence import STATS, EvidenceConfig
from model.experts import RuleExperts, SizeCorrection
from model.scan import cpu_extension, fused_inference

Readout = Literal["expected", "max", "median", "own"]
Outcomes = Literal["flags", "graded"]
PHYSICS_FEATURES = 8


@dataclass
class PairTargets:
    """Next-slot outcomes of each pair (P,): T_col, tasks, tasks with flags, and the tr / com successes."""

    t_col: torch.Tensor
    tasks: torch.Tensor
    flagged: torch.Tensor
    tr: torch.Tensor
    com: torch.Tensor


def soft_labels(values: torch.Tensor, levels: int) -> torch.Tensor:
    """(P,) values in [0, 1] -> (P, levels) distributions on the two nearest levels with mean == value."""
    position = values.clamp(0, 1) * (levels - 1)
    low = position.floor().long().clamp(max=levels - 2)
    upper_share = position - low
    labels = torch.zeros(len(values), levels, device=values.device)
    labels.scatter_(1, low[:, None], (1 - upper_share)[:, None])
    labels.scatter_add_(1, (low + 1)[:, None], upper_share[:, None])
    return labels


def mlp(sizes: tuple[int, ...], dropout: float = 0.0) -> nn.Sequential:
    layers: list[nn.Module] = []
    for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if k < len(sizes) - 2:
            layers += [nn.ReLU(inplace=True), nn.Dropout(dropout)]
    return nn.Sequential(*layers)


class PaperHead(nn.Module):
    def __init__(self, d: int, hidden: int, levels: int, readout: Readout, dropout: float) -> None:
        super().__init__()
        self.readout = readout
        self.register_buffer("level_values", torch.linspace(0, 1, levels), persistent=False)
        self.mlp = mlp((2 * d, hidden, levels), dropout)

    def forward(self, y_i: torch.Tensor, y_j: torch.Tensor, physics: torch.Tensor, evidence: torch.Tensor
                ) -> torch.Tensor:
        return self.mlp(torch.cat([y_i, y_j], dim=-1))  # (P, levels) logits

    def read(self, sides: PairSides, member: int | None = None) -> torch.Tensor:
        return self.mlp(torch.cat([gather(sides.y_owner, sides.src), gather(sides.y_collaborator, sides.dst)], dim=-1))

    def t_beh(self, raw: torch.Tensor, readout: Readout | None = None) -> torch.Tensor:
        readout = readout or self.readout
        if readout == "max":
            return self.level_values[raw.argmax(-1)]
        if readout == "median":  # the first level at which the distribution's mass reaches one half
            return self.level_values[(raw.softmax(-1).cumsum(-1) < 0.5).sum(-1).clamp(max=len(self.level_values) - 1)]
        return raw.softmax(-1) @ self.level_values

    def units(self, targets: PairTargets) -> float:
        """What :meth:`loss` averages over: the pairs."""
        return float(len(targets.t_col))

    def loss(self, raw: torch.Tensor, targets: PairTargets) -> torch.Tensor:
        return -(soft_labels(targets.t_col, len(self.level_values)) * F.log_softmax(raw, -1)).sum(-1).mean()


@dataclass(frozen=True)
class PhysicsColumns:
    """What every member reads of a pair's raw physics, computed once per call: the PHYSICS_FEATURES with the
    distance curve's column (2) at zero, which each member fills with its own P_tr(d) curve."""

    features: torch.Tensor  # (P, 8): distance known, log1p(d) / 6, 0 (the curve), cpu known, log f_i, log f_j,
    #                          time ratio known, log ratio; zero where unknown
    distance: torch.Tensor  # (P,) metres, at least 1, REFERENCE_M where unknown
    known_d: torch.Tensor  # (P,) bool
    curve_column: torch.Tensor  # (8,) one at the curve's column

    @classmethod
    def of(cls, physics: torch.Tensor) -> "PhysicsColumns":
        """physics (P, 5) raw PHYSICS_COLUMNS, NaN unknown (the task's size, last, is the size correction's)."""
        distance, cpu_i, cpu_j, ratio = physics[:, :4].unbind(-1)
        known_d = ~torch.isnan(distance)
        d = torch.where(known_d, distance, torch.full_like(distance, REFERENCE_M)).clamp(min=1.0)
        known_cpu = ~(torch.isnan(cpu_i) | torch.isnan(cpu_j))
        known_ratio = ~torch.isnan(ratio) & (ratio > 0)
        zero = torch.zeros_like(distance)
        features = torch.stack([
            known_d.float(), torch.where(known_d, torch.log1p(d) / 6, zero), zero,
            known_cpu.float(), torch.where(known_cpu, torch.log(cpu_i.clamp(min=1.0) / 1e9), zero),
            torch.where(known_cpu, torch.log(cpu_j.clamp(min=1.0) / 1e9), zero),
            known_ratio.float(), torch.where(known_ratio, torch.log(ratio.clamp(min=1e-6)).clamp(-3, 3), zero),
        ], dim=-1)
        column = torch.zeros(PHYSICS_FEATURES, dtype=features.dtype, device=features.device)
        column[2] = 1.0
        return cls(features, d, known_d, column)

    def take(self, rows: torch.Tensor) -> "PhysicsColumns":
        """The pairs ``rows`` (k,) of these columns."""
        return PhysicsColumns(self.features[rows], self.distance[rows], self.known_d[rows], self.curve_column)


def pair_mlp(net: nn.Sequential, inputs: list[tuple[torch.Tensor, torch.Tensor]],
             gathered: tuple[tuple[torch.Tensor, torch.Tensor | None], ...] = ()) -> torch.Tensor:
    """(P, out) ``net`` (an :func:`mlp`: Linear, ReLU, Dropout, ..., Linear) over P pairs, its first layer given as
    per-pair ``inputs`` (x (P, k), the weight's columns that read it (hidden, k)) plus rows of per-device tables
    ``gathered`` ((n, hidden), the (P,) rows each pair reads; None: pair p reads row p), the first layer's bias added
    here. Outside autograd on the CPU (:func:`model.scan.fused_inference`) one C++ pass over the pairs that keeps each
    pair's activations in registers (``model/csrc/pair_mlp.cpp``; the head's networks at hidden 32 in ~0.6 of the time
    PyTorch's layers take, one operator per layer over every pair);
    else PyTorch's operators (training, tracing for ONNX, GPUs)."""
    linears = [layer for layer in net if isinstance(layer, nn.Linear)]
    x = inputs[0][0]
    if fused_inference(x, "auto"):
        none = torch.empty(0, dtype=torch.int64)
        return cpu_extension().pair_mlp([a for a, _ in inputs], [w for _, w in inputs], [t for t, _ in gathered],
                                        [none if at is None else at for _, at in gathered],
                                        [layer.weight for layer in linears[1:]], [layer.bias for layer in linears])
    h = torch.addmm(linears[0].bias, x, inputs[0][1].T)  # (P, hidden), summed in place
    for a, w in inputs[1:]:
        h = h.addmm_(a, w.T)
    for table, at in gathered:
        h = h.add_(gather(table, at))
    return net[1:](h)


def gather(rows: torch.Tensor, at: torch.Tensor | None) -> torch.Tensor:
    """``rows[at]``; all rows in order where ``at`` is None."""
    return rows if at is None else rows.index_select(0, at)


@dataclass(frozen=True)
class PairSides:
    """The head's inputs split by what they depend on, so that what depends on one device is computed once per
    device, not once per candidate pair: owners' rows, collaborators' rows, and pairs' rows, each pair reading its
    owner's row ``src`` and its collaborator's row ``dst`` (None: pair p reads row p of both).

    The evidence blocks are :func:`model.evidence.pair_evidence_features`'s parts: the owner's (n_o, 2L), the
    collaborator's head (9L) then tail (recency, seen, load, reported, the load's drift and memory, with
    ``evidence.discredited`` what the credibility did not let in, of it and from it (4L), with ``evidence.shifts``
    what it showed since its load last shifted (2L + 2), the raw STATS)
    (n_c, 11L [+ 4L] [+ 2L + 2] + 4 + len(STATS) L), the pair's (P, 4L)."""

    y_owner: torch.Tensor  # (n_o, d)
    owner: torch.Tensor  # (n_o, 2L)
    y_collaborator: torch.Tensor  # (n_c, d)
    collaborator: torch.Tensor  # (n_c, 11L [+ 4L] [+ 2L + 2] + 4 + len(STATS) L)
    pair: torch.Tensor  # (P, 4L)
    physics: torch.Tensor  # (P, 5) raw PHYSICS_COLUMNS
    src: torch.Tensor | None = None  # (P,) int64 owner rows
    dst: torch.Tensor | None = None  # (P,) int64 collaborator rows

    @classmethod
    def of_pairs(cls, y_i: torch.Tensor, y_j: torch.Tensor, physics: torch.Tensor, evidence: torch.Tensor,
                 lams: int) -> "PairSides":
        """Every input per pair: evidence (P, F) as :func:`model.evidence.pair_evidence_features` gives it."""
        head, owner, pair, tail = evidence.split([9 * lams, 2 * lams, 4 * lams, evidence.shape[1] - 15 * lams], dim=1)
        return cls(y_i, owner, y_j, torch.cat([head, tail], dim=1), pair, physics)

    def take(self, rows: torch.Tensor) -> "PairSides":
        """The pairs ``rows`` (k,) of sides whose pairs read their own rows (``src`` and ``dst`` None)."""
        if self.src is not None or self.dst is not None:
            raise ValueError("PairSides.take: only of sides whose pair p reads row p (src and dst None)")
        return PairSides(*(getattr(self, name)[rows] for name in ("y_owner", "owner", "y_collaborator", "collaborator",
                                                                   "pair", "physics")))


@dataclass(frozen=True)
class MemberInputs:
    """What every member of a :class:`ContextHead` reads besides its own weights (:meth:`ContextHead.member_inputs`):
    computed once a call for all members, and once for a whole warm-up, whose inputs do not change."""

    sides: PairSides
    collaborator: torch.Tensor  # (n_c, 13 L [+ 4L] + 4) the collaborator's head, its recency .. memory (and what was
    #                              not believed), the experts' logits
    level: torch.Tensor  # (P,) the logit of the population's recent rate (at the level memory)
    columns: PhysicsColumns

    def take(self, rows: torch.Tensor) -> "MemberInputs":
        """The pairs ``rows`` (k,) of inputs whose pairs read their own rows (:meth:`PairSides.take`)."""
        return MemberInputs(self.sides.take(rows), self.collaborator[rows], self.level[rows], self.columns.take(rows))


class PairNet(nn.Module):
    """One member of :class:`ContextHead`: what it learns, from (Y_i, Y_j, its network inputs, physics) to
    probabilities (P, 2): q_tr and q_com = sigmoid(behaviour) * sigmoid(on-time) (flags), or the mean and the
    median forecast of T_col (graded)."""

    def __init__(self, d: int, lams: int, inputs: int, hidden: int, outcomes: Outcomes, outage: OutageCurve,
                 dropout: float) -> None:
        """inputs: the width of the networks' evidence input, the normalized evidence (17 L [+ 4L] + 4 columns: the
        collaborator's head, the owner's, the pair's, the collaborator's recency, seen, load, reported, its load's
        drift and memory, and what the credibility did not let in where the evidence reads it) then the rule
        experts' logits (to the end)."""
        super().__init__()
        self.graded = outcomes == "graded"
        self.d, self.lams, self.inputs = d, lams, inputs
        self.log_c = nn.Parameter(torch.tensor(float(outage.log_c)))
        self.alpha = nn.Parameter(torch.tensor(float(outage.alpha)))
        self.tr_unknown = nn.Parameter(torch.zeros(()))  # logit P(tr) where the distance is unknown
        self.tr_adjust = mlp((PHYSICS_FEATURES, hidden // 2, 1))
        self.behaviour = mlp((2 * d + inputs + PHYSICS_FEATURES, hidden, hidden, 1), dropout)
        self.on_time = mlp((PHYSICS_FEATURES, hidden // 2, 1))
        # graded logs: the median forecast, from the same inputs as the behaviour network
        self.median = mlp((2 * d + inputs + PHYSICS_FEATURES, hidden, hidden, 1), dropout) \
            if outcomes == "graded" else None
        nn.init.zeros_(self.tr_adjust[-1].weight)  # start from the fitted curve
        nn.init.zeros_(self.tr_adjust[-1].bias)
        with torch.no_grad():
            self.on_time[-1].bias.fill_(2.0)  # mostly on time, not saturated
            for net in [n for n in (self.behaviour, self.median) if n is not None]:
                net[0].weight[:, : 2 * d].zero_()  # Y adds nothing until training finds what it adds

    def read(self, net: nn.Sequential, sides: PairSides, collaborator: torch.Tensor, features: torch.Tensor
             ) -> torch.Tensor:
        """(P,) ``net`` on [Y_i, Y_j, the normalized evidence, the experts' logits, physics features], its first layer
        block by block: the collaborator's columns once per collaborator row, the owner's once per owner row, then
        gathered per pair with the pair's own. ``collaborator`` (n_c, 13 L [+ 4L] + 4): the collaborator's head, its
        recency, seen, load, reported, its load's drift and memory (and what was not believed), and the experts'
        logits. Y's products are left out where its weights are zero outside training (a head kept from the warm-up
        reads no Y)."""
        first, d, lams = net[0], self.d, self.lams
        w = first.weight  # (hidden, 2d + inputs + PHYSICS_FEATURES)
        start = 2 * d + 15 * lams  # the collaborator's recency .. memory, then the logits: to the physics
        w_collaborator = torch.cat([w[:, 2 * d: 2 * d + 9 * lams], w[:, start: 2 * d + self.inputs]], dim=1)
        by_collaborator = F.linear(collaborator, w_collaborator)
        by_owner = F.linear(sides.owner, w[:, 2 * d + 9 * lams: 2 * d + 11 * lams])
        if net.training or bool(w[:, : 2 * d].any()):
            by_owner = by_owner + F.linear(sides.y_owner, w[:, :d])
            by_collaborator = by_collaborator + F.linear(sides.y_collaborator, w[:, d: 2 * d])
        inputs = [(features, w[:, 2 * d + self.inputs:]), (sides.pair, w[:, 2 * d + 11 * lams: start])]
        return pair_mlp(net, inputs, ((by_collaborator, sides.dst), (by_owner, sides.src)))[:, 0]

    def physics_features(self, physics: PhysicsColumns) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (features (P, 8) with this member's P_tr(d) curve in, P_tr(d) (P,), distance known (P,))."""
        p_curve = torch.exp(-torch.exp(self.log_c) * (physics.distance / REFERENCE_M) ** self.alpha)
        curve = torch.where(physics.known_d, p_curve, torch.zeros_like(p_curve))
        return physics.features + curve[:, None] * physics.curve_column, p_curve, physics.known_d

    def forward(self, sides: PairSides, collaborator: torch.Tensor, physics: PhysicsColumns, level: torch.Tensor
                ) -> torch.Tensor:
        """collaborator: as :meth:`read` takes it; level (P,): the logit of the population's recent rate, which the
        behaviour (and median) logits are read against: a log that drifts moves every forecast with it."""
        features, p_curve, known_d = self.physics_features(physics)
        curve_logit = torch.logit(p_curve.clamp(1e-6, 1 - 1e-6))
        tr_logit = torch.where(known_d, curve_logit, self.tr_unknown.expand_as(curve_logit))
        tr_logit = tr_logit + self.of_physics(self.tr_adjust, features)
        behaviour = torch.sigmoid(level + self.read(self.behaviour, sides, collaborator, features))
        if self.graded:
            median = torch.sigmoid(level + self.read(self.median, sides, collaborator, features))
            return torch.stack([behaviour, median], dim=-1)
        return torch.stack([torch.sigmoid(tr_logit), behaviour * torch.sigmoid(self.of_physics(self.on_time, features))],
                           dim=-1)

    @staticmethod
    def of_physics(net: nn.Sequential, features: torch.Tensor) -> torch.Tensor:
        """(P,) a network of the physics features alone (the transmission's correction, the on-time factor)."""
        return pair_mlp(net, [(features, net[0].weight)])[:, 0]


class ContextHead(nn.Module):
    """``members`` :class:`PairNet` s fitted apart in the warm-up (a bagged ensemble: one fit of a network
    on a few thousand noisy outcomes varies by seed more than the methods differ), their probabilities
    averaged, then the rule experts' forecasts (:mod:`model.experts`) as further columns."""

    OWN = 2  # raw columns of the head's own forecast: logit q_tr, logit q_com (flags) or logit mean, median

    def __init__(self, d: int, evidence: EvidenceConfig, hidden: int, outcomes: Outcomes, weights: TrustWeights,
                 outage: OutageCurve, dropout: float, members: int = 1, rate_prior: np.ndarray | None = None,
                 on_time: OnTimeCurve | None = None, tr_rate: float = 1.0) -> None:
        """outage: the members' starting P_tr curve and the rules' fixed one; rate_prior, on_time, tr_rate: the
        rule experts' prior over collaborators' rates, on-time factor over the physics' time ratio and P(tr)
        where the distance is unknown, all fitted on the training period."""
        super().__init__()
        self.outcomes, self.a_tr, self.a_com = outcomes, weights.a_tr, weights.a_com
        self.lams = len(evidence.lams)
        self.known = evidence.collaborator_normalized  # the collaborator's columns before its raw STATS
        self.level = evidence.lams.index(evidence.level_memory)
        self.experts = RuleExperts(self.lams, outcomes == "flags", weights, outage, rate_prior, on_time, tr_rate)
        inputs = evidence.normalized + self.experts.count  # the networks also read the rules' rates
        self.members = nn.ModuleList(PairNet(d, self.lams, inputs, hidden, outcomes, outage, dropout)
                                     for _ in range(members))
        self.y_width = 2 * d  # the members' first columns: Y_i, Y_j
        stack = torch.zeros(1 + self.experts.forecast_count)
        stack[0] = 1.0  # the head's own forecast until fit_stack weighs the rules in
        self.register_buffer("stack", stack)
        self.sizing = SizeCorrection(self.lams, evidence.size_split_bits)  # added to the published forecast where
        #                                                                   training adopts it

    def forward(self, y_i: torch.Tensor, y_j: torch.Tensor, physics: torch.Tensor, evidence: torch.Tensor,
                member: int | None = None) -> torch.Tensor:
        """-> (P, 2 + K + 1): the logits of the members' mean q_tr and q_com (graded logs: of the mean and median
        forecasts of T_col), then the K rule experts' forecasts of T_col (the rule's last), then the task size's shift
        of the published forecast (:class:`model.experts.SizeCorrection`). ``member``: one member's instead of the
        mean (the warm-up fits them one by one)."""
        return self.read(PairSides.of_pairs(y_i, y_j, physics, evidence, self.lams), member)

    def read(self, sides: PairSides, member: int | None = None) -> torch.Tensor:
        """:meth:`forward` on inputs split by what they depend on (the scorer's: every device's part once)."""
        raw = self.stats(sides)
        rates = self.experts.rates(raw)  # (n_c, 2L)
        own = self.own(self.member_inputs(sides, rates), member)
        rates = torch.cat([rates, self.experts.rule_rate(raw)], dim=-1)  # (n_c, K)
        forecasts = self.experts.forecasts(sides.physics, gather(rates, sides.dst))
        shift = self.sizing(self.experts, raw, sides.dst, sides.physics)
        return torch.cat([own, forecasts, shift[:, None]], dim=-1)

    def member_inputs(self, sides: PairSides, rates: torch.Tensor | None = None) -> MemberInputs:
        """What the members read of ``sides``; ``rates``: the rule experts' (n_c, 2L), if already computed."""
        rates = self.experts.rates(self.stats(sides)) if rates is None else rates
        logits = torch.logit(rates.clamp(1e-4, 1 - 1e-4))
        collaborator = torch.cat([sides.collaborator[:, :self.known], logits], dim=-1)
        level = gather(logits[:, self.lams + self.level], sides.dst)  # the population's rate at the level memory
        return MemberInputs(sides, collaborator, level, PhysicsColumns.of(sides.physics))

    def own(self, inputs: MemberInputs, member: int | None = None) -> torch.Tensor:
        """(P, OWN) the head's own forecast, :meth:`forward`'s first columns: the logits of the members' mean
        probabilities, or of one ``member``'s."""
        nets = self.members if member is None else [self.members[member]]
        own = torch.stack([net(inputs.sides, inputs.collaborator, inputs.columns, inputs.level) for net in nets]).mean(0)
        return torch.logit(own.clamp(1e-6, 1 - 1e-6))

    def stats(self, sides: PairSides) -> torch.Tensor:
        """(n_c, STATS, L) the collaborators' raw sums per lambda, the tail of their rows (what the rules read)."""
        return sides.collaborator[:, self.known:].reshape(-1, len(STATS), self.lams)

    def size_step(self, sides: PairSides, raw: torch.Tensor) -> torch.Tensor:
        """(P,) how far the published T_beh moves were each pair's task of the other size class (above the size
        correction's split where it is at or below it, and the reverse), from :meth:`read`'s outputs ``raw``: only
        the size correction (their last column) reads the size, so the rest stands."""
        stats, size, split = self.stats(sides), sides.physics[:, -1:], self.sizing.split
        other = torch.where(size > split, split / 2, split * 2)  # (P, 1) a size of the other class
        flipped = torch.cat([sides.physics[:, :-1], other], dim=-1)
        moved = torch.cat([raw[:, :-1], self.sizing(self.experts, stats, sides.dst, flipped)[:, None]], dim=-1)
        return self.t_beh(moved) - self.t_beh(raw)

    @property
    def reads_embeddings(self) -> bool:
        """Whether any member's output depends on Y_i, Y_j: the warm-up starts their weights at zero and, with
        Y = 0, never moves them, so a head kept from the warm-up (epoch -1) reads no encoder at all."""
        return any(bool(net[0].weight[:, : self.y_width].any()) for member in self.members
                   for net in (member.behaviour, member.median) if net is not None)

    def expert_forecasts(self, raw: torch.Tensor) -> torch.Tensor:
        """(P, 1 + K): the head's own forecast, then the rule experts' (what :attr:`stack` weighs)."""
        return torch.cat([self.t_beh(raw, "own")[:, None], raw[:, self.OWN: self.OWN + self.experts.forecast_count]],
                         dim=-1)

    def t_beh(self, raw: torch.Tensor, readout: Readout | None = None) -> torch.Tensor:
        if readout not in ("own", "median"):  # the published forecast: the stack of the own one and the rules, moved
            stacked = self.expert_forecasts(raw) @ self.stack.to(raw.dtype)  # by the task's size (0 where not adopted)
            return (stacked + raw[:, -1]).clamp(0.0, 1.0)
        if self.outcomes == "graded":
            return torch.sigmoid(raw[:, 1 if readout == "median" else 0])
        return torch.sigmoid(raw[:, 0]) * (self.a_tr + self.a_com * torch.sigmoid(raw[:, 1]))

    def units(self, targets: PairTargets) -> float:
        """What :meth:`loss` averages over: the tasks (graded) or the flagged tasks."""
        return float((targets.tasks if self.outcomes == "graded" else targets.flagged).sum())

    def loss(self, raw: torch.Tensor, targets: PairTargets) -> torch.Tensor:
        """Negative log-likelihood per task: binomial tr of flagged tasks and com of transmitted ones (flags),
        or cross-entropy against T_col plus the median's absolute error, weighted by tasks (graded)."""
        if self.outcomes == "graded":
            t_col = targets.t_col.clamp(0, 1)
            bce = F.binary_cross_entropy_with_logits(raw[:, 0], t_col, reduction="none")
            absolute = (torch.sigmoid(raw[:, 1]) - t_col).abs()  # pinball loss at 0.5 (x2)
            return ((bce + absolute) * targets.tasks).sum() / targets.tasks.sum().clamp(min=1)
        log_tr, log_no_tr = F.logsigmoid(raw[:, 0]), F.logsigmoid(-raw[:, 0])
        log_com, log_no_com = F.logsigmoid(raw[:, 1]), F.logsigmoid(-raw[:, 1])
        nll = -(targets.tr * log_tr + (targets.flagged - targets.tr) * log_no_tr
                + targets.com * log_com + (targets.tr - targets.com) * log_no_com)
        return nll.sum() / targets.flagged.sum().clamp(min=1)
