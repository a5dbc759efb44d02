"""The slot GNN: encodings, message direction, idle devices, batching of slots."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from model.gnn import FusionLayer, GNNConfig, ReliabilityEncoding, SlotEncoder, TimeEncoding
from model.graphs import SlotGraph

CONFIG = GNNConfig(node_dim=8, psi_dim=4, time_dim=4)


def graph(slot: int, src, dst, t_col) -> SlotGraph:
    return SlotGraph(slot, np.array(src), np.array(dst), np.array(t_col, dtype=float), np.zeros(len(src)))


def test_binary_reliability_code() -> None:
    encoding = ReliabilityEncoding(bits=3, dim=3)
    with torch.no_grad():
        encoding.proj.weight.copy_(torch.eye(3))
        encoding.proj.bias.zero_()
    # 0 -> 000, 1 -> 111, 3/7 -> 011 (as -1/+1)
    out = encoding(torch.tensor([0.0, 1.0, 3 / 7]))
    assert out.tolist() == [[-1, -1, -1], [1, 1, 1], [-1, 1, 1]]


def test_time_encoding_is_cosine_of_learnable_frequencies() -> None:
    eta = TimeEncoding(4)
    out = eta(torch.tensor([0.0, 0.5]))
    assert torch.allclose(out[0], torch.ones(4))
    assert torch.allclose(out[1], torch.cos(0.5 * 10.0 ** -torch.linspace(0, 9, 4)))
    assert eta.w.weight.requires_grad


@pytest.mark.parametrize("nodes, edges", [(4, 0), (6, 9), (200, 3000)])
def test_fusion_layer_is_the_mean_of_projected_messages_over_in_edges(nodes: int, edges: int) -> None:
    """Against the dense reference: messages summed by an in-edge count matrix A[j, e] = [dst_e = j], divided by the
    in-degree; a node without in-edges gets ReLU(W_self h) alone; repeated edges count once each."""
    g = torch.Generator().manual_seed(nodes + edges)
    layer = FusionLayer(5, 3, 7)
    h, attr = torch.randn(nodes, 5, generator=g), torch.randn(edges, 3, generator=g)
    src, dst = torch.randint(0, nodes, (edges,), generator=g), torch.randint(0, nodes // 2 + 1, (edges,), generator=g)
    incidence = torch.zeros(nodes, edges)
    incidence[dst, torch.arange(edges)] = 1.0
    messages = layer.message_proj(torch.cat([h[src], attr], dim=-1))
    mean = incidence @ messages / incidence.sum(1, keepdim=True).clamp(min=1.0)
    expected = torch.relu(layer.self_proj(h) + mean)
    assert torch.allclose(layer(h, torch.stack([src, dst]), attr), expected, atol=1e-5)
    silent = incidence.sum(1) == 0
    assert silent.any()  # targets drawn from the lower half: the upper half hears nothing
    assert torch.allclose(layer(h, torch.stack([src, dst]), attr)[silent], torch.relu(layer.self_proj(h))[silent])


def test_idle_devices_get_the_idle_embedding_and_messages_flow_to_collaborators() -> None:
    torch.manual_seed(0)
    encoder = SlotEncoder(CONFIG).eval()
    features = torch.randn(4, 8)
    with torch.no_grad():
        encoder.idle.copy_(torch.full((32,), 7.0))
        out = encoder(features, [graph(0, [0], [1], [0.9]), None])
        changed = encoder(features, [graph(0, [0], [1], [0.1]), None])
    assert out.shape == (2, 4, 32)
    assert torch.equal(out[0, 2], torch.full((32,), 7.0)) and torch.equal(out[1], torch.full((4, 32), 7.0))
    assert not torch.allclose(out[0, 1], changed[0, 1])  # the collaborator's embedding depends on T_col
    torch.testing.assert_close(out[0, 0], changed[0, 0])  # the owner's does not (messages flow i -> j)


def test_slots_are_encoded_independently_in_one_batch() -> None:
    torch.manual_seed(1)
    encoder = SlotEncoder(CONFIG).eval()
    features = torch.randn(5, 8)
    g0, g1 = graph(0, [0, 2], [1, 1], [0.5, 1.0]), graph(1, [3], [4], [0.2])
    with torch.no_grad():
        both = encoder(features, [g0, g1])
        alone = encoder(features, [g1])
    torch.testing.assert_close(both[1], alone[0])


def test_gradients_reach_every_parameter() -> None:
    encoder = SlotEncoder(CONFIG)
    out = encoder(torch.randn(3, 8), [graph(0, [0, 1], [1, 2], [0.3, 0.8]), None])
    out.sum().backward()
    assert all(p.grad is not None for p in encoder.parameters())


def test_a_step_lowers_the_loss_on_a_tiny_case() -> None:
    """Two collaborators, one always served well and one badly: a few Adam steps on the slot encoder (and a
    linear readout) must separate them; the loss after the steps is lower than before."""
    torch.manual_seed(2)
    encoder = SlotEncoder(CONFIG)
    readout = torch.nn.Linear(32, 1)
    features = torch.randn(4, 8)
    slots = [graph(0, [0, 1], [2, 3], [1.0, 0.0]), graph(1, [1, 0], [2, 3], [1.0, 0.0])]
    target = torch.tensor([1.0, 0.0])  # device 2 reliable, device 3 not

    def loss() -> torch.Tensor:
        embeddings = encoder(features, slots)  # (2 slots, 4 devices, 32)
        logits = readout(embeddings[:, 2:]).squeeze(-1)  # (2, 2)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, target.expand_as(logits))

    optimizer = torch.optim.Adam([*encoder.parameters(), *readout.parameters()], lr=1e-2)
    before = loss().item()
    for _ in range(20):
        optimizer.zero_grad()
        value = loss()
        value.backward()
        optimizer.step()
    assert loss().item() < 0.5 * before
