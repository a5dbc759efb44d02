"""Sequence encoders over a device's slot embeddings: BiMamba (BM) and the learned baselines.

All map (batch, L, d) right-padded sequences with ``lengths`` to (batch, d), so
the baselines share BM's slot GNN, pair head, inputs, split and training:

* ``bimamba``: the paper's 3 bidirectional Mamba layers + max-pool
* ``lstm``: an LSTM's hidden state after each sequence's last valid slot
* ``transformer``: a Transformer encoder with learned positions, padding masked, max-pool
* ``last``: the GNN embedding of the last slot alone (the "GNN only" baseline)
* ``pool``: the max over the window's GNN embeddings, no sequence model: what BiMamba's and the Transformer's
  residual paths and max-pool give by themselves (the control that tells what the sequence models add)
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import nn

from model.bimamba import BiMambaEncoder, MambaConfig, max_pool, valid_mask

SequenceKind = Literal["bimamba", "lstm", "transformer", "last", "pool"]


def last_valid(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(batch, L, d) -> (batch, d): each sequence's last valid position."""
    return x[torch.arange(len(x), device=x.device), lengths - 1]


class LastSlot(nn.Module):
    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return last_valid(x, lengths)


class WindowMax(nn.Module):
    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return max_pool(x, lengths)


class LSTMEncoder(nn.Module):
    def __init__(self, d_model: int, layers: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(d_model, d_model, num_layers=layers, batch_first=True)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)  # causal: padding after a sequence never reaches its last valid step
        return last_valid(out, lengths)


class TransformerEncoder(nn.Module):
    def __init__(self, d_model: int, layers: int, window: int, heads: int = 4) -> None:
        super().__init__()
        self.position = nn.Parameter(torch.zeros(window, d_model))
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=2 * d_model, batch_first=True,
                                           dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        out = self.encoder(x + self.position[: x.shape[1]], src_key_padding_mask=~valid_mask(lengths, x.shape[1]))
        return max_pool(out, lengths)


def sequence_encoder(kind: SequenceKind, config: MambaConfig, window: int) -> nn.Module:
    if kind == "bimamba":
        return BiMambaEncoder(config)
    if kind == "lstm":
        return LSTMEncoder(config.d_model, config.n_layers)
    if kind == "transformer":
        return TransformerEncoder(config.d_model, config.n_layers, window)
    if kind == "last":
        return LastSlot()
    if kind == "pool":
        return WindowMax()
    raise ValueError(f"sequence: unknown kind {kind!r} (known: {', '.join(get_args(SequenceKind))})")
