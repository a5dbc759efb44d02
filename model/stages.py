"""BM's three inference stages behind one interface, so scoring runs on PyTorch or onnxruntime.

A scorer (:mod:`model.scoring`) needs only these stages of a trained BM:

* ``slot_embeddings``: the slot GNN over one slot graph -> the active devices' slot embeddings
* ``long_term``: the sequence encoder (BiMamba) over S slot embeddings per device -> Y
* ``t_beh``: the pair head on Y_i (+) Y_j -> T_beh

:class:`TorchStages` runs them on the PyTorch model; ``exporters.onnx.OnnxStages`` runs the
exported ONNX graphs. Both take and return numpy arrays (float32 in, float32/float64 out).
"""

from __future__ import annotations

from typing import Iterator, Protocol

import numpy as np
import torch

from model.bm import BM, BMConfig
from model.gnn import batched_inputs
from model.graphs import SlotGraph


class Stages(Protocol):
    config: BMConfig
    idle: np.ndarray  # (d,) the slot embedding of an idle device

    def slot_embeddings(self, graph: SlotGraph) -> tuple[np.ndarray, np.ndarray]:
        """One slot graph over the model's devices -> (active rows (a,) sorted, embeddings (a, d))."""

    def long_term(self, sequences: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """(n, S, d) float32 right-padded slot embeddings, (n,) int64 lengths -> (n, d) float32 Y."""

    def t_beh(self, y_i: np.ndarray, y_j: np.ndarray) -> np.ndarray:
        """(P, d), (P, d) long-term embeddings of owners and candidates -> (P,) float64 T_beh."""


def chunks(n: int, size: int) -> Iterator[slice]:
    """Slices covering range(n) in pieces of at most ``size`` (bounds the memory of a stage call)."""
    return (slice(begin, begin + size) for begin in range(0, n, size))


def pairs(y_i: np.ndarray, y_j: np.ndarray, part: slice) -> np.ndarray:
    """(p, 2d) float32 head input Y_i (+) Y_j for the pairs in ``part``."""
    return np.concatenate([y_i[part], y_j[part]], axis=1).astype(np.float32, copy=False)


class TorchStages:
    """The stages on the PyTorch model (inference mode, the configured scan backend)."""

    def __init__(self, model: BM, devices_per_call: int = 8192, pairs_per_call: int = 65536) -> None:
        self.model = model.eval()
        self.devices_per_call, self.pairs_per_call = devices_per_call, pairs_per_call
        self.config = model.config
        self.idle = model.slot_encoder.idle.detach().numpy()

    def slot_embeddings(self, graph: SlotGraph) -> tuple[np.ndarray, np.ndarray]:
        nodes, src, dst, t_col, offset = batched_inputs([graph], len(self.model.features))
        with torch.no_grad():
            h = self.model.slot_encoder.encode(self.model.features[nodes], src, dst, t_col, offset)  # (a, d)
        return nodes.numpy(), h.numpy()

    def long_term(self, sequences: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        out = np.zeros((len(sequences), self.config.gnn.out_dim), np.float32)
        with torch.no_grad():
            for part in chunks(len(sequences), self.devices_per_call):
                out[part] = self.model.sequence_encoder(torch.from_numpy(sequences[part]),
                                                        torch.from_numpy(lengths[part])).numpy()
        return out

    def t_beh(self, y_i: np.ndarray, y_j: np.ndarray) -> np.ndarray:
        out = np.zeros(len(y_i))
        with torch.no_grad():
            for part in chunks(len(y_i), self.pairs_per_call):
                logits = self.model.head(torch.from_numpy(pairs(y_i, y_j, part)))  # (p, levels)
                out[part] = self.model.t_beh(logits).double().numpy()
        return out
