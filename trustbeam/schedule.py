"""``trustbeam schedule-demo``: how a downstream scheduler uses trustbeam, as a closed loop.

1. The simulated world's first ``warmup`` slots run with the random-in-range policy (as the data
   BM was trained on); they are published and the pipeline scores them.
2. Each following slot: the simulator issues tasks (owner, theta); the scheduler asks the client
   (:class:`exporters.client.TrustClient`, following the live ``collaborator-rankings`` and
   ``trust-scores`` topics) for each owner's best collaborator at the task's theta; owners the
   client has no answer for fall back to random-in-range (counted). The tasks run, their outcomes
   are published as events, and a pipeline cycle (``trustbeam run`` semantics, one bounded cycle)
   scores the slot, which the client reads before the next slot's tasks.
3. Achieved VoC per task: the trustbeam arm's tasks really ran; on the same tasks, with the same
   random numbers for success, the other arms are evaluated as counterfactuals: random-in-range
   selection, the rules ``qs_trust`` and ``channel_beta`` (fitted on the warm-up slots, then fed the
   outcomes that really ran, slot by slot) and the oracle (the hidden reliability as T_beh). Every
   arm decides with what a scheduler knows when the slot's tasks arrive: its tasks (their sizes too, where
   ``--task-size-spread`` varies them), T_res and each task's VoC from the statuses the pipeline last scored
   (the slot before; statuses carry no CPU load; trustbeam's arms read each device at the CPU the records say the
   job read it at, :meth:`exporters.client.TrustClient.cpu_hz`, where the others believe the claim), its own T_beh
   (trustbeam's read for the task's size from the records, :meth:`exporters.client.TrustClient.trust`). Every arm
   but random applies the paper's rule (T = T_beh * T_res >= theta, then the highest VoC) and, like a scheduler
   must, falls back to random-in-range for a task none of whose candidates reaches theta (counted per arm). A
   failed task achieves 0. Beside what each arm achieved, the VoC its choices were expected to achieve (each chosen
   task's VoC if it succeeds times its hidden P(success): the same mean without the success draws' noise, which over
   a few hundred tasks where two arms choose apart is as large as the arms' difference). With ``--attack``, each
   arm's share of honest owners' tasks handed to an attacker misbehaving toward the owner then (an on-off
   attacker's bad stretch, a selective one's targets, an opportunistic one's large tasks, always for the other
   kinds; :meth:`simulator.world.World.misbehaving`) is counted too, with the VoC those tasks were expected to
   achieve (what the attackers' wins cost). An overclaimer's task counts where its lie won it, as the evaluation
   counts it (:func:`model.manipulation.truthful_judgement`): the arm would have chosen another had the overclaimer
   claimed the CPU it has (read as claimed; random-in-range reads no claim, so the lie wins it nothing), for an
   overclaimer read at its true CPU is a reliable slow device, which an arm may choose knowingly.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

import pyarrow as pa

from beam_pipeline.options import JobConfig
from beam_pipeline.run import Ledger, run_cycle
from model.baselines import RULES, OnlineScorer
from model.graphs import DeviceIndex, slot_edges, slot_graphs
from model.history import History
from model.manipulation import won_by_attack
from model.context import pair_physics
from model.status import COMM_OK, COMP_OK, CPU, STATUS_COLUMNS, WILLINGNESS, status_values
from model.targets import fit_outage
from model.trust import resource_trust, select
from model.voc import in_range
from simulator.config import SimConfig
from simulator.engine import Simulator, Summary
from simulator.publish import KafkaPublisher
from exporters.client import TrustClient
from exporters.kafka_client import KafkaSettings, Topics, ensure_topics

LIVE_ARMS = ("trustbeam", "trustbeam_ev", "trustbeam_success", "random")  # the arms that do not select themselves


def rule_arms(sim: SimConfig) -> tuple[str, ...]:
    """The rules a closed loop compares trustbeam with: QS-Trust and channel_beta, and where tasks vary in size the
    sized rule (channel_beta reading the task's size; where every task has one size it equals channel_beta)."""
    return ("qs_trust", "channel_beta", *(("channel_beta_sized",) if sim.task_size_spread != 1 else ()))


def arms_of(rules: tuple[str, ...]) -> tuple[str, ...]:
    """Every arm: trustbeam, the rules and the oracle by the paper's rule, then by the expected-value rule (``_ev``:
    the highest T x VoC among T >= theta), then by the success rule (``_success``: the highest P(success) x T_res x
    VoC among them; trustbeam's from the records' ``p_success``, a rule's from its T_beh and the P(tr) curve fitted
    to the warm-up, :func:`model.trust.success_probability`; the oracle's the hidden one), then random-in-range."""
    return ("trustbeam", *rules, "oracle", "trustbeam_ev", *(f"{arm}_ev" for arm in rules), "oracle_ev",
            "trustbeam_success", *(f"{arm}_success" for arm in rules), "oracle_success", "random")


@dataclass
class ScheduleReport:
    arms: tuple[str, ...]  # :func:`arms_of`
    tasks: int = 0
    achieved: dict[str, float] = field(init=False)  # summed VoC per arm
    expected: dict[str, float] = field(init=False)  # summed VoC per arm expected from its choices (no draws' noise)
    answered: int = 0  # trustbeam tasks answered by the client (the rest fell back to random)
    honest_tasks: int = 0  # tasks of owners that are no attacker's id
    to_attackers: dict[str, int] = field(init=False)  # of those, per arm, won by an attack (manipulation.won_by_attack)
    attackers_expected: dict[str, float] = field(init=False)  # per arm, those tasks' summed expected VoC
    without_candidate: dict[str, int] = field(init=False)  # per arm that selects, tasks it fell back on
    ages_s: list[float] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    cycle_s: list[float] = field(default_factory=list)
    events_read: int = 0
    events_published: int = 0

    def __post_init__(self) -> None:
        self.achieved, self.expected = dict.fromkeys(self.arms, 0.0), dict.fromkeys(self.arms, 0.0)
        self.to_attackers, self.attackers_expected = dict.fromkeys(self.arms, 0), dict.fromkeys(self.arms, 0.0)
        self.without_candidate = dict.fromkeys([a for a in self.arms if a not in LIVE_ARMS], 0)

    def summary(self) -> dict:
        n = max(self.tasks, 1)
        return {"tasks": self.tasks, "slots": len(self.slots),
                "mean_voc": {arm: round(v / n, 4) for arm, v in self.achieved.items()},
                "expected_voc": {arm: round(v / n, 4) for arm, v in self.expected.items()},
                "answered_share": round(self.answered / n, 4),
                "attacker_share": {arm: round(v / max(self.honest_tasks, 1), 4) for arm, v in self.to_attackers.items()},
                "attacker_expected_voc": {arm: round(v / self.to_attackers[arm], 4) if self.to_attackers[arm] else None
                                          for arm, v in self.attackers_expected.items()},
                "fallback_share": {arm: round(v / n, 4) for arm, v in self.without_candidate.items()},
                "score_age_s": {"median": round(float(np.median(self.ages_s)), 1) if self.ages_s else None,
                                "max": round(max(self.ages_s), 1) if self.ages_s else None},
                "cycle_s": {"median": round(float(np.median(self.cycle_s)), 1) if self.cycle_s else None},
                "events_published": self.events_published, "events_read_by_pipeline": self.events_read}


def schedule_loop(sim: SimConfig, settings: KafkaSettings, job: JobConfig, warmup: int, loop: int,
                  snapshot: Path) -> ScheduleReport:
    """Run the closed loop on ``job.topics`` (created if missing); see the module docstring. The scheduler's
    clock is the simulation's: a slot's tasks are decided at its start, so a score's age is simulated time."""
    if warmup < 1 or loop < 1 or warmup + loop > sim.slots:
        raise ValueError(f"--warmup/--loop: need 1 <= each and warmup + loop <= {sim.slots} slots "
                         f"(got {warmup}, {loop})")
    ensure_topics(settings, job.topics.partitions())
    simulator = Simulator(sim)
    publisher = KafkaPublisher(settings, job.topics)
    names = rule_arms(sim)
    report = ScheduleReport(arms_of(names))
    warm = [_publish_slot(simulator, publisher, slot) for slot in range(warmup)]
    rules = RuleArms(simulator, warm, job.stages()[0].config.weights, names)
    ledger = _cycle(settings, job, Ledger(), report)
    clock = {"now_s": 0.0}
    client = TrustClient(settings, job.topics, group=f"schedule-{uuid.uuid4().hex[:8]}", snapshot=snapshot,
                         now=lambda: clock["now_s"])
    try:
        client.catch_up()
        for slot in range(warmup, warmup + loop):
            clock["now_s"] = sim.clock.start_ms(slot) / 1000
            publisher.write("status", simulator.status_table(slot))
            events = _run_slot(simulator, client, rules, slot, report)
            rules.advance(events)
            publisher.write("events", events)
            publisher.sink.flush()
            ledger = _cycle(settings, job, ledger, report)
            client.catch_up()
            client.checkpoint()
    finally:
        client.close()
        publisher.close()
    report.events_published = publisher.sent["events"]
    return report


def _publish_slot(simulator: Simulator, publisher: KafkaPublisher, slot: int) -> tuple[pa.Table, pa.Table]:
    """A warm-up slot as the simulator runs it (:func:`warm_slot`), published; returns its (events, status)."""
    events, status = warm_slot(simulator, slot)
    publisher.write("status", status)
    publisher.write("events", events)
    publisher.sink.flush()
    return events, status


def warm_slot(simulator: Simulator, slot: int) -> tuple[pa.Table, pa.Table]:
    """(events, status) of a warm-up slot as a recorded run steps it: its statuses, its tasks (random-in-range), then
    the attackers acting on their records (whitewashers rejoin, fake recoverers drop their lie)."""
    status = simulator.status_table(slot)
    tasks = simulator.slot_tasks(slot)
    events, _, _ = simulator.events_table(slot, 0, tasks, tasks, Summary())
    simulator.act_on_records(slot)
    return events, status


class RuleArms:
    """The rule arms' scorers: fitted on the warm-up slots, then advanced with the outcomes that ran."""

    def __init__(self, simulator: Simulator, warm: list[tuple[pa.Table, pa.Table]], weights,
                 names: tuple[str, ...]) -> None:
        config = simulator.config
        self.index, self.clock, self.weights = DeviceIndex(tuple(simulator.world.ids.to_pylist())), config.clock, weights
        events, status = (pa.concat_tables(tables) for tables in zip(*warm))
        history = History.from_events(events, config.clock, weights, index=self.index, first_slot=0, status=status)
        train = list(range(1, history.slots))
        self.scorers: dict[str, OnlineScorer] = {name: RULES[name](history, train) for name in names}
        self.channel = fit_outage(history, train, config.system)  # the P(tr) curve the rules' P(success) read
        for graph in history.graphs:
            for scorer in self.scorers.values():
                scorer.advance(graph)

    def advance(self, events: pa.Table) -> None:
        graph = next(iter(slot_graphs(slot_edges(events, self.clock, self.weights), self.index).values()), None)
        for scorer in self.scorers.values():
            scorer.advance(graph)


def _cycle(settings: KafkaSettings, job: JobConfig, ledger: Ledger, report: ScheduleReport) -> Ledger:
    ledger, cycle = run_cycle(settings, job, ledger, final=True, snapshot_dir=Path(ledger_dir(job)))
    report.cycle_s.append(cycle.seconds)
    report.events_read += cycle.counters.get("events_read", 0)  # new records only (replays counted apart)
    return ledger


def ledger_dir(job: JobConfig) -> str:
    return str(Ledger.directory() / f"schedule-{job.topics.events}")


def _run_slot(simulator: Simulator, client: TrustClient, rules: RuleArms, slot: int, report: ScheduleReport):
    """One slot's tasks under every arm; returns the trustbeam arm's events (what really ran)."""
    config, world = simulator.config, simulator.world
    tasks = simulator.slot_tasks(slot)
    rng = np.random.default_rng([config.seed, 9, slot])
    owners = world.present_owners(world.active[rng.integers(0, config.devices, size=len(tasks))], slot,
                                  [config.seed, 13, slot])  # each device's current id, none yet to join
    thetas = rng.uniform(*config.threshold_range, size=len(tasks))
    draws = rng.random((2, len(tasks)))
    index = np.arange(tasks.start, tasks.stop, dtype=np.int64)
    row_of = {device: k for k, device in enumerate(world.ids.to_pylist())}

    def fallback(chosen: np.ndarray, stream: int) -> np.ndarray:
        """Random-in-range for the tasks without a choice (the same draws in every arm)."""
        missing = chosen < 0
        picks, _ = simulator.choose(np.random.default_rng([config.seed, stream, slot]), owners, slot)
        return np.where(missing, picks, chosen)

    sizes = simulator.task_sizes(slot, 0, len(tasks))  # None: every task the nominal size (the paper)
    task_bits = np.full(len(tasks), config.task_size_bits) if sizes is None else sizes
    pool = in_range(world, owners, slot, sizes)  # the oracle knows each task's truth at its size
    profile = np.stack([task_bits[pool.rows], np.full(len(pool.rows), config.density_cycles_per_bit)], axis=1)
    # what a scheduler knows when the slot's tasks arrive: its tasks, and the statuses the pipeline last scored (the
    # slot before), from which each task's VoC and T_res are computed as the pipeline does (the load a device
    # reported, not its hidden one; no current radio)
    seen = statuses_by_row(simulator, slot - 1)  # (ids, 9)

    def task_vocs(status: np.ndarray) -> np.ndarray:
        """(tasks, devices) each task's VoC at each device in its range (-inf out of it), from statuses (ids, 9)."""
        physics = pair_physics(status[owners[pool.rows]], status[pool.cols], profile, config.system)
        return pool.dense(physics.value(config.system), -np.inf)

    read = published_cpu(seen, client.cpu_hz(), row_of)  # at the CPUs trustbeam read them at
    t_res = resource_trust(seen[pool.cols, WILLINGNESS], seen[pool.cols, COMM_OK], seen[pool.cols, COMP_OK])
    beliefs = {name: scorer.score(owners[pool.rows], pool.cols, profile) for name, scorer in rules.scorers.items()}
    beliefs["oracle"] = pool.expected.reliability(rules.weights)
    distance = pair_physics(seen[owners[pool.rows]], seen[pool.cols], profile, config.system).distance_m
    # each arm's P(success) x T_res as the scheduler knows them (the oracle's the hidden P(success)); P(tr) unknown
    # where a status is: no T_res either, never eligible
    known = replace(pool, t_res=t_res, p_tr=rules.channel.read(distance, 0.0))
    chances = {name: pool.dense(known.success(name, t_beh, rules.weights), 0.0) for name, t_beh in beliefs.items()}

    def choose(claimed: np.ndarray, trustbeams: np.ndarray, counted: bool) -> dict[str, np.ndarray]:
        """Every arm's device per task (random-in-range where it had none), given the statuses the rules read and
        those trustbeam reads (ids, 9); ``counted``: the choices made (their ages and fallbacks are reported)."""
        voc, voc_read = task_vocs(claimed), task_vocs(trustbeams)
        chosen = {name: np.full(len(tasks), -1, dtype=np.int64)
                  for name in ("trustbeam", "trustbeam_ev", "trustbeam_success")}
        for k, (owner, theta) in enumerate(zip(world.ids.take(owners).to_pylist(), thetas)):
            size = float(task_bits[k])
            task_voc = task_value(voc_read[k], row_of)
            values = {"trustbeam": task_voc, "trustbeam_ev": weighted_value(client.trust(owner, size), task_voc),
                      "trustbeam_success": weighted_value(client.success(owner, size), task_voc)}
            for name, value in values.items():
                choice = client.best(owner, theta=float(theta), value=value, task_size_bits=size)
                if choice.collaborator is not None:
                    chosen[name][k] = row_of[choice.collaborator]
                    if counted and name == "trustbeam":
                        report.ages_s.append(choice.age_s)
        if counted:
            report.answered += int((chosen["trustbeam"] >= 0).sum())
        picks = {name: fallback(choice, 10) for name, choice in chosen.items()}
        for arm, t_beh in beliefs.items():
            for rule, name in (("paper", arm), ("expected", f"{arm}_ev"), ("success", f"{arm}_success")):
                choice = select(pool.dense(t_beh * t_res, 0.0), voc, pool.valid, thetas[:, None], rule,
                                chances[arm] if rule == "success" else None)
                if counted:
                    report.without_candidate[name] += int((choice < 0).sum())
                picks[name] = fallback(choice, 10)
        picks["random"], _ = simulator.choose(np.random.default_rng([config.seed, 11, slot]), owners, slot)
        return picks

    picks = choose(seen, read, counted=True)
    lying = world.claimed_cpu_hz != world.cpu_hz  # (devices,) overclaimers
    # what each arm would have chosen had every overclaimer claimed the CPU it has (a true claim is read as made)
    truthful = choose(true_cpu(seen, world), true_cpu(read, world), counted=False) if lying.any() else picks
    honest = ~world.attacker[owners]  # what attackers hand one another wins them nothing
    report.honest_tasks += int(honest.sum())
    ran = simulator.outcome(slot, index, tasks, owners, picks["trustbeam"], thetas, draws, sizes)
    simulator.observe(picks["trustbeam"], ran)  # what ran is what the attackers judge their records by
    for arm in report.arms:  # the counterfactual arms on the same tasks and random numbers as the one that ran
        outcome = ran if arm == "trustbeam" else simulator.outcome(slot, index, tasks, owners, picks[arm], thetas,
                                                                   draws, sizes)
        report.achieved[arm] += float(outcome.voc.sum())
        report.expected[arm] += float(outcome.expected_voc.sum())
        won = won_by_attack(world.misbehaving(picks[arm], owners, slot, sizes) & honest, lying, picks[arm],
                            truthful[arm])
        report.to_attackers[arm] += int(won.sum())
        report.attackers_expected[arm] += float(outcome.expected_voc[won].sum())
    report.tasks += len(tasks)
    report.slots.append(slot)
    simulator.act_on_records(slot)
    return ran.events


def statuses_by_row(simulator: Simulator, slot: int) -> np.ndarray:
    """(ids, 9) the STATUS_COLUMNS every id of the world sent in ``slot``, in world rows: NaN for an id not in the
    system then (one yet to join, a whitewasher's id it left)."""
    world = simulator.world
    out = np.full((world.size, len(STATUS_COLUMNS)), np.nan)
    out[world.present(np.arange(world.size), slot)] = status_values(simulator.status_table(slot))
    return out


def published_cpu(status: np.ndarray, cpu_hz: dict[str, float], row_of: dict[str, int]) -> np.ndarray:
    """Statuses (ids, 9) with each CPU the records give (:meth:`exporters.client.TrustClient.cpu_hz`) in place of
    the claimed one."""
    out = status.copy()
    rows = np.array([row_of[device] for device in cpu_hz], dtype=np.int64)
    out[rows, CPU] = np.fromiter(cpu_hz.values(), float, len(cpu_hz))
    return out


def true_cpu(status: np.ndarray, world) -> np.ndarray:
    """Statuses (ids, 9), rows in world order, as had every overclaimer claimed the CPU it has."""
    out = status.copy()
    lying = world.claimed_cpu_hz != world.cpu_hz
    out[lying, CPU] = world.cpu_hz[lying]
    return out


def task_value(voc: np.ndarray, row_of: dict[str, int]) -> Callable[[list[str]], np.ndarray]:
    """The scheduler's VoC of its task at each eligible candidate, from ``voc`` (devices,) (-inf out of range): -1
    for a candidate out of its range, as the client rates one it knows no VoC of."""
    def value(eligible: list[str]) -> np.ndarray:
        return np.array([max(float(voc[row_of[c]]), -1.0) for c in eligible])

    return value


def weighted_value(weight: dict[str, float], voc: Callable[[list[str]], np.ndarray]
                   ) -> Callable[[list[str]], np.ndarray]:
    """The scheduler's value of each eligible candidate: its weight (its T for the task under the expected-value
    rule, :meth:`TrustClient.trust`; its chance of success under the success rule, :meth:`TrustClient.success`) x
    the task's VoC there (-1 where either is unknown)."""
    def value(eligible: list[str]) -> np.ndarray:
        rated = voc(eligible)
        weights = np.array([weight.get(c, np.nan) for c in eligible])
        return np.where((rated >= 0) & ~np.isnan(weights), weights * rated, -1.0)

    return value


def tagged_topics() -> Topics:
    tag = time.strftime("%Y%m%d-%H%M%S")
    return Topics(*(f"schedule-{tag}-{name}" for name in ("events", "status", "scores", "rankings", "dead-letter")))


def run_schedule_demo(sim: SimConfig, bootstrap: str | None, epochs: int, warmup: int, loop: int) -> int:
    """The command: broker, cached demo model, the closed loop, and the achieved-VoC table."""
    import json
    import sys

    from deploy.local.broker import LocalBroker
    from model.checkpoint import load
    from model.config import RankingConfig
    from trustbeam.demo import cached_checkpoint, live_config, step
    from model.config import state_dir

    settings = KafkaSettings.resolve(bootstrap)
    step(f"broker at {settings.bootstrap}")
    if settings.is_local:
        print(f"    {LocalBroker().start()}", file=sys.stderr)
    step("model: BM trained on an earlier run of this world's setting (cached, shared with `trustbeam demo`)")
    checkpoint = cached_checkpoint(sim, epochs, state_dir() / "demo")
    window = load(checkpoint)[0].config.window
    topics = tagged_topics()
    live = live_config(sim)
    # rank every owner seen in the last S slots, for every theta the scheduler's tasks may ask
    ranking = RankingConfig(owner_slots=window, scores_per_owner=10, threshold_floor=live.threshold_range[0])
    job = JobConfig(str(checkpoint), ranking=ranking, topics=topics)
    step(f"closed loop: {warmup} warm-up slots, then {loop} slots of {len(Simulator(live).slot_tasks(warmup))} "
          f"tasks scheduled from the live topics ({topics.rankings})")
    started = time.perf_counter()
    report = schedule_loop(live, settings, job, warmup, loop, state_dir() / "schedule" / f"{topics.rankings}.json")
    summary = report.summary()
    print(f"\nAchieved VoC per task over {report.tasks} tasks in {len(report.slots)} slots "
          f"(a failed task, or an oracle task with no candidate reaching theta, achieves 0):")
    print("| selection | mean VoC | expected VoC | fell back to random-in-range | honest owners' tasks handed to "
          "misbehaving attackers | their expected VoC |\n|---|---|---|---|---|---|")
    for arm in report.arms:
        fell = (1 - summary["answered_share"]) if arm == "trustbeam" else summary["fallback_share"].get(arm)
        theirs = summary["attacker_expected_voc"][arm]
        print(f"| {arm} | {summary['mean_voc'][arm]:.4f} | {summary['expected_voc'][arm]:.4f} | "
              f"{'' if fell is None else f'{100 * fell:.1f} %'} | {100 * summary['attacker_share'][arm]:.1f} % | "
              f"{'' if theirs is None else f'{theirs:.4f}'} |")
    print(json.dumps({**summary, "topics": {"rankings": topics.rankings, "scores": topics.scores},
                      "checkpoint": str(checkpoint), "seconds": round(time.perf_counter() - started, 1)}, indent=2))
    return 0 if report.answered else 1
