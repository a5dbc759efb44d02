"""The paper's selection experiment: achieved value of task completion (VoC) versus the trust threshold.

For each test task, the owner's candidates are the devices within range. Each
method gives T = T_beh * T_res per candidate (T_res from the slot's status:
willingness, radio, load); among candidates with T >= theta the one with the
highest expected VoC (physics of the owner's task at that candidate, at the CPU its statuses claim, or where a
method reads CPUs its own way, as the job's model does, at the one it reads) is chosen.
The achieved VoC is drawn from the hidden success probabilities with the same
random numbers for every method: a failed task yields 0, and a task with no
qualifying candidate yields 0. ``oracle`` uses the hidden reliability as
T_beh; ``random`` picks a uniformly random candidate whatever theta (bounds).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from model import physics
from model.channel import OutageCurve
from model.config import TrustWeights
from model.trust import SelectionRule, resource_trust, select, success_probability

THETAS = tuple(round(0.1 * k, 1) for k in range(1, 10))
Scorer = Callable[[np.ndarray, np.ndarray, int, np.ndarray], np.ndarray]  # (owners, candidates, end, profile) -> T_beh
CpuReader = Callable[[np.ndarray, np.ndarray, int, np.ndarray], np.ndarray]  # the same -> each candidate's CPU as
#                                                                              a method reads it (Hz)
ScoredTasks = tuple[np.ndarray, "InRange", dict[str, np.ndarray]]  # a slot: owners, candidates, each T_beh


def voc_curves(world, scored: list[ScoredTasks], thetas: tuple[float, ...] = THETAS, seed: int = 0,
               rule: SelectionRule = "paper", drawn: bool = True) -> dict[str, list[float]]:
    """Mean achieved VoC per theta for each scorer of ``scored`` (:func:`scored_tasks`), plus ``oracle`` and
    ``random``, over the test tasks, each choosing by the selection ``rule`` (:func:`model.trust.select`; for
    ``"success"`` each method's P(success) from its T_beh and the pairs' fitted P(tr), :attr:`InRange.p_tr`, the
    oracle's the hidden one). ``drawn``: each choice scored by an outcome drawn from the hidden probabilities (one
    draw per task, shared by the methods); False: by its VoC times its hidden P(success), the expected VoC, free of
    the draws' noise (``random`` chooses the same candidates either way).

    ``world`` is the simulator's :class:`simulator.world.World`.
    """
    config = world.config
    rng = np.random.default_rng([seed, 7])
    totals = {name: np.zeros(len(thetas)) for name in [*(scored[0][2] if scored else {}), "oracle", "random"]}
    tasks = 0
    for owners, pool, beliefs in scored:
        expected, rows = pool.expected, pool.rows
        draws = rng.random((2, len(owners)))
        outcome = ((draws[0][rows] < expected.p_tr) & (draws[1][rows] < expected.p_com_given_tr) if drawn
                   else expected.p_tr * expected.p_com_given_tr)
        achieved = pool.dense(pool.value * outcome, 0.0)
        for name, t_beh in {**beliefs, "oracle": expected.reliability(config.weights)}.items():
            trust, voc = pool.dense(t_beh * pool.t_res, 0.0), pool.dense(pool.value_for(name), -np.inf)
            success = pool.dense(pool.success(name, t_beh, config.weights), 0.0) if rule == "success" else None
            for k, theta in enumerate(thetas):
                choice = select(trust, voc, pool.valid, theta, rule, success)
                picked = np.where(choice >= 0, achieved[np.arange(len(owners)), np.maximum(choice, 0)], 0.0)
                totals[name][k] += picked.sum()
        random_choice = uniform_choice(rng, pool.valid)
        picked = np.where(random_choice >= 0, achieved[np.arange(len(owners)), np.maximum(random_choice, 0)], 0.0)
        totals["random"] += picked.sum()
        tasks += len(owners)
    return {name: (total / max(tasks, 1)).tolist() for name, total in totals.items()}


def uniform_choice(rng: np.random.Generator, valid: np.ndarray) -> np.ndarray:
    """Per task (row of ``valid``, (tasks, devices)), a candidate drawn uniformly among its valid ones; -1 for none."""
    return np.array([rng.choice(np.flatnonzero(row)) if row.any() else -1 for row in valid], dtype=np.int64)


def candidate_rmse(world, scored: list[ScoredTasks]) -> dict[str, float]:
    """Each scorer's RMSE of T_beh against the hidden reliability over every candidate of every test task of
    ``scored`` (:func:`scored_tasks`; the devices within range of its owner): what the selection reads, and far more
    pairs than the test edges (one per task)."""
    squares, pairs = dict.fromkeys(scored[0][2] if scored else {}, 0.0), 0
    for _, pool, beliefs in scored:
        truth = pool.expected.reliability(world.config.weights)
        for name, t_beh in beliefs.items():
            squares[name] += float(((t_beh - truth) ** 2).sum())
        pairs += len(truth)
    return {name: float(np.sqrt(total / max(pairs, 1))) for name, total in squares.items()}


def scored_tasks(world, events: pa.Table, first_slot: int, test_slots: list[int], scorers: dict[str, Scorer],
                 readers: dict[str, CpuReader] | None = None, channel: OutageCurve | None = None
                 ) -> Iterator[ScoredTasks]:
    """Per test slot with tasks: (the tasks' owners (tasks,) as world rows, their candidates, each scorer's T_beh (P,)
    of the candidates from the slots before), each scorer called once per slot. Device rows of the scorers' history
    are the world's device indices; ``test_slots`` are relative to ``first_slot``. ``readers``: the methods that read
    each candidate's CPU their own way (their VoC at it, :attr:`InRange.read`; the others believe the statuses).
    ``channel``: the P(tr) curve fitted to the training period, which every method's P(success) reads
    (:attr:`InRange.p_tr`; None: no selection by P(success))."""
    config = world.config
    owner_of_event = pc.index_in(events["owner"], value_set=world.ids).to_numpy()  # world rows, once
    slot_of_event = events["slot"].to_numpy()
    size_of_event = events["task_size_bits"].to_numpy()
    for t in test_slots:
        absolute = first_slot + t
        here = slot_of_event == absolute
        owners = owner_of_event[here].astype(np.int64)
        if not len(owners):
            continue
        pool = in_range(world, owners, absolute, size_of_event[here] if config.task_size_spread != 1 else None)
        sizes = np.full(len(pool.rows), config.task_size_bits) if pool.sizes is None else pool.sizes
        profile = np.stack([sizes, np.full(len(pool.rows), config.density_cycles_per_bit)], axis=1)
        read = {name: pool.value_at(world, owners, reader(owners[pool.rows], pool.cols, t - 1, profile))
                for name, reader in (readers or {}).items()}
        p_tr = None if channel is None else channel.p_tr(world.distance(owners[pool.rows], pool.cols))
        yield owners, replace(pool, read=read, p_tr=p_tr), {name: scorer(owners[pool.rows], pool.cols, t - 1, profile)
                                                            for name, scorer in scorers.items()}


@dataclass(frozen=True)
class InRange:
    """Each task's candidates for one slot: the ids present in the slot within range of its owner, other than the
    owner's own (a Sybil's ids are one device)."""

    slot: int  # absolute
    valid: np.ndarray  # (tasks, devices) bool
    rows: np.ndarray  # (P,) task of each valid pair
    cols: np.ndarray  # (P,) candidate device of each valid pair
    expected: Any  # simulator.world.Expected of the pairs
    value: np.ndarray  # (P,) VoC of the task at the candidate if it succeeds
    t_res: np.ndarray  # (P,) T_res of the candidate in the slot
    sizes: np.ndarray | None = None  # (P,) the size of each pair's task (None: every task the nominal size)
    claims: np.ndarray | None = None  # (P,) the VoC a scheduler expects from the candidate's statuses (None: value)
    read: dict[str, np.ndarray] = field(default_factory=dict)  # per method that reads CPUs its own way, (P,) the VoC
    #                                                            at the CPU it reads each candidate at
    p_tr: np.ndarray | None = None  # (P,) each pair's P(tr) by the channel curve fitted to the training period

    def success(self, method: str, t_beh: np.ndarray, weights: TrustWeights) -> np.ndarray:
        """(P,) P(success) * T_res of each pair as ``method`` believes it (:func:`model.trust.success_probability`
        from its T_beh and :attr:`p_tr`); the oracle's from the hidden probabilities."""
        if method == "oracle":
            return self.expected.p_tr * self.expected.p_com_given_tr * self.t_res
        if self.p_tr is None:
            raise ValueError("InRange.success: no p_tr (scored_tasks was given no channel curve)")
        return success_probability(t_beh, self.p_tr, weights) * self.t_res

    @property
    def claimed_value(self) -> np.ndarray:
        """(P,) the VoC a selection that believes the statuses goes by: what the candidates' statuses claim (an
        overclaimer's CPU), achieved or not by ``value``."""
        return self.value if self.claims is None else self.claims

    def value_for(self, method: str) -> np.ndarray:
        """(P,) the VoC ``method``'s selection goes by: at the CPUs it reads, else as the statuses claim."""
        return self.read.get(method, self.claimed_value)

    def value_at(self, world, owners: np.ndarray, cpu_hz: np.ndarray) -> np.ndarray:
        """(P,) the VoC of each pair's task were its candidate's CPU ``cpu_hz`` (P,) (the claimed VoC where it is the
        claimed CPU everywhere); ``owners`` (tasks,) world rows. Where ``cpu_hz`` is NaN (a method that has read no
        status of the candidate yet: an id that first reports in this slot, a whitewasher's new one or a newcomer's),
        the CPU its statuses claim in the slot, as a scheduler that sees them goes by."""
        claimed = world.claimed_cpu_hz[self.cols]
        cpu_hz = np.where(np.isnan(cpu_hz), claimed, cpu_hz)
        if np.array_equal(cpu_hz, claimed):
            return self.claimed_value
        at = world.expected(owners[self.rows], self.cols, self.slot, size_bits=self.sizes, cpu_hz=cpu_hz)
        return physics.value_of_completion(at.offload, at.local, world.config.system)

    def dense(self, values: np.ndarray, fill: float) -> np.ndarray:
        """(P,) pair values -> (tasks, devices), ``fill`` off the valid pairs."""
        out = np.full(self.valid.shape, fill)
        out[self.rows, self.cols] = values
        return out


def in_range(world, owners: np.ndarray, slot: int, sizes: np.ndarray | None = None) -> InRange:
    """The candidates of tasks owned by ``owners`` (world rows) in ``slot`` (of ``sizes``, (tasks,) bits; None: the
    nominal size), with their hidden expectations and T_res. ``world`` is the simulator's
    :class:`simulator.world.World`."""
    config = world.config
    everyone = np.arange(world.size)
    distance = world.distance(np.repeat(owners, world.size), np.tile(everyone, len(owners)))
    valid = (distance.reshape(len(owners), -1) <= config.range_m) & world.present(everyone, slot)[None, :]
    valid &= world.physical[owners][:, None] != world.physical[everyone][None, :]
    rows, cols = np.nonzero(valid)
    pair_sizes = None if sizes is None else sizes[rows]
    expected = world.expected(owners[rows], cols, slot, size_bits=pair_sizes)
    value = physics.value_of_completion(expected.offload, expected.local, config.system)
    claims = None
    if world.overclaimed:
        claimed = world.expected(owners[rows], cols, slot, size_bits=pair_sizes, cpu_hz=world.claimed_cpu_hz[cols])
        claims = physics.value_of_completion(claimed.offload, claimed.local, config.system)
    t_res = resource_trust(world.willingness[cols], world.radio_up(cols, slot),
                           world.load(cols, slot) < config.overload)
    return InRange(slot, valid, rows, cols, expected, value, t_res, pair_sizes, claims)
