"""Generate a run slot by slot into sinks, in memory bounded by devices + one sub-batch of tasks.

Tasks are executed sequentially: task k falls in slot k*S // M and tasks are
evenly spaced within their slot. Each sub-batch of at most SUB_BATCH tasks
draws from its own generator seeded by (seed, slot, sub-batch), so a run is
fully determined by its config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tqdm import tqdm

from model import physics
from schemas import DeviceStatus, arrow_schema, events_file_schema
from model.trust import collaboration_weight
from simulator.config import AttackKind, Policy, SimConfig
from simulator.world import World

SUB_BATCH = 65_536
_REPORTS, _SIZES, _OWNERS = 4, 6, 12  # random streams of their own: which tasks owners report, the tasks' sizes, who
#                                      owns a task drawn for a device yet to join
MAX_DRAWS = 64  # rejection-sampling rounds before falling back to the nearest available device

STATUS_SCHEMA = arrow_schema(DeviceStatus)
TRUTH_SCHEMA = pa.schema(
    [
        pa.field("owner", pa.string(), nullable=False),
        pa.field("collaborator", pa.string(), nullable=False),
        pa.field("slot", pa.int64(), nullable=False),
        pa.field("reliability", pa.float64(), nullable=False,
                 metadata={"doc": "a1*P(tr) + a2*P(com): the expectation of T_col"}),
        pa.field("p_tr", pa.float64(), nullable=False),
        pa.field("p_com", pa.float64(), nullable=False),
        pa.field("tasks", pa.int64(), nullable=False),
    ],
    metadata={"doc": "hidden expected reliability per (owner, collaborator, slot) that collaborated"},
)


class Sink(Protocol):
    def write(self, kind: str, table: pa.Table) -> None:
        """Receive a table of ``kind`` in {devices, status, events, truth}."""

    def close(self) -> None: ...


@dataclass
class Summary:
    """Counts of a run, for the command line and the tests."""

    devices: int = 0
    slots: int = 0
    events: int = 0
    status: int = 0
    truth_rows: int = 0
    tr_success: int = 0
    com_success: int = 0
    fallbacks: int = 0  # tasks whose owner had no available device in range
    voc_sum: float = 0.0
    reliability_sum: float = 0.0

    def as_dict(self) -> dict[str, float]:
        n = max(self.events, 1)
        return {
            "devices": self.devices, "slots": self.slots, "events": self.events, "status": self.status,
            "truth_rows": self.truth_rows, "tr_success_rate": self.tr_success / n,
            "com_success_rate": self.com_success / n, "mean_voc": self.voc_sum / n,
            "mean_true_reliability": self.reliability_sum / n, "fallbacks": self.fallbacks,
        }


@dataclass(frozen=True)
class Outcome:
    """Executed tasks: their events, the transmission and computation outcomes as reported, the achieved VoC
    (0 for a failed task), each task's hidden expected reliability, and the VoC it was expected to achieve (its VoC
    if it succeeds times the hidden P(tr and com): the achieved VoC's mean over the draws, what an arm's choice is
    worth without their noise)."""

    events: pa.Table
    tr: np.ndarray
    com: np.ndarray
    voc: np.ndarray
    reliability: np.ndarray
    p_com: np.ndarray  # each task's hidden P(tr and com)
    expected_voc: np.ndarray


class MemorySink:
    """Keeps a run's tables in memory (small runs: tests, evaluation)."""

    def __init__(self) -> None:
        self.parts: dict[str, list[pa.Table]] = {}

    def write(self, kind: str, table: pa.Table) -> None:
        self.parts.setdefault(kind, []).append(table)

    def close(self) -> None:
        pass

    def __getitem__(self, kind: str) -> pa.Table:
        return pa.concat_tables(self.parts[kind])


class IdRecord:
    """Each id's tasks as a collaborator and the sum of their observed T_col: what a whitewasher reads of its own
    record before it decides to leave the id (a fake recoverer, before it drops its lie)."""

    def __init__(self, ids: int) -> None:
        self.tasks = np.zeros(ids)
        self.t_col = np.zeros(ids)

    def add(self, collabs: np.ndarray, t_col: np.ndarray) -> None:
        self.tasks += np.bincount(collabs, minlength=len(self.tasks))
        self.t_col += np.bincount(collabs, weights=t_col, minlength=len(self.t_col))

    def forget(self, rows: np.ndarray) -> None:
        """Start ``rows``' records afresh."""
        self.tasks[rows] = 0.0
        self.t_col[rows] = 0.0

    def poor(self, min_tasks: int, below: float) -> np.ndarray:
        """(ids,) whether an id has at least ``min_tasks`` tasks and their mean T_col is below ``below``."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return (self.tasks >= min_tasks) & (self.t_col / self.tasks < below)


class Simulator:
    """Turns a :class:`SimConfig` into events, device status and hidden truth."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.world = World(config)
        attack = config.attack
        # whitewashers' tasks under their current ids, fake recoverers' since their last drop: kept only for them
        judged = attack and attack.kind in (AttackKind.WHITEWASHING, AttackKind.FAKE_RECOVERY)
        self.record = IdRecord(self.world.size) if judged else None

    def slot_tasks(self, slot: int) -> range:
        """Global indices of the tasks executed in a slot."""
        m, s = self.config.tasks, self.config.slots
        return range(-(-slot * m // s), -(-(slot + 1) * m // s))

    def run(self, sinks: Sequence[Sink], progress: bool = False) -> Summary:
        summary = Summary(devices=self.config.devices, slots=self.config.slots)
        self._emit(sinks, "devices", self.world.devices_table())
        for slot in tqdm(range(self.config.slots), desc="simulate", unit="slot", disable=not progress):
            if slot % self.config.status_every == 0:
                status = self.status_table(slot)
                summary.status += status.num_rows
                self._emit(sinks, "status", status)
            tasks = self.slot_tasks(slot)
            pairs, truths = [], []
            for sub, first in enumerate(range(tasks.start, tasks.stop, SUB_BATCH)):
                batch = range(first, min(first + SUB_BATCH, tasks.stop))
                events, keys, truth = self.events_table(slot, sub, batch, tasks, summary)
                pairs.append(keys)
                truths.append(truth)
                self._emit(sinks, "events", events)
            if pairs:
                per_task = None if self.config.task_size_spread == 1 else np.concatenate(truths)
                truth = self.truth_table(slot, np.concatenate(pairs), per_task)
                summary.truth_rows += truth.num_rows
                self._emit(sinks, "truth", truth)
            self.act_on_records(slot)
        for sink in sinks:
            sink.close()
        return summary

    def observe(self, collabs: np.ndarray, outcome: Outcome) -> None:
        """Adds tasks that ran at ``collabs`` (m,) with their ``outcome`` to the records the attackers judge
        themselves by (:meth:`act_on_records`); nothing where no attacker keeps one."""
        if self.record is not None:
            self.record.add(collabs, collaboration_weight(outcome.tr, outcome.com, self.config.weights))

    def act_on_records(self, slot: int) -> None:
        """At the end of ``slot`` (from ``whitewash_from`` on), attackers whose record is poor act on it: whitewashers
        leave their id and rejoin under their next ``rejoin_after`` slots later; fake recoverers whose lie has crept
        back drop it from the next slot on, and their records start afresh."""
        attack, w = self.config.attack, self.world
        if self.record is None or slot < attack.whitewash_from:
            return
        everyone = np.arange(w.size)
        poor = self.record.poor(attack.whitewash_min_tasks, attack.whitewash_below)
        if attack.kind is AttackKind.WHITEWASHING:
            leaving = np.flatnonzero(w.attacker & w.present(everyone, slot) & poor)
            w.rejoin(leaving, slot + 1, slot + attack.rejoin_after)
            return
        rows = np.flatnonzero(poor & w.fakes_recovery(everyone, slot + 1))
        w.dropped[rows] = slot + 1
        self.record.forget(rows)

    @staticmethod
    def _emit(sinks: Sequence[Sink], kind: str, table: pa.Table) -> None:
        if table.num_rows:
            for sink in sinks:
                sink.write(kind, table)

    def status_table(self, slot: int) -> pa.Table:
        """The statuses of the ids present in ``slot``."""
        w = self.world
        devices = np.flatnonzero(w.present(np.arange(w.size), slot))
        n = len(devices)
        load = w.load(devices, slot)
        columns = {
            "device": w.ids.take(devices),
            "time_ms": np.full(n, int(self.config.clock.start_ms(slot)), dtype=np.int64),
            "cpu_hz": w.claimed_cpu_hz[devices], "tx_w": w.tx_w[devices], "rx_w": w.rx_w[devices], "x_m": w.x_m[devices],
            "y_m": w.y_m[devices], "willingness": w.willingness[devices],
            "comm_ok": w.radio_up(devices, slot),
            "comp_ok": load < self.config.overload,
            "cpu_load": load + w.load_lie(devices, slot) if self.config.telemetry else pa.nulls(n, pa.float64()),
        }
        return pa.Table.from_pydict(columns, schema=STATUS_SCHEMA)

    def choose(self, rng: np.random.Generator, owners: np.ndarray, slot: int) -> tuple[np.ndarray, int]:
        """A collaborator (an id present in the slot, of another device) per owner by the configured policy (a
        ballot-stuffer draws among its fellow colluders); returns (collaborators, fallbacks)."""
        w, n = self.world, self.world.size
        chosen = np.full(len(owners), -1, dtype=np.int64)
        pending = np.arange(len(owners))
        attack = self.config.attack
        colluders = np.flatnonzero(w.attacker) if attack and attack.kind is AttackKind.BALLOT_STUFFING else None
        for _ in range(MAX_DRAWS):
            if not len(pending):
                break
            candidate = rng.integers(0, n, size=len(pending))
            owner = owners[pending]
            if colluders is not None and len(colluders):
                stuffing = w.attacker[owner]
                candidate[stuffing] = colluders[rng.integers(0, len(colluders), size=int(stuffing.sum()))]
            ok = (w.physical[candidate] != w.physical[owner]) & w.present(candidate, slot)
            ok &= w.available(candidate, slot)
            ok &= rng.random(len(pending)) < w.willingness[candidate]
            if self.config.policy is Policy.RANDOM_IN_RANGE:
                ok &= w.distance(owner, candidate) <= self.config.range_m
            chosen[pending[ok]] = candidate[ok]
            pending = pending[~ok]
        for index in pending:  # isolated owners: the nearest available device, even out of range
            everyone = np.arange(n)
            others = everyone[(w.physical != w.physical[owners[index]]) & w.present(everyone, slot)]
            usable = others[w.available(others, slot)]
            pool = usable if len(usable) else others
            chosen[index] = pool[np.argmin(w.distance(np.full(len(pool), owners[index]), pool))]
        return chosen, len(pending)

    def events_table(
        self, slot: int, sub: int, batch: range, tasks: range, summary: Summary
    ) -> tuple[pa.Table, np.ndarray, np.ndarray]:
        """One sub-batch of a slot's tasks; also returns owner*N + collaborator keys and each task's hidden
        (reliability, P(com)) (m, 2)."""
        c = self.config
        rng = np.random.default_rng([c.seed, 1, slot, sub])
        owners = self.world.active[rng.integers(0, c.devices, size=len(batch))]  # each device's current id
        owners = self.world.present_owners(owners, slot, [c.seed, _OWNERS, slot, sub])  # none yet to join
        collabs, fallbacks = self.choose(rng, owners, slot)
        draws = rng.random((2, len(batch)))
        thresholds = rng.uniform(*c.threshold_range, size=len(batch))
        outcome = self.outcome(slot, np.arange(batch.start, batch.stop, dtype=np.int64), tasks, owners, collabs,
                               thresholds, draws, self.task_sizes(slot, sub, len(batch)),
                               self.owner_reported(slot, sub, len(batch)))
        self.observe(collabs, outcome)
        summary.events += len(batch)
        summary.tr_success += int(outcome.tr.sum())
        summary.com_success += int(outcome.com.sum())
        summary.fallbacks += fallbacks
        summary.voc_sum += float(outcome.voc.sum())
        summary.reliability_sum += float(outcome.reliability.sum())
        return outcome.events, owners * self.world.size + collabs, np.stack([outcome.reliability, outcome.p_com], 1)

    def task_sizes(self, slot: int, sub: int, m: int) -> np.ndarray | None:
        """Each task's size, log-uniform within ``task_size_spread`` of the nominal size, from a stream of its own
        (None where every task has the nominal size)."""
        spread = self.config.task_size_spread
        if spread == 1:
            return None
        rng = np.random.default_rng([self.config.seed, _SIZES, slot, sub])
        return self.config.task_size_bits * np.exp(rng.uniform(-np.log(spread), np.log(spread), size=m))

    def owner_reported(self, slot: int, sub: int, m: int) -> np.ndarray:
        """Whether the owner, not a neutral monitor, reports each task's outcome (``owner_reports`` of them, drawn
        from a stream of their own)."""
        share = self.config.owner_reports
        if share in (0, 1):
            return np.full(m, bool(share))
        return np.random.default_rng([self.config.seed, _REPORTS, slot, sub]).random(m) < share

    def reported(self, owners: np.ndarray, collabs: np.ndarray, tr: np.ndarray, com: np.ndarray,
                 by_owner: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The (tr, com) flags reported: the outcomes, but where a lying colluder reports as owner
        (:class:`simulator.config.Attack`): ballot-stuffers report a fellow colluder's task a success, bad-mouthers an
        honest device's computation failed."""
        attack, attacker = self.config.attack, self.world.attacker
        if attack is None or not attack.kind.false_reports:
            return tr, com
        lying = by_owner & attacker[owners]
        if attack.kind is AttackKind.BALLOT_STUFFING:
            stuffed = lying & attacker[collabs]
            return tr | stuffed, com | stuffed
        return tr, com & ~(lying & ~attacker[collabs])

    def outcome(self, slot: int, index: np.ndarray, tasks: range, owners: np.ndarray, collabs: np.ndarray,
                thresholds: np.ndarray, draws: np.ndarray, sizes: np.ndarray | None = None,
                by_owner: np.ndarray | None = None) -> Outcome:
        """Tasks ``index`` (global numbers, within the slot's ``tasks``) of ``owners`` run at ``collabs``:
        success drawn from the hidden probabilities with ``draws`` (2, m) uniforms, as events; ``sizes`` the
        tasks' sizes (None: the nominal size), ``by_owner`` whether the owner reports each outcome (None: a monitor
        reports all), as it likes (:meth:`reported`)."""
        c, w = self.config, self.world
        m = len(index)
        by_owner = np.zeros(m, bool) if by_owner is None else by_owner
        expected = w.expected(owners, collabs, slot, size_bits=sizes)
        tr = draws[0] < expected.p_tr
        com = tr & (draws[1] < expected.p_com_given_tr)
        tr, com = self.reported(owners, collabs, tr, com, by_owner)
        value = physics.value_of_completion(expected.offload, expected.local, c.system)
        p_success = expected.p_tr * expected.p_com_given_tr
        voc = value * (tr & com)
        offset_ms = ((index - tasks.start) * c.clock.slot_ms) // len(tasks)
        nulls = pa.nulls(m, pa.float64())
        owner_ids = w.ids.take(owners)
        columns = {
            "event_id": pc.binary_join_element_wise(f"sim{c.seed}-", pa.array(index).cast(pa.string()), ""),
            "event_time_ms": int(c.clock.start_ms(slot)) + offset_ms,
            "owner": owner_ids,
            "collaborator": w.ids.take(collabs),
            "task_size_bits": np.full(m, c.task_size_bits) if sizes is None else sizes,
            "density_cycles_per_bit": np.full(m, c.density_cycles_per_bit),
            "trust_threshold": thresholds,
            "tr_success": tr,
            "com_success": com,
            "reliability": nulls,
            "t_total_s": expected.offload.time_s,
            "e_total_j": expected.offload.energy_j,
            "t_local_s": expected.local.time_s,
            "e_local_j": expected.local.energy_j,
            "voc": voc,
            "reporter": pc.if_else(pa.array(by_owner), owner_ids, pa.scalar(None, pa.string())),
            "slot": np.full(m, slot, dtype=np.int64),
        }
        events = pa.Table.from_pydict(columns, schema=events_file_schema(c.clock.metadata()))
        return Outcome(events, tr, com, voc, expected.reliability(c.weights), p_success, value * p_success)

    def truth_table(self, slot: int, keys: np.ndarray, per_task: np.ndarray | None = None) -> pa.Table:
        """The hidden expected reliability of each pair that collaborated in the slot: of the nominal task, or with
        ``per_task`` (the tasks' (reliability, P(com)) (m, 2), in ``keys`` order) the mean over the pair's tasks."""
        n, weights = self.world.size, self.config.weights
        unique, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
        owners, collabs = unique // n, unique % n
        expected = self.world.expected(owners, collabs, slot)
        reliability, p_com = expected.reliability(weights), expected.p_tr * expected.p_com_given_tr
        if per_task is not None:
            reliability, p_com = (np.bincount(inverse, weights=per_task[:, k], minlength=len(unique)) / counts
                                  for k in range(2))
        columns = {
            "owner": self.world.ids.take(owners),
            "collaborator": self.world.ids.take(collabs),
            "slot": np.full(len(unique), slot, dtype=np.int64),
            "reliability": reliability,
            "p_tr": expected.p_tr,
            "p_com": p_com,
            "tasks": counts.astype(np.int64),
        }
        return pa.Table.from_pydict(columns, schema=TRUTH_SCHEMA)
