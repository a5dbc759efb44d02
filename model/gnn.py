"""Short-term fusion: a GNN over one slot's graph gives each device a slot embedding.

Each edge i -> j (j served i) carries a message ``mu = x_i (+) psi(T_col(i,j)) (+) eta(offset)``:
the owner's representation, the binary encoding of T_col projected by a
learnable matrix (psi), and DyGMamba's learnable cosine time encoding (eta) of
where the pair's tasks fell within the slot. Messages are averaged over each
collaborator's in-neighbours; ``layers`` of widths 32/64/32 (the paper's)
update ``h_j = ReLU(W_self h_j + W_msg mean(mu))``.
The mean is two ``scatter_add`` calls (sums and in-degrees; ONNX's ScatterElements with reduction add): no
graph library is imported to score a slot (torch-geometric's ``MessagePassing`` cost ~3 s of every
process's start for this one mean).

Idle devices (no edge in the slot) get an explicit learnable idle embedding,
never a GNN output over an empty neighbourhood. Slots are batched as disjoint
copies of the device set, so one call encodes many slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from torch import nn

from model.graphs import SlotGraph


@dataclass(frozen=True)
class GNNConfig:
    node_dim: int = 128  # node2vec dimension
    psi_bits: int = 8  # T_col quantized to 2**bits levels, one input per bit
    psi_dim: int = 16
    time_dim: int = 16
    widths: tuple[int, ...] = (32, 64, 32)
    dropout: float = 0.0

    @property
    def out_dim(self) -> int:
        return self.widths[-1]


class ReliabilityEncoding(nn.Module):
    """psi: T_col in [0, 1] -> its ``bits``-bit binary code (as +-1) -> Linear -> (E, psi_dim)."""

    def __init__(self, bits: int, dim: int) -> None:
        super().__init__()
        self.register_buffer("powers", 2 ** torch.arange(bits - 1, -1, -1), persistent=False)
        self.proj = nn.Linear(bits, dim)

    def forward(self, t_col: torch.Tensor) -> torch.Tensor:
        levels = self.powers[0] * 2 - 1
        code = torch.round(t_col.clamp(0, 1) * levels).long()
        bits = (code[:, None] // self.powers % 2).float() * 2 - 1  # (E, bits)
        return self.proj(bits)


class TimeEncoding(nn.Module):
    """eta: DyGMamba's learnable cosine encoding cos(t * w + b), w initialised to 10**-linspace(0, 9, dim)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.w = nn.Linear(1, dim)
        with torch.no_grad():
            self.w.weight.copy_(10.0 ** -torch.linspace(0, 9, dim)[:, None])
            self.w.bias.zero_()

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return torch.cos(self.w(t[:, None]))  # (E, dim)


class FusionLayer(nn.Module):
    """h_j <- ReLU(W_self h_j + mean over in-edges (i -> j) of W_msg [h_i, psi_ij, eta_ij]); a node without in-edges
    gets ReLU(W_self h_j)."""

    def __init__(self, in_dim: int, edge_dim: int, out_dim: int) -> None:
        super().__init__()
        self.message_proj = nn.Linear(in_dim + edge_dim, out_dim)
        self.self_proj = nn.Linear(in_dim, out_dim)

    def forward(self, h: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        """h (n, in_dim); edge_index (2, E) rows of h, source then target; edge_attr (E, edge_dim) -> (n, out_dim)."""
        src, dst = edge_index[0], edge_index[1]
        messages = self.message_proj(torch.cat([h.index_select(0, src), edge_attr], dim=-1))  # (E, out_dim)
        sums = h.new_zeros((h.shape[0], messages.shape[1])).scatter_add(0, dst[:, None].expand_as(messages), messages)
        degree = h.new_zeros((h.shape[0],)).scatter_add(0, dst, torch.ones_like(messages[:, 0]))  # (n,) in-edges
        return torch.relu(self.self_proj(h) + sums / degree.clamp(min=1.0)[:, None])


class SlotEncoder(nn.Module):
    """node2vec features + slot graphs -> (slots, devices, out_dim) slot embeddings, idle devices explicit."""

    def __init__(self, config: GNNConfig) -> None:
        super().__init__()
        self.config = config
        self.psi = ReliabilityEncoding(config.psi_bits, config.psi_dim)
        self.eta = TimeEncoding(config.time_dim)
        dims = (config.node_dim, *config.widths)
        edge_dim = config.psi_dim + config.time_dim
        self.layers = nn.ModuleList(FusionLayer(a, edge_dim, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = nn.Dropout(config.dropout)
        self.idle = nn.Parameter(torch.zeros(config.out_dim))

    def forward(self, features: torch.Tensor, graphs: Sequence[SlotGraph | None]) -> torch.Tensor:
        """features: (n, node_dim); graphs: one per slot (None = nobody active) -> (len(graphs), n, out_dim)."""
        n = features.shape[0]
        nodes, src, dst, t_col, offset = (t.to(features.device) for t in batched_inputs(graphs, n))  # active only
        h = self.encode(features[nodes % n], src, dst, t_col, offset)  # (active nodes over all slots, out_dim)
        out = self.idle.expand(len(graphs) * n, self.config.out_dim)
        out = out.index_put((nodes,), h)  # (slots * n, out_dim): idle everywhere else
        return out.view(len(graphs), n, self.config.out_dim)

    def encode(self, h: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, t_col: torch.Tensor,
               offset: torch.Tensor) -> torch.Tensor:
        """The layers over active nodes only: h (a, node_dim); edges src -> dst (E,) as positions in h,
        with T_col and in-slot offset (E,) -> (a, out_dim)."""
        edge_attr = torch.cat([self.psi(t_col), self.eta(offset)], dim=-1)  # (E, psi_dim + time_dim)
        edge_index = torch.stack([src, dst])
        for layer in self.layers:
            h = self.dropout(layer(h, edge_index, edge_attr))
        return h


def batched_inputs(graphs: Sequence[SlotGraph | None], n: int) -> tuple[torch.Tensor, ...]:
    """Active nodes of all slots as ids k*n + device (sorted), and the edges relabelled onto them."""
    parts = [(k, g) for k, g in enumerate(graphs) if g is not None and len(g.src)]
    if not parts:
        empty = torch.zeros(0)
        return empty.long(), empty.long(), empty.long(), empty, empty
    src = np.concatenate([g.src + k * n for k, g in parts])
    dst = np.concatenate([g.dst + k * n for k, g in parts])
    nodes = np.unique(np.concatenate([src, dst]))
    t_col = np.concatenate([g.t_col for _, g in parts])
    offset = np.concatenate([g.offset for _, g in parts])
    return (torch.from_numpy(nodes), torch.from_numpy(np.searchsorted(nodes, src)),
            torch.from_numpy(np.searchsorted(nodes, dst)), torch.from_numpy(t_col).float(),
            torch.from_numpy(offset).float())
