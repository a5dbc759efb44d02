"""BM: slot GNN -> bidirectional Mamba over each device's slot history -> pair head -> T_beh.

The LSTM, Transformer and GNN-only baselines are the same model with another ``sequence`` encoder
(:mod:`model.sequence`); every one of them shares the head, its inputs and the training.

Glossary: ``Y`` is a device's long-term embedding (the sequence encoder over its last S slot
embeddings, each plus a projection of what the device reported by then: :data:`model.status.TELEMETRY`), ``t_beh`` the paper's T_beh of collaborator j for owner i, read from the pair head
(:mod:`model.head`): ``head="context"`` (default) on Y_i, Y_j, the pair's physics and the
forgetting-weighted evidence; ``head="paper"`` the paper's literal ``MLP(Y_i (+) Y_j)`` over
reliability levels (the ``bm_paper`` ablation).

Cold start: devices without an edge in the training period (and, online, devices the model has
never seen) have no node2vec row worth reading. They share one learned ``cold`` row instead, and
training replaces a ``cold_dropout`` share of the known devices' rows by it, so that the model
learns what a new device looks like. Such a device's T_beh then moves from the cold prior towards
what its own evidence shows as its tasks accrue (:mod:`model.evidence`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn

from model.bimamba import MambaConfig
from model.channel import OnTimeCurve, OutageCurve
from model.config import SlotClock, SystemParams, TrustWeights
from model.evidence import EvidenceConfig
from model.gnn import GNNConfig, SlotEncoder
from model.head import ContextHead, Outcomes, PairTargets, PaperHead, Readout
from model.history import History
from model.node2vec import Node2VecConfig
from model.sequence import SequenceKind, sequence_encoder
from model.status import TELEMETRY
from model.targets import PairQuery

HeadKind = Literal["context", "paper"]


@dataclass(frozen=True)
class BMConfig:
    gnn: GNNConfig = field(default_factory=GNNConfig)
    mamba: MambaConfig = field(default_factory=MambaConfig)
    node2vec: Node2VecConfig = field(default_factory=Node2VecConfig)
    evidence: EvidenceConfig = field(default_factory=EvidenceConfig)
    clock: SlotClock = field(default_factory=SlotClock)
    weights: TrustWeights = field(default_factory=TrustWeights)
    system: SystemParams = field(default_factory=SystemParams)
    window: int = 32  # S: slots of history per device
    head: HeadKind = "context"
    outcomes: Outcomes = "flags"  # what the log's tasks carry: the tr/com flags, or a graded reliability
    levels: int = 11  # the paper head's reliability levels
    head_hidden: int = 32
    head_members: int = 5  # the context head's bagged members (model.head.ContextHead)
    dropout: float = 0.0
    cold_dropout: float = 0.1  # share of known devices read as new ones in each training step
    readout: Readout = "expected"
    sequence: SequenceKind = "bimamba"  # the learned baselines swap this encoder (see model.sequence)

    def __post_init__(self) -> None:
        if self.mamba.d_model != self.gnn.out_dim:
            raise ValueError(f"BMConfig: mamba.d_model ({self.mamba.d_model}) must equal the GNN's output "
                             f"width ({self.gnn.out_dim})")
        if self.gnn.node_dim != self.node2vec.dim:
            raise ValueError(f"BMConfig: gnn.node_dim ({self.gnn.node_dim}) must equal node2vec.dim "
                             f"({self.node2vec.dim})")
        if self.window < 1 or self.levels < 2 or self.head_members < 1:
            raise ValueError(f"BMConfig: window >= 1, levels >= 2 and head_members >= 1 (got {self.window}, "
                             f"{self.levels}, {self.head_members})")
        if self.head not in ("context", "paper") or self.outcomes not in ("flags", "graded"):
            raise ValueError(f"BMConfig: head 'context' or 'paper', outcomes 'flags' or 'graded' "
                             f"(got {self.head!r}, {self.outcomes!r})")
        if not 0 <= self.cold_dropout < 1:
            raise ValueError(f"BMConfig.cold_dropout: must lie in [0, 1) (got {self.cold_dropout!r})")

    @property
    def uses_context(self) -> bool:
        return self.head == "context"


def head_seed(seed: int) -> int:
    """The seed of a model's head, from the seed its process was given (``torch.manual_seed``): BM, the LSTM, the
    Transformer and GNN-only built with one seed start their heads alike, whatever their encoders drew before, so
    they can share one warm-up (:class:`model.train.WarmUps`)."""
    return int(np.random.SeedSequence([seed, 1]).generate_state(1, np.uint64)[0] >> np.uint64(1))


class BM(nn.Module):
    def __init__(self, config: BMConfig, features: np.ndarray, known: np.ndarray | None = None,
                 outage: OutageCurve | None = None, rate_prior: np.ndarray | None = None,
                 on_time: OnTimeCurve | None = None, tr_rate: float = 1.0) -> None:
        """features: (devices, node2vec dim) fixed node2vec table; known: (devices,) which rows are worth
        reading (the rest read the cold row); outage: the head's starting P_tr curve; rate_prior, on_time and
        tr_rate: its rule experts' prior over rates, on-time factor over the physics' time ratio and P(tr) where
        the distance is unknown (:mod:`model.experts`)."""
        super().__init__()
        self.config = config
        n = len(features)
        self.register_buffer("features", torch.as_tensor(features, dtype=torch.float32))
        self.register_buffer("known", torch.as_tensor(np.ones(n, bool) if known is None else known, dtype=torch.bool))
        self.cold = nn.Parameter(torch.zeros(config.node2vec.dim))
        self.slot_encoder = SlotEncoder(config.gnn)
        self.telemetry = nn.Linear(len(TELEMETRY), config.gnn.out_dim)  # a slot's report, added to its embedding
        self.sequence_encoder = sequence_encoder(config.sequence, config.mamba, config.window)
        d = config.gnn.out_dim
        with torch.random.fork_rng(devices=[]):  # the head's start is a draw of its own (see head_seed)
            torch.default_generator.manual_seed(head_seed(torch.initial_seed()))  # the CPU stream only
            if config.head == "paper":
                self.head: nn.Module = PaperHead(d, config.head_hidden, config.levels, config.readout, config.dropout)
            else:
                self.head = ContextHead(d, config.evidence, config.head_hidden, config.outcomes, config.weights,
                                        outage or OutageCurve.prior(config.system), config.dropout,
                                        config.head_members, rate_prior, on_time, tr_rate)

    def pair_scores(self, sides: PairSides) -> torch.Tensor:
        """(P, 2) each pair's T_beh (:meth:`t_beh` of :meth:`head.read <model.head.ContextHead.read>`) and its
        change were the pair's task of the other size class (:meth:`model.head.ContextHead.size_step`; 0 where T_beh
        does not read the size): what the scorer publishes, one pass of the head for both."""
        raw = self.head.read(sides)
        t_beh = self.t_beh(raw)
        step = self.head.size_step(sides, raw) if self.size_corrected else torch.zeros_like(t_beh)
        return torch.stack([t_beh, step], dim=-1)

    def transmission(self) -> tuple[OutageCurve, float] | None:
        """The P(tr) curve and rate where the distance is unknown that the head's rule experts read (the fixed ones
        fitted on the training period; :meth:`model.experts.RuleExperts.transmission`); None for the paper's head and
        on graded logs."""
        return self.head.experts.transmission() if isinstance(self.head, ContextHead) else None

    @property
    def size_corrected(self) -> bool:
        """Whether T_beh depends on the task's size: training adopted the head's size correction
        (:class:`model.experts.SizeCorrection`). Scoring then publishes how the trust moves with it."""
        return self.config.uses_context and self.head.sizing.adopted

    @property
    def uses_encoder(self) -> bool:
        """Whether T_beh depends on Y: the paper head always; the context head when training kept an end-to-end
        epoch that gave Y weight (:attr:`model.head.ContextHead.reads_embeddings`). Scoring, the ONNX export and
        the streaming job run the slot GNN and the sequence encoder only when it does."""
        return not self.config.uses_context or self.head.reads_embeddings

    @property
    def device(self) -> torch.device:
        """Where the model's tensors live (inputs built from numpy are moved there)."""
        return self.features.device

    def tensor(self, array: np.ndarray) -> torch.Tensor:
        """A numpy input as a tensor where the model lives."""
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def device_features(self) -> torch.Tensor:
        """(devices, node2vec dim): node2vec rows of known devices, the cold row for the rest (and, in
        training, for a random ``cold_dropout`` share of the known ones)."""
        known = self.known
        if self.training and self.config.cold_dropout > 0:
            known = known & (torch.rand(len(known), device=known.device) >= self.config.cold_dropout)
        return torch.where(known[:, None], self.features, self.cold)

    def long_term(self, history: History, devices: np.ndarray, end: np.ndarray) -> torch.Tensor:
        """Y (len(devices), d) of each device from its last S slots up to relative slot ``end``."""
        n = len(history.index)
        keys, inverse = np.unique(end * n + devices, return_inverse=True)
        u_end, u_dev = keys // n, keys % n
        slots, lengths = history.windows(u_dev, u_end, self.config.window)  # (U, W), (U,)
        first = int(slots.min())
        needed = history.graphs[first:int(u_end.max()) + 1]
        embeddings = self.slot_encoder(self.device_features(), needed)  # (slots, n, d)
        sequences = embeddings[self.tensor(slots - first), self.tensor(u_dev)[:, None]]  # (U, W, d)
        reports = self.tensor(history.telemetry(u_dev, slots))  # (U, W, TELEMETRY)
        return self.encode(sequences, self.tensor(lengths), reports)[self.tensor(inverse)]

    def encode(self, sequences: torch.Tensor, lengths: torch.Tensor, telemetry: torch.Tensor) -> torch.Tensor:
        """Y (n, d) from slot embeddings (n, S, d), lengths (n,) and each slot's telemetry (n, S, TELEMETRY): the
        sequence encoder reads the devices' reports beside what their collaborations showed."""
        return self.sequence_encoder(sequences + self.telemetry(telemetry), lengths)

    def pair_inputs(self, history: History, query: PairQuery) -> tuple[torch.Tensor, torch.Tensor]:
        """(physics (P, 5), evidence (P, F)) of the pairs; empty for the paper head, which reads neither."""
        if not self.config.uses_context:
            empty = torch.zeros(len(query.src), 0, device=self.device)
            return empty, empty
        physics = history.pair_physics(query.src, query.dst, query.end, query.profile, self.config.system,
                                       self.config.evidence)
        evidence = history.pair_evidence(query.src, query.dst, query.end, self.config.evidence)
        return self.tensor(physics), self.tensor(evidence)

    def pair_outputs(self, history: History, query: PairQuery) -> torch.Tensor:
        """The head's raw outputs (P, k) for the queried pairs."""
        y = self.long_term(history, np.concatenate([query.src, query.dst]), np.concatenate([query.end, query.end]))
        physics, evidence = self.pair_inputs(history, query)
        return self.head(y[: len(query.src)], y[len(query.src):], physics, evidence)

    def t_beh(self, raw: torch.Tensor, readout: Readout | None = None) -> torch.Tensor:
        """(P, k) raw head outputs -> (P,) T_beh (``readout`` applies to the paper head)."""
        return self.head.t_beh(raw, readout)

    def loss(self, raw: torch.Tensor, targets: PairTargets) -> torch.Tensor:
        return self.head.loss(raw, targets)

    def loss_units(self, targets: PairTargets) -> float:
        """What :meth:`loss` averages over (pairs or tasks): the weight of a batch's loss in a larger mean."""
        return self.head.units(targets)
