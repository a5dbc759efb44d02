"""bench/voc_level.py at toy size: every arm is scored on the same draws, and a factor moves only the level."""

from __future__ import annotations

from bench.voc_level import RIVALS, measure
from model.bimamba import MambaConfig
from model.bm import BMConfig
from model.gnn import GNNConfig
from model.node2vec import Node2VecConfig
from model.train import TrainConfig
from simulator.config import SimConfig


def test_a_factor_of_one_is_bm_and_a_half_halves_its_level() -> None:
    config = BMConfig(gnn=GNNConfig(node_dim=16, psi_dim=8, time_dim=8), mamba=MambaConfig(d_model=32, d_state=8,
                      n_layers=1), node2vec=Node2VecConfig(dim=16, walks_per_node=2, epochs=1), window=4,
                      head_members=2)
    rows, seconds = measure(SimConfig(devices=40, tasks=800, slots=12), config, TrainConfig(epochs=2, patience=1),
                            [1.0, 0.5])
    by_arm = {row.pop("arm"): row for row in rows}
    assert set(by_arm) == {"bm", "bm x1", "bm x0.5", *RIVALS, "oracle", "random"} and seconds > 0
    assert by_arm["bm x1"] == by_arm["bm"]  # the same draws for every arm
    assert abs(by_arm["bm x0.5"]["mean T_beh"] - by_arm["bm"]["mean T_beh"] / 2) <= 1e-3
    assert by_arm["bm x0.5"]["theta 0.9"] == 0  # T_beh x 0.5 <= 0.5: nobody qualifies at θ = 0.9
