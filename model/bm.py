"""BM: slot GNN -> bidirectional Mamba over each device's slot history -> pair head -> T_beh.

The LSTM, Transformer and GNN-only baselines are the same model with another
``sequence`` encoder (:mod:`model.sequence`).

Glossary: ``t_beh`` is the paper's T_beh, the long-term behavioural trust of
collaborator j for owner i, read from the pair head ``MLP(Y_i (+) Y_j)``.
The head predicts a distribution over ``levels`` evenly spaced reliability
levels in [0, 1], trained by cross-entropy against the next slot's T_col
(as a soft label split between the two nearest levels, so that its expected
value is exactly T_col). ``readout="expected"`` (default) gives T_beh as the
distribution's mean; ``readout="max"`` is the paper's literal "max over the
output vector" (the most probable level), kept as an ablation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from model.bimamba import MambaConfig
from model.config import SlotClock, TrustWeights
from model.gnn import GNNConfig, SlotEncoder
from model.history import History
from model.node2vec import Node2VecConfig
from model.sequence import SequenceKind, sequence_encoder

Readout = Literal["expected", "max"]


@dataclass(frozen=True)
class BMConfig:
    gnn: GNNConfig = field(default_factory=GNNConfig)
    mamba: MambaConfig = field(default_factory=MambaConfig)
    node2vec: Node2VecConfig = field(default_factory=Node2VecConfig)
    clock: SlotClock = field(default_factory=SlotClock)
    weights: TrustWeights = field(default_factory=TrustWeights)
    window: int = 32  # S: slots of history per device
    levels: int = 11
    head_hidden: int = 64
    dropout: float = 0.0
    readout: Readout = "expected"
    sequence: SequenceKind = "bimamba"  # the learned baselines swap this encoder (see model.sequence)

    def __post_init__(self) -> None:
        if self.mamba.d_model != self.gnn.out_dim:
            raise ValueError(f"BMConfig: mamba.d_model ({self.mamba.d_model}) must equal the GNN's output "
                             f"width ({self.gnn.out_dim})")
        if self.gnn.node_dim != self.node2vec.dim:
            raise ValueError(f"BMConfig: gnn.node_dim ({self.gnn.node_dim}) must equal node2vec.dim "
                             f"({self.node2vec.dim})")
        if self.window < 1 or self.levels < 2:
            raise ValueError(f"BMConfig: window >= 1 and levels >= 2 (got {self.window}, {self.levels})")


class BM(nn.Module):
    def __init__(self, config: BMConfig, features: np.ndarray) -> None:
        """features: (devices, node2vec dim) fixed node2vec table."""
        super().__init__()
        self.config = config
        self.register_buffer("features", torch.as_tensor(features, dtype=torch.float32))
        self.register_buffer("level_values", torch.linspace(0, 1, config.levels))
        self.slot_encoder = SlotEncoder(config.gnn)
        self.sequence_encoder = sequence_encoder(config.sequence, config.mamba, config.window)
        d = config.gnn.out_dim
        self.head = nn.Sequential(nn.Linear(2 * d, config.head_hidden), nn.ReLU(), nn.Dropout(config.dropout),
                                  nn.Linear(config.head_hidden, config.levels))

    def pair_logits(self, history: History, src: np.ndarray, dst: np.ndarray, end: np.ndarray) -> torch.Tensor:
        """Logits (P, levels) for owners ``src`` and collaborators ``dst`` from their histories up to slot ``end``."""
        window = self.config.window
        devices = np.concatenate([src, dst])
        ends = np.concatenate([end, end])
        keys, inverse = np.unique(ends * len(history.index) + devices, return_inverse=True)
        u_end, u_dev = keys // len(history.index), keys % len(history.index)
        slots, lengths = history.windows(u_dev, u_end, window)  # (U, W), (U,)
        first = int(slots.min())
        needed = history.graphs[first:int(u_end.max()) + 1]
        embeddings = self.slot_encoder(self.features, needed)  # (slots, n, d)
        sequences = embeddings[torch.from_numpy(slots - first), torch.from_numpy(u_dev)[:, None]]  # (U, W, d)
        long_term = self.sequence_encoder(sequences, torch.from_numpy(lengths))  # (U, d)
        y = long_term[torch.from_numpy(inverse)]
        y_i, y_j = y[: len(src)], y[len(src):]
        return self.head(torch.cat([y_i, y_j], dim=-1))

    def t_beh(self, logits: torch.Tensor, readout: Readout | None = None) -> torch.Tensor:
        """(P, levels) logits -> (P,) T_beh by ``readout`` (default: the configured one)."""
        if (readout or self.config.readout) == "max":
            return self.level_values[logits.argmax(-1)]
        return logits.softmax(-1) @ self.level_values

    def loss(self, logits: torch.Tensor, t_col: torch.Tensor) -> torch.Tensor:
        return -(soft_labels(t_col, self.config.levels) * F.log_softmax(logits, -1)).sum(-1).mean()


def soft_labels(values: torch.Tensor, levels: int) -> torch.Tensor:
    """(P,) values in [0, 1] -> (P, levels) distributions on the two nearest levels with mean == value."""
    position = values.clamp(0, 1) * (levels - 1)
    low = position.floor().long().clamp(max=levels - 2)
    upper_share = position - low
    labels = torch.zeros(len(values), levels)
    labels.scatter_(1, low[:, None], (1 - upper_share)[:, None])
    labels.scatter_add_(1, (low + 1)[:, None], upper_share[:, None])
    return labels
