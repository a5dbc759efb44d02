"""The shared slot scorer: consistent with the training path, shardable, and ranking by the paper's rule."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from model.bm import BM
from model.config import RankingConfig, SystemParams
from model.evaluate import simulated_log
from model.graphs import DeviceIndex
from model.history import History
from model.scoring import DeviceFrame, DeviceHistory, score_log, slot_part, status_arrays
from model.stages import TorchStages
from simulator.config import SimConfig
from simulator.engine import Simulator
from tests.test_bm import SMALL

SIM = SimConfig(devices=40, tasks=600, slots=12, seed=3)


@pytest.fixture(scope="module")
def log():
    events, _ = simulated_log(SIM)
    simulator = Simulator(SIM)
    status = pa.concat_tables([simulator.status_table(s) for s in range(SIM.slots)])
    history = History.from_events(events, SIM.clock, SMALL.weights)
    torch.manual_seed(0)
    model = BM(SMALL, np.random.default_rng(0).normal(size=(len(history.index), 8)).astype(np.float32)).eval()
    return events, status, history, model


def test_slot_scores_equal_the_training_paths_prediction(log) -> None:
    events, status, history, model = log
    ranking = RankingConfig(range_m=None, scores_per_owner=1000)
    for result in score_log(TorchStages(model), history.index, events, status, ranking, SystemParams(), "v1"):
        if result.slot not in (2, 9):
            continue
        rows = {name: i for i, name in enumerate(history.index.ids)}
        src = np.array([rows[s.owner] for s in result.scores])
        dst = np.array([rows[s.collaborator] for s in result.scores])
        with torch.no_grad():
            expected = model.t_beh(model.pair_logits(history, src, dst, np.full(len(src), result.slot))).numpy()
        got = np.array([s.t_beh for s in result.scores])
        assert len(got) > 100
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_shards_give_the_same_frame_as_one_history(log) -> None:
    events, status, history, model = log
    index, clock, ranking = history.index, SIM.clock, RankingConfig()
    whole = DeviceHistory(np.arange(len(index)))
    shards = [DeviceHistory(np.arange(len(index))[k::3]) for k in range(3)]
    slot_of = clock.slot_of(events["event_time_ms"].to_numpy())
    for slot in range(6):
        part = slot_part(TorchStages(model), index, events.filter(slot_of == slot), slot)
        whole.add_part(part)
        for shard in shards:
            shard.add_part(part.select(shard.rows))
    for target in [whole, *shards]:
        target.add_status(*status_arrays(index, status))
    one = whole.frame(TorchStages(model), 5, clock, ranking)
    joined = DeviceFrame.concat([s.frame(TorchStages(model), 5, clock, ranking) for s in shards])
    for name in ("rows", "status", "recent_owner"):
        np.testing.assert_array_equal(getattr(one, name), getattr(joined, name))
    np.testing.assert_allclose(one.y, joined.y, atol=1e-6)
    np.testing.assert_array_equal(np.isnan(one.profile), np.isnan(joined.profile))


def test_rankings_follow_the_rule_and_bounds(log) -> None:
    events, status, history, model = log
    ranking = RankingConfig(top_k=3, scores_per_owner=4, range_m=400.0)
    results = list(score_log(TorchStages(model), history.index, events, status, ranking, SystemParams(), "v1"))
    slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
    for result in results:
        owners = set(events.filter(slot_of == result.slot)["owner"].to_pylist())
        assert {r.owner for r in result.rankings} == owners
        assert len(result.scores) <= 4 * len(owners)
        for r in result.rankings:
            assert len(r.candidates) <= 3
            assert all(c.trust >= r.threshold for c in r.candidates)  # the records also validate this
            assert [c.voc for c in r.candidates] == sorted((c.voc for c in r.candidates), reverse=True)


def test_status_is_taken_as_of_the_slot_end() -> None:
    history = DeviceHistory(np.array([0, 1]))
    values = np.arange(3 * 8, dtype=float).reshape(3, 8)
    history.add_status(np.array([0, 0, 1]), np.array([100, 50, 500]), values)
    model = BM(SMALL, np.zeros((2, 8), dtype=np.float32))
    clock = SMALL.clock.__class__(origin_ms=0, slot_ms=200)
    frame = history.frame(TorchStages(model), 0, clock, RankingConfig())
    np.testing.assert_array_equal(frame.status[0], values[0])  # time 100 is the latest before 200
    assert np.isnan(frame.status[1]).all()  # device 1's only status comes after the slot
    history.prune(0, 150)
    assert history.status_times.tolist() == [100, 500]


def test_unknown_devices_are_left_out_of_the_slot(log) -> None:
    events, _, history, model = log
    index = DeviceIndex(history.index.ids[:20])
    part = slot_part(TorchStages(model), index, events.slice(0, 60), 0)
    assert part.active.max() < 20 and part.owners.max() < 20
