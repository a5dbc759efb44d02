"""The simulator: the paper's setting, valid wire records, hidden behaviours that matter, determinism."""

from __future__ import annotations

from dataclasses import replace

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from schemas import CollaborationEvent, DeviceStatus, from_arrow
from simulator.config import Behaviour, Policy, SimConfig, parse_mix
from simulator.engine import MemorySink, Simulator
from simulator.parquet_sink import ParquetSink
from simulator.world import World
from trustbeam.cli import main

SMALL = SimConfig(devices=120, tasks=3000, slots=30, seed=7)


def run(config: SimConfig) -> tuple[MemorySink, dict]:
    sink = MemorySink()
    summary = Simulator(config).run([sink])
    return sink, summary.as_dict()


@pytest.fixture(scope="module")
def small() -> tuple[MemorySink, dict]:
    return run(SMALL)


def test_columns_other_tools_read(small) -> None:
    sink, _ = small
    assert {"event_id", "event_time_ms", "slot", "owner", "collaborator", "task_size_bits",
            "density_cycles_per_bit", "tr_success", "com_success", "t_total_s", "e_total_j", "t_local_s",
            "e_local_j", "voc"} <= set(sink["events"].column_names)
    assert {"device", "cpu_hz", "x_m", "y_m", "tx_w", "rx_w"} <= set(sink["devices"].column_names)
    assert {"owner", "collaborator", "slot", "reliability"} <= set(sink["truth"].column_names)


def test_events_and_status_are_valid_wire_records(small) -> None:
    sink, summary = small
    events = from_arrow(CollaborationEvent, sink["events"])
    assert len(events) == summary["events"] == SMALL.tasks
    assert len({e.event_id for e in events}) == SMALL.tasks
    status = from_arrow(DeviceStatus, sink["status"])
    assert len(status) == SMALL.devices * SMALL.slots


def test_paper_setting_defaults() -> None:
    c = SimConfig()
    assert (c.devices, c.tasks, c.tx_w, c.rx_w, c.task_size_bits, c.density_cycles_per_bit) == (
        500, 10_000, 0.1, 0.08, 4e7, 2339.0)
    assert set(World(c).cpu_hz) == {2e9, 4e9, 6e9}
    assert (c.weights.a_tr, c.weights.a_com, c.system.xi_time) == (0.6, 0.4, 0.5)


def test_a_larger_fleet_keeps_each_devices_load_and_neighbours() -> None:
    larger = SMALL.at_fleet_size(4 * SMALL.devices)
    assert (larger.devices, larger.tasks, larger.area_m, larger.slots) == (480, 12_000, 2 * SMALL.area_m, SMALL.slots)
    neighbours = []
    for config in (SMALL, larger):
        world = World(config)
        gaps = np.hypot(world.x_m[:, None] - world.x_m[None, :], world.y_m[:, None] - world.y_m[None, :])
        neighbours.append(((gaps < config.range_m).sum() - config.devices) / config.devices)
    # at the same density a device far from the square's edges has as many in range; the larger square has fewer
    # devices near an edge, so more on average, never fewer
    assert neighbours[0] < neighbours[1] < 1.5 * neighbours[0]
    with pytest.raises(ValueError, match="--sim-devices: need at least 2 devices"):
        SMALL.at_fleet_size(1)


def test_a_longer_run_keeps_each_slots_tasks(small) -> None:
    longer = SMALL.at_run_length(2 * SMALL.slots)
    assert (longer.slots, longer.tasks, longer.devices, longer.area_m) == (60, 6000, SMALL.devices, SMALL.area_m)
    per_slot = [np.bincount(sink["events"]["slot"].to_numpy()) for sink in (small[0], run(longer)[0])]
    assert (len(per_slot[0]), len(per_slot[1])) == (30, 60) and per_slot[1].min() > 0
    assert abs(per_slot[1].mean() - per_slot[0].mean()) < 1e-9
    with pytest.raises(ValueError, match="--sim-slots: need at least 1 slot"):
        SMALL.at_run_length(0)


def test_tasks_run_sequentially_and_fill_every_slot(small) -> None:
    events = small[0]["events"]
    times = events["event_time_ms"].to_numpy()
    slots = events["slot"].to_numpy()
    assert (np.diff(times) >= 0).all()
    assert (SMALL.clock.slot_of(times) == slots).all()
    assert np.bincount(slots).tolist() == [SMALL.tasks // SMALL.slots] * SMALL.slots


def test_collaborators_are_in_range_unless_isolated(small) -> None:
    sink, summary = small
    events, devices = sink["events"], sink["devices"].to_pandas().set_index("device")
    owner = devices.loc[events["owner"].to_pylist(), ["x_m", "y_m"]].to_numpy()
    collab = devices.loc[events["collaborator"].to_pylist(), ["x_m", "y_m"]].to_numpy()
    distance = np.hypot(*(owner - collab).T)
    assert (distance > SMALL.range_m).sum() <= summary["fallbacks"]
    assert (events["owner"].to_numpy(zero_copy_only=False) != events["collaborator"].to_numpy(zero_copy_only=False)).all()


def test_truth_is_the_expectation_of_the_observed_weight() -> None:
    config = SimConfig(devices=200, tasks=40_000, slots=20, seed=3)
    sink, summary = run(config)
    events, truth = sink["events"], sink["truth"]
    observed = 0.6 * events["tr_success"].to_numpy() + 0.4 * events["com_success"].to_numpy()
    per_task = truth["reliability"].to_numpy() @ truth["tasks"].to_numpy() / truth["tasks"].to_numpy().sum()
    standard_error = observed.std() / np.sqrt(len(observed))
    assert abs(observed.mean() - per_task) < 4 * standard_error
    assert per_task == pytest.approx(summary["mean_true_reliability"])
    assert truth["tasks"].to_numpy().sum() == config.tasks
    keys = truth.select(["owner", "collaborator", "slot"]).to_pylist()
    assert len({tuple(k.values()) for k in keys}) == truth.num_rows


def test_a_tasks_expected_voc_is_its_achieved_voc_without_the_draws() -> None:
    simulator = Simulator(SMALL)
    slot, rng = 12, np.random.default_rng(0)
    tasks = simulator.slot_tasks(slot)
    owners = rng.integers(0, SMALL.devices, size=len(tasks))
    collabs, _ = simulator.choose(rng, owners, slot)
    index, thresholds = np.arange(tasks.start, tasks.stop), np.full(len(tasks), 0.5)
    runs = [simulator.outcome(slot, index, tasks, owners, collabs, thresholds, rng.random((2, len(tasks))))
            for _ in range(400)]
    first = runs[0]
    succeeded = first.tr & first.com
    assert 0 < succeeded.sum() < len(tasks)
    assert first.voc[succeeded] * first.p_com[succeeded] == pytest.approx(first.expected_voc[succeeded])
    assert (first.voc[~succeeded] == 0).all() and (first.expected_voc > 0).all()
    achieved = np.mean([r.voc for r in runs], axis=0)  # over the draws, per task: its expectation
    assert np.abs(achieved - first.expected_voc).mean() < 0.1 * first.expected_voc.mean()
    assert achieved.mean() == pytest.approx(first.expected_voc.mean(), rel=0.02)


def test_hidden_behaviour_shapes_reliability() -> None:
    world = World(SimConfig(devices=700, slots=200, seed=1))
    owners = np.zeros(700, dtype=np.int64)
    early = world.behaviour_reliability(np.arange(700), owners, 0)
    late = world.behaviour_reliability(np.arange(700), owners, 199)
    kind = world.behaviour

    def where(b: Behaviour) -> np.ndarray:
        return kind == b

    assert (early[where(Behaviour.DEGRADING)] > late[where(Behaviour.DEGRADING)]).all()
    assert (early[where(Behaviour.RECOVERING)] < late[where(Behaviour.RECOVERING)]).all()
    assert early[where(Behaviour.STABLE_RELIABLE)].min() > late[where(Behaviour.STABLE_UNRELIABLE)].max()
    device = np.flatnonzero(where(Behaviour.INTERMITTENT))[0]
    series = [world.behaviour_reliability(np.array([device]), np.array([0]), s)[0] for s in range(60)]
    assert set(np.round(series, 9)) == {round(world.params.high[device], 9), round(world.params.low[device], 9)}
    selective = np.flatnonzero(where(Behaviour.SELECTIVE))[0]
    toward = world.behaviour_reliability(np.full(699, selective), np.delete(np.arange(700), selective), 5)
    assert 0.15 < (toward == world.params.low[selective]).mean() < 0.45  # ~30% of owners are targeted


def test_telemetry_carries_the_load_and_the_traces_behaviours_leave() -> None:
    config = SimConfig(devices=400, tasks=200, slots=100, seed=2, telemetry=True)
    world = World(config)
    status = Simulator(config).status_table(30)
    everyone = np.arange(config.devices)
    np.testing.assert_allclose(status["cpu_load"].to_numpy(), world.load(everyone, 30))
    assert status["comp_ok"].to_numpy().tolist() == (world.load(everyone, 30) < config.overload).tolist()
    assert SimConfig().telemetry is False and Simulator(SimConfig(devices=5)).status_table(0)["cpu_load"].null_count == 5
    kind = world.behaviour
    periodic = np.flatnonzero(kind == Behaviour.PERIODIC)[:5]
    slots = np.arange(100)
    for device in periodic:  # reliability falls exactly as the usage cycle (the load's rhythm) rises
        reliability = [world.behaviour_reliability(np.array([device]), np.array([0]), t)[0] for t in slots]
        cycle = world.params.take(np.array([device])).cycle(slots)
        assert np.corrcoef(reliability, cycle)[0, 1] == pytest.approx(-1.0)
    # a degrading device takes on load as it degrades, a recovering one sheds it; the others do not drift
    drift_early, drift_late = world.drift(everyone, 0), world.drift(everyone, 99)
    assert (drift_late[kind == Behaviour.DEGRADING] > drift_early[kind == Behaviour.DEGRADING]).all()
    assert (drift_late[kind == Behaviour.RECOVERING] < drift_early[kind == Behaviour.RECOVERING]).all()
    steady = ~np.isin(kind, [Behaviour.DEGRADING, Behaviour.RECOVERING])
    assert not drift_early[steady].any() and not drift_late[steady].any()
    assert not World(replace(config, telemetry=False)).drift(everyone, 99).any()  # the paper's setting
    with pytest.raises(ValueError, match="load_drift"):
        SimConfig(telemetry=True, load_drift=0.5)  # past the largest load


def test_unreliable_collaborators_fail_more(small) -> None:
    sink, _ = small
    events = sink["events"].to_pandas()
    kinds = sink["devices"].to_pandas().set_index("device")["behaviour"]
    events["kind"] = kinds.loc[events["collaborator"]].to_numpy()
    rate = events[events.tr_success].groupby("kind").com_success.mean()
    assert rate["stable_reliable"] > rate["stable_unreliable"] + 0.3


def test_deterministic_for_a_seed_and_different_across_seeds(small) -> None:
    again, _ = run(SMALL)
    assert again["events"].equals(small[0]["events"]) and again["truth"].equals(small[0]["truth"])
    other, _ = run(SimConfig(devices=120, tasks=3000, slots=30, seed=8))
    assert not other["events"].equals(small[0]["events"])


def test_many_slots_and_random_policy() -> None:
    sink, summary = run(SimConfig(devices=40, tasks=1200, slots=600, policy=Policy.RANDOM, status_every=100))
    assert summary["slots"] == 600 and sink["events"]["slot"].to_numpy().max() == 599
    assert sink["status"].num_rows == 40 * 6


def test_parquet_files_are_complete_and_atomic(tmp_path) -> None:
    config = SimConfig(devices=50, tasks=500, slots=10)
    Simulator(config).run([ParquetSink(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "devices.parquet", "events.parquet", "status.parquet", "truth.parquet"]
    events = pq.read_table(tmp_path / "events.parquet")
    assert events.num_rows == 500 and events.schema.metadata[b"record"] == b"collaboration_event"


def test_cli_simulate_writes_files_and_reports(tmp_path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["simulate", "--devices", "30", "--tasks", "300", "--slots", "5", "--seed", "2",
                 "--mix", "stable_reliable=1,intermittent=1", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["events"] == 300 and report["devices"] == 30
    behaviours = set(pq.read_table(out / "devices.parquet")["behaviour"].to_pylist())
    assert behaviours <= {"stable_reliable", "intermittent"}


@pytest.mark.parametrize("argv, message", [
    (["--devices", "1"], "SimConfig.devices"),
    (["--mix", "honest=1"], "unknown behaviour 'honest'"),
    (["--mix", "periodic=lots"], "is not a number"),
])
def test_cli_rejects_bad_settings_clearly(tmp_path, capsys, argv, message) -> None:
    assert main(["simulate", "--out", str(tmp_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_parse_mix() -> None:
    assert parse_mix("selective=0.2, periodic=0.8") == {Behaviour.SELECTIVE: 0.2, Behaviour.PERIODIC: 0.8}
