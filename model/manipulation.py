"""What attackers win in the selection experiment: the measures ``trustbeam evaluate --attack`` reports.

A simulated run may hold attackers (``simulator.config.Attack``): devices that misbehave toward some owners in
some slots (:meth:`simulator.world.World.misbehaving`). Over the test tasks of honest owners, scored once for the VoC
experiment (:func:`model.voc.scored_tasks`; what attackers hand one another wins them nothing), every method selects
by the paper's rule (the highest VoC among candidates with T >= the task's own trust threshold, as a scheduler would;
by the expected-value rule, the highest T x VoC among them, under the same names suffixed ``_expected``; and by the
highest P(success) x VoC, suffixed ``_success``, where the pools carry P(tr), :attr:`model.voc.InRange.p_tr`), and
this module counts what the attackers got:

- ``tasks_assigned``: the share of test tasks with a qualifying candidate (a method that trusts no one hands
  attackers nothing, and no one anything);
- ``attack_tasks_won``: the share of test tasks handed to an attacker misbehaving toward the task's owner; an
  overclaimer misbehaves in its statuses, not its work, so a task counts as won by it where its lie won it: the
  method would have chosen another candidate had the overclaimer's statuses claimed the CPU it has (the same T, the
  VoC at its true CPU; :func:`truthful_judgement`);
- ``attack_voc_lost``: VoC per test task those tasks are expected to lose (the task's value at the attacker
  times its chance of failing there);
- ``attack_slots_to_detect``: per misbehaving stretch of an attacker (consecutive test slots in which it is a
  candidate of an owner it misbehaves toward), the slots from the stretch's start until the method's T_beh of
  it (mean over those owners) falls below :data:`DETECT_BELOW`; a stretch never detected counts its whole length (a lower bound),
  and ``attack_detected`` is the share of stretches detected; ``honest_flagged`` the share of honest candidates (of
  honest owners) whose T_beh is below the same mark (a method that suspects everyone detects every attacker);
- ``honest_trust_shift``: the mean of T_beh minus the hidden truth over the honest candidates of honest owners
  (negative: honest devices' trust pushed down; what a liar believes, or says it does, selects nothing honest);
- ``whitewash_share_before`` / ``whitewash_share_after``: a whitewasher's share of a slot's tasks in up to
  :data:`WHITEWASH_WINDOW` test slots before it left an id, and under its new id in as many after (rejoins with
  test slots on both sides only);
- where honest devices join late (``SimConfig.churn``), what a defence against fresh ids costs the honest ones:
  ``newcomer_tasks_won``, the share of test tasks handed to an honest device in its first :data:`WHITEWASH_WINDOW`
  slots, and ``newcomer_trust_shift``, T_beh minus the truth over such candidates of honest owners.

``oracle`` selects by the hidden truth, ``random`` uniformly among the candidates whatever the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from model.metrics import rmse
from model.trust import SELECTION_RULES, rule_suffix, select
from model.voc import ScoredTasks, uniform_choice

DETECT_BELOW = 0.7  # T_beh below the top of the default task thresholds: detected
WHITEWASH_WINDOW = 10  # slots each side of a rejoin


@dataclass
class _Selections:
    """One method's selections by one rule, over the test slots."""

    assigned: float = 0.0
    won: float = 0.0
    lost: float = 0.0
    newcomers: float = 0.0  # tasks handed to honest newcomers
    share: list[np.ndarray] = field(default_factory=list)  # per slot: (ids,) share of its tasks each id got


@dataclass
class _Beliefs:
    """What one method believes of the attackers and of the honest candidates, over the test slots."""

    shift: float = 0.0
    flagged: float = 0.0
    honest: int = 0
    newcomer_shift: float = 0.0
    newcomers: int = 0
    suspicion: list[np.ndarray] = field(default_factory=list)  # per slot: (ids,) mean T_beh toward its victims


def attack_measures(world, events: pa.Table, scored: list[ScoredTasks], seed: int = 0,
                    detect_below: float = DETECT_BELOW) -> dict[str, dict[str, float]]:
    """{method: {measure: value}} for every scorer of ``scored``, ``oracle`` and ``random`` (see the module's
    docstring); the selection measures by the paper's rule under their names, by the expected-value rule
    (the highest T x VoC among T >= the threshold, :func:`model.trust.select`) with the suffix ``_expected``, and by
    P(success) x VoC with the suffix ``_success`` where ``scored``'s pools carry P(tr).
    ``world`` is the simulator's :class:`simulator.world.World` as the run left it; ``events`` the run's events
    (each task's ``trust_threshold``, in the order :func:`model.voc.scored_tasks` reads owners)."""
    rng = np.random.default_rng([seed, 11])
    event_slot, event_threshold = events["slot"].to_numpy(), events["trust_threshold"].to_numpy()
    selections: dict[tuple[str, str], _Selections] = {}
    beliefs_of: dict[str, _Beliefs] = {}
    slots, victims_seen, candidate_seen = [], [], []
    tasks = 0
    overclaimed = world.overclaimed
    lying = world.claimed_cpu_hz != world.cpu_hz if overclaimed else None  # (devices,) overclaimers
    for owners, pool, beliefs in scored:
        expected, rows, cols = pool.expected, pool.rows, pool.cols
        truth = expected.reliability(world.config.weights)
        beliefs = {**beliefs, "oracle": truth}
        mine = ~world.attacker[owners]  # the tasks of honest owners: what attackers hand each other wins nothing
        misbehaving = world.misbehaving(cols, owners[rows], pool.slot, pool.sizes) & mine[rows]
        won_at, lost_at = pool.dense(misbehaving, False), pool.dense(pool.value * (1.0 - expected.p_tr *
                                                                                   expected.p_com_given_tr), 0.0)
        honest = ~world.attacker[cols] & ~world.attacker[owners[rows]]  # as honest owners see honest devices
        newcomer = honest & world.late_joiners[cols] & (pool.slot - world.joined[cols] < WHITEWASH_WINDOW)
        new_at = pool.dense(newcomer, False)
        victims = np.bincount(cols[misbehaving], minlength=world.size)
        slots.append(pool.slot)
        victims_seen.append(victims)
        candidate_seen.append(np.bincount(cols[world.attacker[cols]], minlength=world.size))
        tasks += int(mine.sum())
        thresholds = event_threshold[event_slot == pool.slot][:, None]  # (tasks, 1)
        random_choice = uniform_choice(rng, pool.valid)
        rules = SELECTION_RULES if pool.p_tr is not None else tuple(r for r in SELECTION_RULES if r != "success")
        judged = {name: (pool.dense(t_beh * pool.t_res, 0.0), pool.dense(pool.value_for(name), -np.inf),
                         pool.dense(pool.success(name, t_beh, world.config.weights), 0.0) if "success" in rules
                         else None)
                  for name, t_beh in beliefs.items()}  # (T, the VoC it selects by, P(success) x T_res) per method
        truthful = truthful_judgement(world, pool, judged) if overclaimed else {}
        for rule in rules:
            choices = {name: select(trust, voc, pool.valid, thresholds, rule, success if rule == "success" else None)
                       for name, (trust, voc, success) in judged.items()}
            choices_if_truthful = {name: select(trust, voc, pool.valid, thresholds, rule,
                                                success if rule == "success" else None)
                                   for name, (trust, voc, success) in truthful.items()}
            for name, choice in {**choices, "random": random_choice}.items():
                tally = selections.setdefault((name, rule), _Selections())
                picked = (choice >= 0) & mine
                task, column = np.flatnonzero(picked), choice[picked]
                won = won_at[task, column]
                if overclaimed:  # an overclaimer's task is won where the lie changed the choice
                    won = won_by_attack(won, lying, column, choices_if_truthful.get(name, choice)[task])
                tally.assigned += float(picked.sum())
                tally.won += float(won.sum())
                tally.lost += float(lost_at[task[won], column[won]].sum())
                tally.newcomers += float(new_at[task, column].sum())
                tally.share.append(np.bincount(column, minlength=world.size) / max(int(mine.sum()), 1))
        for name, t_beh in beliefs.items():
            tally = beliefs_of.setdefault(name, _Beliefs())
            tally.shift += float((t_beh - truth)[honest].sum())
            tally.flagged += float((t_beh[honest] < detect_below).sum())
            tally.honest += int(honest.sum())
            tally.newcomer_shift += float((t_beh - truth)[newcomer].sum())
            tally.newcomers += int(newcomer.sum())
            total = np.bincount(cols[misbehaving], weights=t_beh[misbehaving], minlength=world.size)
            with np.errstate(invalid="ignore", divide="ignore"):
                tally.suspicion.append(np.where(victims > 0, total / victims, np.nan))
    out: dict[str, dict[str, float]] = {}
    late = bool(world.late_joiners.any())
    for (name, rule), tally in selections.items():
        suffix = rule_suffix(rule)
        before, after = whitewash_shares(world, np.array(slots), np.array(tally.share))
        out.setdefault(name, {}).update({
            f"tasks_assigned{suffix}": tally.assigned / max(tasks, 1),
            f"attack_tasks_won{suffix}": tally.won / max(tasks, 1), f"attack_voc_lost{suffix}": tally.lost / max(tasks, 1),
            f"whitewash_share_before{suffix}": before, f"whitewash_share_after{suffix}": after})
        if late:
            out[name][f"newcomer_tasks_won{suffix}"] = tally.newcomers / max(tasks, 1)
    for name, tally in beliefs_of.items():
        delays = stretch_delays(np.array(slots), np.array(tally.suspicion), np.array(victims_seen) > 0,
                                np.array(candidate_seen) > 0, detect_below)
        out[name].update(attack_slots_to_detect=float(np.mean([d for d, _ in delays])) if delays else float("nan"),
                         attack_detected=float(np.mean([hit for _, hit in delays])) if delays else float("nan"),
                         honest_flagged=tally.flagged / max(tally.honest, 1),
                         honest_trust_shift=tally.shift / max(tally.honest, 1))
        if late:
            out[name]["newcomer_trust_shift"] = tally.newcomer_shift / tally.newcomers if tally.newcomers else float("nan")
    return out


Judged = tuple[np.ndarray, np.ndarray, np.ndarray | None]  # (T, the VoC it selects by, P(success) x T_res or None)


def truthful_judgement(world, pool, judged: dict[str, Judged]) -> dict[str, Judged]:
    """{method: (T, VoC, P(success) x T_res)} as each method would judge had every overclaimer's statuses claimed the
    CPU it has: the same T and P(success), the VoC at the true CPU for an overclaimer's pairs (a method that reads CPUs
    from tasks' times reads a true claim as made) and as the method judged it for the others. ``judged``: {method:
    (T, VoC it selects by, P(success) x T_res or None)}, (tasks, devices) each; ``pool``: the slot's
    :class:`model.voc.InRange`."""
    lying = pool.dense(world.claimed_cpu_hz[pool.cols] != world.cpu_hz[pool.cols], False)
    true_voc = pool.dense(pool.value, -np.inf)
    return {name: (trust, np.where(lying, true_voc, voc), success) for name, (trust, voc, success) in judged.items()}


def won_by_attack(misbehaving: np.ndarray, lying: np.ndarray, picks: np.ndarray, truthful: np.ndarray) -> np.ndarray:
    """(tasks,) the tasks an attack won: handed to an attacker misbehaving toward the owner then (``misbehaving``,
    (tasks,)), and where the device picked (``picks``, (tasks,) device indices) overclaims (``lying``, (devices,)),
    only those its lie won: the selection would have picked another (``truthful``, (tasks,)) had it claimed the CPU
    it has."""
    return misbehaving & (~lying[picks] | (truthful != picks))


def stretch_delays(slots: np.ndarray, suspicion: np.ndarray, misbehaving: np.ndarray, seen: np.ndarray,
                   below: float) -> list[tuple[int, bool]]:
    """Per misbehaving stretch of each id: (slots until detection, detected).

    slots: (S,) absolute test slots in order; suspicion: (S, ids) mean T_beh toward the owners an id misbehaves
    toward (NaN where none); misbehaving: (S, ids) whether it misbehaved toward a candidate's owner; seen: (S, ids)
    whether it was a candidate at all. A stretch runs over consecutive observed misbehaving slots and ends at a
    slot in which the id was a candidate but misbehaved toward no one (an on-off attacker's good stretch)."""
    out = []
    for column in np.flatnonzero(misbehaving.any(axis=0)):
        start, detected = None, False
        for k in range(len(slots)):
            if misbehaving[k, column]:
                if start is None:
                    start, detected = slots[k], False
                if not detected and suspicion[k, column] < below:
                    out.append((int(slots[k] - start), True))
                    detected = True
            elif seen[k, column] and start is not None:
                if not detected:
                    out.append((int(slots[k] - start), False))
                start = None
        if start is not None and not detected:
            out.append((int(slots[-1] - start + 1), False))
    return out


def whitewash_shares(world, slots: np.ndarray, share: np.ndarray) -> tuple[float, float]:
    """Mean share of a slot's tasks a whitewasher got in up to :data:`WHITEWASH_WINDOW` test slots before leaving an
    id and under its new id in as many from its first slot (``Attack.rejoin_after`` after; NaN, NaN without such a
    rejoin in the test slots; an honest device that left, ``SimConfig.leave``, has no new id and is no
    whitewasher)."""
    before, after = [], []
    if not len(slots):
        return float("nan"), float("nan")
    for old in np.flatnonzero((world.left >= slots[0]) & (world.left <= slots[-1]) & (world.next_id >= 0)):
        new, leave = world.next_id[old], world.left[old]
        back = world.joined[new]
        ahead = (slots >= leave - WHITEWASH_WINDOW) & (slots < leave)
        behind = (slots >= back) & (slots < back + WHITEWASH_WINDOW)
        if ahead.any() and behind.any():
            before.append(share[ahead, old].mean())
            after.append(share[behind, new].mean())
    return (float(np.mean(before)), float(np.mean(after))) if before else (float("nan"), float("nan"))


def injection_measures(clean: pa.Table, attacked: pa.Table, attackers: np.ndarray, victims: np.ndarray,
                       methods: list[str], alias: dict[str, str] | None = None) -> dict[str, dict[str, float]]:
    """{method: measures} of an attack injected into a recorded log (:mod:`simulator.inject`), from each run's test-edge
    forecasts on the clean log and on the attacked one (:func:`model.evaluate.predictions_table`): on the genuine test
    edges (honest raters' own, in both; an attacked edge's fresh ids read as the accounts ``alias`` names behind them),
    ``rmse_genuine_clean`` / ``rmse_genuine_attacked`` against what they rated, ``victim_shift`` (the attacked forecast
    minus the clean one, on those toward the accounts fake ratings named) and ``attacker_shift`` (the same toward the
    attackers: what an attacker's fake ratings or fresh ids won it), with ``attacker_rmse_clean`` /
    ``attacker_rmse_attacked`` on those edges (whether what it won was a mistake); NaN where no such edge."""
    keys = ["slot", "owner", "collaborator"]
    for column in ("owner", "collaborator") if alias else ():
        names = attacked[column].to_pylist()
        attacked = attacked.set_column(attacked.column_names.index(column), column,
                                       pa.array([alias.get(name, name) for name in names], pa.string()))
    honest = pc.invert(pc.is_in(attacked["owner"], value_set=pa.array(attackers, pa.string())))
    joined = attacked.filter(honest).join(clean.select([*keys, *methods]), keys=keys, right_suffix="_clean")
    target, collaborator = joined["target"].to_numpy(), joined["collaborator"]
    toward = {"victim": pc.is_in(collaborator, value_set=pa.array(victims, pa.string())).to_numpy(),
              "attacker": pc.is_in(collaborator, value_set=pa.array(attackers, pa.string())).to_numpy()}
    out = {}
    for method in methods:
        now, before = joined[method].to_numpy(), joined[f"{method}_clean"].to_numpy()
        row = {"rmse_genuine_clean": rmse(before, target), "rmse_genuine_attacked": rmse(now, target)}
        for name, rows in toward.items():
            row[f"{name}_shift"] = float(np.mean(now[rows] - before[rows])) if rows.any() else float("nan")
        rows = toward["attacker"]
        for twin, forecast in (("clean", before), ("attacked", now)):
            row[f"attacker_rmse_{twin}"] = rmse(forecast[rows], target[rows])  # NaN where no such edge
        out[method] = row
    return out
