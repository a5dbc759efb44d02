"""Where a device's reported load shifts to a new level, and what the device has shown since.

A device whose behaviour changes often changes what it runs: a degrading device takes load on, a recovering one sheds
it (with telemetry the simulator's changing devices do: :meth:`simulator.world.World.drift`). Its outcomes before such a
shift say little of it after, yet forgetting-weighted evidence mixes them at every memory: a long record of failures
weighs on a device now reliable. So, per device, a two-sided CUSUM watches its reported load for a sustained move of
its level. Each slot with tasks, the load reported by the slot's end is set against the reference, the mean of its
loads since its last shift (before any, of all its reports at the longest memory, :data:`model.evidence.REPORTS`):
``up`` gathers how far the load lies above it by more than the slack, ``down`` how far below. A side that passes the
alarm is a shift, located where that side's excursion began (the slot after it last stood at zero); the device's sums
since then (the excursion's, kept while it is open) become its sums since the shift, and both sides start again. A
load that only cycles about its level stays within the slack and never shifts.

Only sums are kept, a few per device, in the streaming shards as offline (:func:`step` is the one update of both):
:data:`model.evidence.SHIFTED` per memory its slots with a report, their summed load and the on-time-weighted
transmissions and computation successes since its last shift; :data:`model.evidence.SHIFT_OPEN` the same for each
side's open excursion; :data:`model.evidence.SHIFT_TEST` the two sides' statistics. The head reads the evidence since
the shift beside the whole record (:func:`model.evidence.shift_block`).

Glossary (Page's CUSUM): ``slack`` kappa, the move per slot let pass; ``alarm`` h, the threshold; ``up``, ``down``
S+ and S-, the two sides' statistics; ``reference`` mu, the level the load is set against.
"""

from __future__ import annotations

import numpy as np

from model.evidence import (COM, SHIFT_OPEN, SHIFT_TEST, SHIFTED, SINCE_CHANNELS, TON, EvidenceConfig, EvidenceState,
                            find, load_memory, shifted_load)

SIDE = len(SINCE_CHANNELS)  # the channels of one side's open excursion in SHIFT_OPEN, after its first (both's slots)


def reference(load: np.ndarray, since: np.ndarray, reports: np.ndarray) -> np.ndarray:
    """(k,) the level each device's load (k,) is set against: its mean load since its last shift where it shifted
    (``since`` (k, L, 4), :data:`SHIFTED`), else its mean reported load at the longest memory (``reports`` (k, L, 2)
    before this slot), else (its first report) the load itself."""
    shifted, reported = since[:, -1, 0] > 0, reports[:, -1, 0] > 0
    mean_reported = load_memory(reports, len(load), reports.shape[1])[:, -1]
    return np.where(shifted, shifted_load(since), np.where(reported, mean_reported, load))


def step(states: dict[str, EvidenceState], slot: int, keys: np.ndarray, load: np.ndarray, reports: np.ndarray,
         ton: np.ndarray, com: np.ndarray, config: EvidenceConfig) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """One slot with tasks for devices ``keys`` (k,) (unique) with a load (k,) reported by the slot's end: ``reports``
    (k, L, 2) their :data:`model.evidence.REPORTS` sums before this slot's, ``ton`` and ``com`` (k,) their on-time
    transmissions and computation successes as collaborator in the slot. Updates the :data:`model.evidence.SHIFT_ROLES`
    states in ``states`` in place; returns {role: (keys, increments (k', L, C))} as applied, for a track to replay."""
    test = states[SHIFT_TEST].query(keys, slot)[0][:, 0, :]  # (k, 3): open, up, down
    since = states[SHIFTED].query(keys, slot)[0]  # (k, L, SIDE)
    moved, shifted = load - reference(load, since, reports), since[:, -1, 0] > 0
    # a device with no open side, no shift behind it and its load within the slack of its level stays as it is
    live = (test[:, 0] > 0) | shifted | (np.abs(moved) > config.shift_slack)
    keys, load, test, since, moved, shifted, ton, com = (a[live] for a in (keys, load, test, since, moved, shifted,
                                                                           ton, com))
    excursions = states[SHIFT_OPEN].query(keys, slot)[0]  # (k', L, 1 + 2 SIDE)
    up = np.maximum(0.0, test[:, 1] + moved - config.shift_slack)
    down = np.maximum(0.0, test[:, 2] - moved - config.shift_slack)
    increment = np.stack([np.ones(len(keys)), load, ton, com], axis=1)[:, None, :]  # (k, 1, SIDE)
    up_sums = np.where((up > 0)[:, None, None], excursions[..., 1:1 + SIDE] + increment, 0.0)
    down_sums = np.where((down > 0)[:, None, None], excursions[..., 1 + SIDE:] + increment, 0.0)
    rose, fell = up > config.shift_alarm, down > config.shift_alarm
    carried = np.where(shifted[:, None, None], since + increment, 0.0)  # a shift behind it: its sums go on
    new_since = np.where(rose[:, None, None], up_sums, np.where(fell[:, None, None], down_sums, carried))
    restart = rose | fell
    up[restart], down[restart], up_sums[restart], down_sums[restart] = 0.0, 0.0, 0.0, 0.0
    new_test = np.stack([((up > 0) | (down > 0)).astype(np.float64), up, down], axis=1)[:, None, :]
    new_excursions = np.concatenate([up_sums[..., :1] + down_sums[..., :1], up_sums, down_sums], axis=-1)
    applied = {}
    for role, old, new in ((SHIFT_TEST, test[:, None, :], new_test), (SHIFT_OPEN, excursions, new_excursions),
                           (SHIFTED, since, new_since)):
        moves = (new != old).any(axis=(1, 2))  # the rest decay as they are (or stay absent)
        applied[role] = (keys[moves], (new - old)[moves])
        if moves.any():
            states[role].update(applied[role][0], slot, applied[role][1])
    return applied


def watch(states: dict[str, EvidenceState], slot: int, keys: np.ndarray, load: np.ndarray, reports: np.ndarray,
          task_keys: np.ndarray, task_increments: np.ndarray, config: EvidenceConfig
          ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """:func:`step` from a slot's evidence as collaborator: ``keys`` (k,) sorted, the devices with a load (k,) known by
    the slot's end, ``reports`` as :func:`step` takes them, and the slot's collaborator increments ``task_keys`` (t,)
    and ``task_increments`` (t, C) (:func:`model.evidence.role_increments`), whose TON and COM it reads."""
    ton, com = np.zeros(len(keys)), np.zeros(len(keys))
    at, found = find(keys, task_keys)
    ton[at[found]], com[at[found]] = task_increments[found, TON], task_increments[found, COM]
    return step(states, slot, keys, load, reports, ton, com, config)
