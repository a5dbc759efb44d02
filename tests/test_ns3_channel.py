"""The ns-3 channel (the ns3 extra): ns-3's fading models agree with the closed-form Rayleigh outage."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from model.config import SystemParams
from simulator.channel import Ns3Channel, RayleighChannel
from simulator.config import ChannelModel, SimConfig
from simulator.engine import Simulator

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("ns") is None, reason="needs the ns3 extra"),
]


def test_ns3_outage_matches_the_closed_form_and_is_cached(tmp_path) -> None:
    params = SystemParams()
    measured = Ns3Channel(params, 0.0, 0.1, max_distance_m=600, bin_m=50, samples=3000, cache_dir=tmp_path)
    distance = measured.edges
    closed = RayleighChannel(params, 0.0).p_tr(distance, np.full(len(distance), 0.1))
    tolerance = 4 * np.sqrt(closed * (1 - closed) / 3000) + 1e-3
    assert (np.abs(measured.table - closed) <= tolerance).all(), (measured.table, closed)
    assert measured.table[0] > 0.99 and measured.table[-1] < 0.2
    cached = Ns3Channel(params, 0.0, 0.1, max_distance_m=600, bin_m=50, samples=3000, cache_dir=tmp_path)
    assert list(tmp_path.iterdir()) == [measured.cache] and np.array_equal(cached.table, measured.table)


def test_simulation_runs_on_the_ns3_channel(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path))
    config = SimConfig(devices=60, tasks=600, slots=6, area_m=400, channel=ChannelModel.NS3)
    summary = Simulator(config).run([]).as_dict()
    rayleigh = Simulator(SimConfig(devices=60, tasks=600, slots=6, area_m=400)).run([]).as_dict()
    assert summary["events"] == 600
    assert abs(summary["mean_true_reliability"] - rayleigh["mean_true_reliability"]) < 0.03
