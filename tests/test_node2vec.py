"""node2vec: walks follow weighted edges, p and q bias them as defined, embeddings separate communities."""

from __future__ import annotations

import numpy as np
import pytest

from model.node2vec import Graph, Node2VecConfig, node2vec_embeddings, random_walks, skipgram_pairs


def two_cliques(size: int = 8) -> Graph:
    src, dst = [], []
    for base in (0, size):
        for i in range(size):
            for j in range(i + 1, size):
                src.append(base + i)
                dst.append(base + j)
    src.append(0)
    dst.append(size)  # one bridge
    return Graph.from_edges(2 * size, np.array(src), np.array(dst), np.ones(len(src)))


def test_csr_is_symmetric_and_merges_parallel_edges() -> None:
    g = Graph.from_edges(3, np.array([0, 0, 1, 2]), np.array([1, 1, 2, 2]), np.array([1.0, 2.0, 5.0, 9.0]))
    assert g.indptr.tolist() == [0, 1, 3, 4] and g.indices.tolist() == [1, 0, 2, 1]
    assert np.diff(np.concatenate([[0], g.cum_weight])).tolist() == [3.0, 3.0, 5.0, 5.0]
    assert g.connected(np.array([0, 1, 0]), np.array([1, 0, 2])).tolist() == [True, True, False]


def test_walks_follow_edges_and_stop_at_isolated_nodes() -> None:
    g = Graph.from_edges(5, np.array([0, 1, 2]), np.array([1, 2, 3]), np.ones(3))  # node 4 isolated
    walks = random_walks(g, Node2VecConfig(walk_length=12, walks_per_node=20), np.random.default_rng(0))
    for walk in walks:
        steps = walk[walk >= 0]
        assert g.connected(steps[:-1], steps[1:]).all()
    assert (walks[walks[:, 0] == 4][:, 1:] == -1).all()


def test_neighbours_are_drawn_in_proportion_to_weight() -> None:
    g = Graph.from_edges(3, np.array([0, 0]), np.array([1, 2]), np.array([9.0, 1.0]))
    draws = g.sample_neighbours(np.zeros(20_000, dtype=np.int64), np.random.default_rng(1))
    assert (draws == 1).mean() == pytest.approx(0.9, abs=0.01)


@pytest.mark.parametrize("p, q, more_returns", [(0.1, 1.0, True), (10.0, 1.0, False)])
def test_return_parameter_biases_backtracking(p: float, q: float, more_returns: bool) -> None:
    # a path 0-1-2-...-9: from an interior node, unbiased walks go back half the time
    n = 10
    g = Graph.from_edges(n, np.arange(n - 1), np.arange(1, n), np.ones(n - 1))
    walks = random_walks(g, Node2VecConfig(walk_length=6, walks_per_node=200, p=p, q=q), np.random.default_rng(2))
    back = walks[:, 2:] == walks[:, :-2]
    interior = (walks[:, 1:-1] > 0) & (walks[:, 1:-1] < n - 1)
    rate = back[interior].mean()
    assert (rate > 0.75) if more_returns else (rate < 0.25)


def test_skipgram_pairs_within_window() -> None:
    centers, contexts = skipgram_pairs(np.array([[0, 1, 2, -1]]), window=1)
    assert sorted(zip(centers.tolist(), contexts.tolist())) == [(0, 1), (1, 0), (1, 2), (2, 1)]


def test_embeddings_separate_communities_and_are_deterministic() -> None:
    g = two_cliques()
    config = Node2VecConfig(dim=16, walk_length=10, walks_per_node=20, epochs=3, batch_size=256)
    emb = node2vec_embeddings(g, config, seed=5)
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    sim = unit @ unit.T
    community = np.arange(16) < 8
    same = community[:, None] == community[None, :]
    np.fill_diagonal(same, False)
    different = community[:, None] != community[None, :]
    assert sim[same].mean() > sim[different].mean() + 0.3
    assert np.array_equal(emb, node2vec_embeddings(g, config, seed=5))
