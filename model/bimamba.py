"""Mamba blocks and the paper's bidirectional Mamba (BiMamba) sequence encoder.

Parameter names follow mamba-ssm (``in_proj``, ``conv1d``, ``x_proj``,
``dt_proj``, ``A_log``, ``D``, ``out_proj``) so weights move between backends.

A BiMamba layer runs a forward block over the slots and a backward block over
the slots reversed, then ``Linear(Y_fwd + Y_bwd) + X``. Sequences are
right-padded to a common length with per-sequence ``lengths``; the backward
direction reverses only each sequence's valid prefix, so padding stays at the
end of both scans and, both scans being causal, never reaches a valid position.
The encoder max-pools over valid slots only.

Cost of a new slot: a :class:`MambaBlock` advances in O(1) from its cached
(conv, ssm) state with :meth:`MambaBlock.step`. The backward direction starts
from the newest slot, so a new slot changes every backward state, and in a
stack the next layer's input changes at every position: re-encoding a device
after a new slot costs one O(S) pass of every layer (done batched per shard
when a slot closes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.scan import Backend, fused_inference, fused_inner, selective_scan


@dataclass(frozen=True)
class MambaConfig:
    d_model: int = 32
    d_state: int = 16
    expand: int = 2
    d_conv: int = 4
    dt_rank: int = 0  # 0: ceil(d_model / 16), as mamba-ssm's "auto"
    n_layers: int = 3
    dt_min: float = 0.001
    dt_max: float = 0.1
    backend: Backend = "auto"

    @property
    def d_inner(self) -> int:
        return self.expand * self.d_model

    @property
    def rank(self) -> int:
        return self.dt_rank or math.ceil(self.d_model / 16)


class MambaBlock(nn.Module):
    """Linear -> causal Conv1D -> SiLU -> selective scan (input-dependent delta, B, C), gated by SiLU(Linear(x)) -> Linear."""

    def __init__(self, config: MambaConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.in_proj = nn.Linear(c.d_model, 2 * c.d_inner, bias=False)
        self.conv1d = nn.Conv1d(c.d_inner, c.d_inner, c.d_conv, groups=c.d_inner, padding=c.d_conv - 1)
        self.x_proj = nn.Linear(c.d_inner, c.rank + 2 * c.d_state, bias=False)
        self.dt_proj = nn.Linear(c.rank, c.d_inner, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, c.d_state + 1, dtype=torch.float32)).repeat(c.d_inner, 1))
        self.D = nn.Parameter(torch.ones(c.d_inner))
        self.out_proj = nn.Linear(c.d_inner, c.d_model, bias=False)
        self._init_dt()

    def _init_dt(self) -> None:
        """mamba-ssm's init: dt_proj's bias is softplus^-1 of dt ~ logU(dt_min, dt_max)."""
        c = self.config
        nn.init.uniform_(self.dt_proj.weight, -c.rank**-0.5, c.rank**-0.5)
        dt = torch.exp(torch.rand(c.d_inner) * (math.log(c.dt_max) - math.log(c.dt_min)) + math.log(c.dt_min))
        dt = dt.clamp(min=1e-4)
        with torch.no_grad():
            self.dt_proj.bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def _ssm_inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: (batch, L, d_inner) -> delta (batch, d_inner, L), B and C (batch, N, L)."""
        c = self.config
        dt, B, C = self.x_proj(x).split([c.rank, c.d_state, c.d_state], dim=-1)
        delta = (dt @ self.dt_proj.weight.T).transpose(1, 2)
        return delta, B.transpose(1, 2), C.transpose(1, 2)

    def inner_weights(self) -> tuple[torch.Tensor, ...]:
        """What :func:`model.scan.fused_inner` reads of this block: conv_w (d_inner, d_conv), conv_b, x_proj
        (rank + 2N, d_inner), dt_proj (d_inner, rank), dt_bias, A (d_inner, N), D."""
        return (self.conv1d.weight[:, 0], self.conv1d.bias, self.x_proj.weight, self.dt_proj.weight,
                self.dt_proj.bias.float(), -torch.exp(self.A_log.float()), self.D.float())  # as forward's scan reads them

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: (batch, L, d_model) -> (batch, L, d_model)."""
        length = hidden.shape[1]
        if fused_inference(hidden, self.config.backend):  # inference on the CPU: one fused pass, no autograd
            lengths = torch.full((len(hidden),), length, dtype=torch.int64)
            inner = fused_inner(self.in_proj(hidden), lengths, *(w[None] for w in self.inner_weights()))
            return self.out_proj(inner)
        x, z = self.in_proj(hidden).chunk(2, dim=-1)  # (batch, L, d_inner) each
        x = F.silu(self.conv1d(x.transpose(1, 2))[..., :length])  # causal: (batch, d_inner, L)
        delta, B, C = self._ssm_inputs(x.transpose(1, 2))
        y = selective_scan(x, delta, -torch.exp(self.A_log.float()), B, C, self.D.float(), z.transpose(1, 2),
                           delta_bias=self.dt_proj.bias.float(), delta_softplus=True,
                           backend=self.config.backend)  # (batch, d_inner, L)
        return self.out_proj(y.transpose(1, 2))

    def initial_state(self, batch: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv_state (batch, d_inner, d_conv), ssm_state (batch, d_inner, N)), all zeros."""
        c = self.config
        return (torch.zeros(batch, c.d_inner, c.d_conv, device=device),
                torch.zeros(batch, c.d_inner, c.d_state, device=device))

    def step(self, hidden: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
             ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """One new position in O(1): hidden (batch, d_model) -> (batch, d_model), new state."""
        conv_state, ssm_state = state
        x, z = self.in_proj(hidden).chunk(2, dim=-1)  # (batch, d_inner)
        conv_state = torch.cat([conv_state[:, :, 1:], x[:, :, None]], dim=-1)  # (batch, d_inner, d_conv)
        x = F.silu((conv_state * self.conv1d.weight[:, 0]).sum(-1) + self.conv1d.bias)
        delta, B, C = self._ssm_inputs(x[:, None])  # (batch, d_inner, 1), (batch, N, 1)
        delta = F.softplus(delta[..., 0] + self.dt_proj.bias)  # (batch, d_inner)
        A = -torch.exp(self.A_log.float())
        ssm_state = torch.exp(delta[..., None] * A) * ssm_state + (delta * x)[..., None] * B[:, None, :, 0]
        y = (ssm_state * C[:, None, :, 0]).sum(-1) + self.D * x
        return self.out_proj(y * F.silu(z)), (conv_state, ssm_state)


def reverse_valid(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each sequence's first ``lengths[b]`` positions, leaving its padding in place.

    x: (batch, L, ...); lengths: (batch,). Applying it twice is the identity.
    """
    length = x.shape[1]
    positions = torch.arange(length, device=x.device)
    index = torch.where(positions < lengths[:, None], lengths[:, None] - 1 - positions, positions)  # (batch, L)
    return torch.gather(x, 1, index.view(*index.shape, *([1] * (x.dim() - 2))).expand_as(x))


def valid_mask(lengths: torch.Tensor, length: int) -> torch.Tensor:
    """(batch, L) True where a position holds data."""
    return torch.arange(length, device=lengths.device) < lengths[:, None]


def max_pool(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(batch, L, d) -> (batch, d): the max over each sequence's valid positions."""
    return x.masked_fill(~valid_mask(lengths, x.shape[1])[..., None], float("-inf")).amax(dim=1)


class BiMambaLayer(nn.Module):
    """Forward and backward Mamba blocks, summed, mixed by a Linear, plus the residual."""

    def __init__(self, config: MambaConfig) -> None:
        super().__init__()
        self.forward_block = MambaBlock(config)
        self.backward_block = MambaBlock(config)
        self.mix = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """x: (batch, L, d_model), lengths: (batch,) -> (batch, L, d_model), zero at padding."""
        if fused_inference(x, self.forward_block.config.backend):
            return self._fused(x, lengths)
        y_fwd = self.forward_block(x)
        y_bwd = reverse_valid(self.backward_block(reverse_valid(x, lengths)), lengths)
        out = self.mix(y_fwd + y_bwd) + x
        return out * valid_mask(lengths, x.shape[1])[..., None]

    def _fused(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Inference: both directions' in_proj as one GEMM, their inner passes in one C++ call (the backward one
        over each valid prefix reversed, so no reversal is copied), and out_proj folded into mix:
        mix(out_f y_f + out_b y_b) = [y_f, y_b] (mix.W [out_f.W, out_b.W])^T + mix.b, one more GEMM."""
        blocks = (self.forward_block, self.backward_block)
        batch, length, d = x.shape
        xz = x @ torch.cat([b.in_proj.weight for b in blocks]).T  # (batch, L, 4 d_inner)
        inner = fused_inner(xz, lengths, *(torch.stack(w) for w in zip(*(b.inner_weights() for b in blocks))))
        out_weight = self.mix.weight @ torch.cat([b.out_proj.weight for b in blocks], dim=1)  # (d, 2 d_inner)
        out = torch.addmm(self.mix.bias, inner.view(batch * length, -1), out_weight.T).view(batch, length, d) + x
        return out * valid_mask(lengths, length)[..., None]


class BiMambaEncoder(nn.Module):
    """n_layers BiMamba layers, then max-pool over valid slots: (batch, L, d_model) -> (batch, d_model)."""

    def __init__(self, config: MambaConfig) -> None:
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(BiMambaLayer(config) for _ in range(config.n_layers))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if not torch.jit.is_tracing() and ((lengths < 1).any() or (lengths > x.shape[1]).any()):
            raise ValueError(f"lengths: each must be in [1, {x.shape[1]}] (got {lengths.tolist()})")
        for layer in self.layers:
            x = layer(x, lengths)
        return max_pool(x, lengths)
