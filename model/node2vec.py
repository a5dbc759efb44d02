"""node2vec device embeddings: weighted second-order (p, q) random walks and skip-gram with negative sampling.

Written here because PyG's Node2Vec needs pyg-lib. Walks are vectorized over
all walkers: each step proposes a neighbour in proportion to edge weight and
accepts it with the node2vec bias (1/p to return, 1 to stay at distance one
from the previous node, 1/q to move away) divided by its maximum — rejection
sampling that yields exactly the biased distribution without per-node tables.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

MAX_REJECTIONS = 32


@dataclass(frozen=True)
class Node2VecConfig:
    dim: int = 128
    walk_length: int = 20
    walks_per_node: int = 10
    window: int = 5
    p: float = 1.0  # return parameter
    q: float = 1.0  # in-out parameter
    negatives: int = 5
    epochs: int = 2
    batch_size: int = 1024
    lr: float = 0.01


@dataclass(frozen=True)
class Graph:
    """An undirected weighted graph in CSR form (both directions stored)."""

    indptr: np.ndarray  # (n + 1,)
    indices: np.ndarray  # (2E,)
    cum_weight: np.ndarray  # (2E,) running sum of weights in CSR order
    keys: np.ndarray  # sorted src * n + dst, for membership tests

    @classmethod
    def from_edges(cls, n: int, src: np.ndarray, dst: np.ndarray, weight: np.ndarray) -> "Graph":
        """Symmetrize, merge parallel edges (weights add) and drop self-loops."""
        keep = src != dst
        a = np.concatenate([src[keep], dst[keep]]).astype(np.int64)
        b = np.concatenate([dst[keep], src[keep]]).astype(np.int64)
        w = np.concatenate([weight[keep], weight[keep]]).astype(np.float64)
        keys, inverse = np.unique(a * n + b, return_inverse=True)
        merged = np.bincount(inverse, weights=w, minlength=len(keys))
        rows, cols = keys // n, keys % n
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=n))])
        return cls(indptr, cols, np.cumsum(merged), keys)

    @property
    def n(self) -> int:
        return len(self.indptr) - 1

    def degree(self, nodes: np.ndarray) -> np.ndarray:
        return self.indptr[nodes + 1] - self.indptr[nodes]

    def sample_neighbours(self, nodes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """A neighbour of each node drawn in proportion to edge weight (nodes must have degree > 0)."""
        start, end = self.indptr[nodes], self.indptr[nodes + 1]
        before = np.where(start > 0, self.cum_weight[np.maximum(start - 1, 0)], 0.0)
        total = self.cum_weight[end - 1] - before
        position = np.searchsorted(self.cum_weight, before + rng.random(len(nodes)) * total, side="right")
        return self.indices[np.clip(position, start, end - 1)]

    def connected(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        key = a * self.n + b
        found = np.searchsorted(self.keys, key)
        return (found < len(self.keys)) & (self.keys[np.minimum(found, len(self.keys) - 1)] == key)


def random_walks(graph: Graph, config: Node2VecConfig, rng: np.random.Generator) -> np.ndarray:
    """(walks_per_node * n, walk_length) node ids; walks stop (padded with -1) at isolated nodes."""
    starts = np.tile(np.arange(graph.n), config.walks_per_node)
    walks = np.full((len(starts), config.walk_length), -1, dtype=np.int64)
    walks[:, 0] = starts
    bias = np.array([1.0 / config.p, 1.0, 1.0 / config.q])
    ceiling = bias.max()
    for step in range(1, config.walk_length):
        current = walks[:, step - 1]
        alive = np.flatnonzero((current >= 0) & (graph.degree(np.maximum(current, 0)) > 0))
        if step == 1:
            walks[alive, 1] = graph.sample_neighbours(current[alive], rng)
            continue
        pending = alive
        for attempt in range(MAX_REJECTIONS):
            node, previous = walks[pending, step - 1], walks[pending, step - 2]
            proposal = graph.sample_neighbours(node, rng)
            kind = np.where(proposal == previous, 0, np.where(graph.connected(previous, proposal), 1, 2))
            accept = rng.random(len(pending)) * ceiling < bias[kind]
            if attempt == MAX_REJECTIONS - 1:
                accept[:] = True
            walks[pending[accept], step] = proposal[accept]
            pending = pending[~accept]
            if not len(pending):
                break
    return walks


def skipgram_pairs(walks: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(center, context) pairs within ``window`` steps, both directions, skipping padding."""
    centers, contexts = [], []
    for shift in range(1, window + 1):
        a, b = walks[:, :-shift].ravel(), walks[:, shift:].ravel()
        valid = (a >= 0) & (b >= 0)
        centers += [a[valid], b[valid]]
        contexts += [b[valid], a[valid]]
    return np.concatenate(centers), np.concatenate(contexts)


def node2vec_embeddings(graph: Graph, config: Node2VecConfig, seed: int = 0) -> np.ndarray:
    """(n, dim) float32 embeddings trained by skip-gram with negative sampling over biased walks."""
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    centers, contexts = skipgram_pairs(random_walks(graph, config, rng), config.window)
    frequency = np.bincount(centers, minlength=graph.n).astype(np.float64) ** 0.75
    noise = torch.from_numpy(frequency / frequency.sum() if frequency.sum() else np.full(graph.n, 1.0 / graph.n))
    scale = 0.5 / config.dim
    inner = torch.nn.Parameter((torch.rand(graph.n, config.dim, generator=generator) - 0.5) * 2 * scale)
    outer = torch.nn.Parameter(torch.zeros(graph.n, config.dim))
    optimizer = torch.optim.Adam([inner, outer], lr=config.lr)
    pairs = torch.from_numpy(np.stack([centers, contexts], axis=1))
    for _ in range(config.epochs):
        order = torch.randperm(len(pairs), generator=generator)
        for batch in pairs[order].split(config.batch_size):
            center, context = inner[batch[:, 0]], outer[batch[:, 1]]
            negative = outer[torch.multinomial(noise, len(batch) * config.negatives, True, generator=generator)]
            negative = negative.view(len(batch), config.negatives, config.dim)
            loss = -(F.logsigmoid((center * context).sum(-1)).mean()
                     + F.logsigmoid(-(negative @ center[:, :, None]).squeeze(-1)).sum(-1).mean())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return inner.detach().numpy().astype(np.float32)
