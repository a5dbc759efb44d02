"""The closed-loop schedule demo at a small size, on the real broker."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from model.config import RankingConfig
from schemas import CollaborationEvent, TrustScore, from_json
from simulator.config import Attack, AttackKind
from simulator.engine import MemorySink, Simulator
from tests.pipeline_fixtures import SIM, job, write_checkpoint
from exporters.kafka_client import read_to_end
from model.status import CPU, STATUS_COLUMNS, status_values
from model.manipulation import won_by_attack
from trustbeam.schedule import (published_cpu, schedule_loop, statuses_by_row, tagged_topics, true_cpu,
                                warm_slot)



# opportunistic attackers fail large tasks: the loop's tasks have sizes (1/4 to 4 times the nominal), as the warm-up's
OPPORTUNISTS = dict(attack=Attack(AttackKind.OPPORTUNISTIC, 0.2), task_size_spread=4.0)


def test_trustbeams_arms_read_the_cpus_the_records_give() -> None:
    """A scheduler's statuses with each CPU the records give in place of the claim, the rest as they were."""
    status = np.arange(3 * len(STATUS_COLUMNS), dtype=float).reshape(3, -1)
    status[:, CPU] = [6e9, 6e9, 2e9]
    read = published_cpu(status, {"b": 2e9}, {"a": 0, "b": 1, "c": 2})
    assert read[:, CPU].tolist() == [6e9, 2e9, 2e9] and status[1, CPU] == 6e9
    np.testing.assert_array_equal(np.delete(read, CPU, axis=1), np.delete(status, CPU, axis=1))
    np.testing.assert_array_equal(published_cpu(status, {}, {"a": 0}), status)


def test_an_overclaimers_task_is_won_where_its_lie_changed_the_arms_choice() -> None:
    """Device 2 overclaims (6 GHz claimed, 2 had): its tasks count where the arm would have chosen another had it
    claimed 2; every other attacker's task where it misbehaves, whatever the claims."""
    world = SimpleNamespace(claimed_cpu_hz=np.array([2e9, 6e9, 6e9]), cpu_hz=np.array([2e9, 6e9, 2e9]))
    status = np.zeros((3, len(STATUS_COLUMNS)))
    status[:, CPU] = world.claimed_cpu_hz
    assert true_cpu(status, world)[:, CPU].tolist() == [2e9, 6e9, 2e9] and status[2, CPU] == 6e9
    lying = world.claimed_cpu_hz != world.cpu_hz
    misbehaving = np.array([True, True, True, False])
    picks, truthful = np.array([2, 2, 1, 2]), np.array([2, 0, 0, 0])
    # task 0: the overclaimer, chosen even at its true CPU; task 1: the lie won it; task 2: another attacker, counted
    # whatever the overclaimer claimed; task 3: its owner is no victim
    assert won_by_attack(misbehaving, lying, picks, truthful).tolist() == [False, True, True, False]


def test_the_loop_steps_the_world_as_a_recorded_run_does() -> None:
    """Stepped as the loop steps it (a slot's tasks, then the attackers act on their records), whitewashers leave and
    rejoin as in a recorded run; the statuses a slot's arms read stand in world rows, NaN for an id not in it."""
    sim = replace(SIM, slots=24, tasks=1200, attack=Attack(AttackKind.WHITEWASHING, 0.3))
    recorded = Simulator(sim)
    recorded.run([MemorySink()])
    stepped = Simulator(sim)
    for slot in range(sim.slots):
        warm_slot(stepped, slot)
    world = stepped.world
    assert (world.left < sim.slots).sum() > 3  # ids were left behind
    np.testing.assert_array_equal(world.left, recorded.world.left)
    np.testing.assert_array_equal(world.joined, recorded.world.joined)
    rows = statuses_by_row(stepped, sim.slots - 1)
    here = world.present(np.arange(world.size), sim.slots - 1)
    assert rows.shape == (world.size, len(STATUS_COLUMNS)) and here.sum() == sim.devices and np.isnan(rows[~here]).all()
    np.testing.assert_array_equal(rows[here], status_values(stepped.status_table(sim.slots - 1)))


@pytest.mark.kafka
@pytest.mark.parametrize("world", [{}, pytest.param(OPPORTUNISTS, marks=pytest.mark.slow)],
                         ids=["paper", "opportunistic"])
def test_the_loop_schedules_from_the_live_topics_and_its_outcomes_flow_back(broker, tmp_path, monkeypatch,
                                                                             world) -> None:
    monkeypatch.setenv("TRUSTBEAM_STATE_DIR", str(tmp_path))
    sim = replace(SIM, slots=10, tasks=450, **world)
    checkpoint = write_checkpoint(tmp_path / "model", sim)
    topics = tagged_topics()
    config = job(checkpoint, topics=topics, ranking=RankingConfig(owner_slots=6, range_m=None, scores_per_owner=10))
    warmup, loop = 6, 3
    report = schedule_loop(sim, broker.settings, config, warmup, loop, tmp_path / "client.json")

    simulator = Simulator(sim)
    loop_tasks = sum(len(simulator.slot_tasks(s)) for s in range(warmup, warmup + loop))
    all_tasks = sum(len(simulator.slot_tasks(s)) for s in range(warmup + loop))
    assert report.tasks == loop_tasks and report.slots == list(range(warmup, warmup + loop))
    assert report.events_published == all_tasks == report.events_read  # every outcome reached the pipeline
    assert report.answered > loop_tasks // 2  # most owners were answered from the live rankings
    events = [from_json(CollaborationEvent, r.value) for r in read_to_end(broker.settings, topics.events)]
    loop_start = sim.clock.start_ms(warmup)
    ran = sum(e.voc for e in events if e.event_time_ms >= loop_start)
    assert report.achieved["trustbeam"] == pytest.approx(ran)  # the arm's VoC is what the published tasks achieved
    summary = report.summary()
    arms = {"trustbeam", "qs_trust", "channel_beta", "oracle"} | ({"channel_beta_sized"} if sim.attack else set())
    assert set(summary["mean_voc"]) == (arms | {f"{a}_ev" for a in arms} | {f"{a}_success" for a in arms}
                                        | {"random"}) == set(report.arms)
    assert all(0 <= summary["mean_voc"][arm] <= 1 for arm in report.arms)
    assert summary["mean_voc"]["oracle"] > summary["mean_voc"]["random"]  # the same tasks and draws for every arm
    assert set(summary["expected_voc"]) == set(report.arms) and all(0 < v <= 1 for v in summary["expected_voc"].values())
    assert summary["expected_voc"]["oracle_ev"] > summary["expected_voc"]["random"]
    assert summary["expected_voc"]["oracle_success"] > summary["expected_voc"]["random"]
    scores = [from_json(TrustScore, r.value) for r in read_to_end(broker.settings, topics.scores)]
    assert scores and all(0 <= s.p_success <= s.trust for s in scores)  # what trustbeam_success rates by
    assert all(0 <= share <= 1 for share in summary["fallback_share"].values())
    sizes = {e.task_size_bits for e in events if e.event_time_ms >= loop_start}
    if sim.attack is None:
        assert summary["attacker_share"] == dict.fromkeys(report.arms, 0.0) and sizes == {sim.task_size_bits}
        assert summary["attacker_expected_voc"] == dict.fromkeys(report.arms)  # no such task: no mean
    else:  # the loop's tasks vary in size as the warm-up's; attackers are counted where they misbehave
        assert len(sizes) > 10 and all(sim.task_size_bits / 4 <= s <= 4 * sim.task_size_bits for s in sizes)
        assert all(0 <= share <= 1 for share in summary["attacker_share"].values())
        assert summary["attacker_share"]["oracle_ev"] <= summary["attacker_share"]["random"]
        theirs = summary["attacker_expected_voc"]  # the mean expected VoC of those tasks, where an arm handed any
        assert summary["attacker_share"]["random"] > 0 and 0 <= theirs["random"] <= 1
        assert all((theirs[arm] is None) == (summary["attacker_share"][arm] == 0) for arm in report.arms)
    assert min(report.ages_s) >= 0 and sorted(report.ages_s)[len(report.ages_s) // 2] == 0  # the previous slot's
    assert len(report.cycle_s) == loop + 1 and (tmp_path / "client.json").exists()
