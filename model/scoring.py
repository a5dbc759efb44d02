"""Scoring a slot: the one implementation behind ``trustbeam score`` (offline) and ``trustbeam run`` (Beam).

Devices are int64 keys (:func:`model.graphs.device_keys` of their ids), so that a device the model
never saw is scored like any other: its node2vec row is the model's cold row, and its own evidence
moves its T_beh from the cold prior as its tasks accrue. The path, per closed slot s:

1. :func:`slot_part`: the slot's events (deduplicated by ``event_id``) -> T_col edges -> the slot
   graph -> GNN embeddings of the active devices, each owner's latest task in the slot, and the
   slot's evidence per role (:mod:`model.evidence`).
2. :class:`DeviceHistory`: a set of devices' recent slot embeddings, task profiles, statuses and
   evidence. The offline scorer holds one for all devices; the pipeline holds one per device shard
   in Beam state. :meth:`DeviceHistory.frame` gives, for slot s, each device's long-term embedding
   Y (the sequence encoder over its last S slots, idle slots as the learned idle embedding), its
   latest status before the slot's end, its task profile if it owned a task in the last R slots,
   and its evidence as collaborator and owner, plus the evidence of the pairs its recent owners
   formed. A slot's evidence stays pending until the slot is final (:meth:`DeviceHistory.fold`),
   so an update of a slot within the allowed lateness replaces it instead of adding it twice.
3. :func:`score_pairs`: frames of all devices -> for each recent owner i and candidate j, the pair's
   physics (:mod:`model.context`) and evidence (candidates within range by a k-d tree,
   :mod:`model.candidates`: owners x neighbours, never owners x fleet) -> T_beh, T_res, VoC.
4. :meth:`model.published.PairScores.publish` (through :class:`model.publisher.SlotPublisher`, slots in order): T_beh moved by the
   online recalibration -> T = T_beh * T_res -> trust scores and rankings (T >= theta, then the highest VoC for
   the owner's task), as the wire records of :mod:`schemas`.

Glossary: Y the long-term embedding, T_beh/T_res/T the paper's trusts, theta the task's trust
threshold, V (``voc``) the value of task completion (eqs. 2-9, :mod:`model.physics`).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from model.candidates import Pieces, candidate_pairs
from model.config import RankingConfig, SlotClock, SystemParams
from model.context import pair_physics
from model.credibility import credibility, discredited
from model.evidence import (DISCREDITED, N, POPULATION, REPORTED, REPORTS, ROLES, SHIFT_ROLES, SHIFTED, STATE_ROLES,
                            SUMMED_ROLES, W, EvidenceBlocks, EvidenceConfig, EvidenceState, channels_of,
                            credited_load, decay, empty_state, fall_age, fall_credit, fall_pool, find, key_order,
                            positions, report_increments, role_increments, verified_cpu, with_status)
from model.graphs import DeviceIndex, device_keys, pair_keys, slot_edges, slot_graphs
from model.identity import heard_slots, identity_groups, pooled
from model.published import PairScores, SlotScores
from model.publisher import SlotPublisher
from model.recalibration import OnlineShift
from model.shift import watch
from model.stages import Stages, Windows
from model.status import COMM_OK, COMP_OK, CPU, LOAD, WILLINGNESS, X, Y, StatusLog, status_values, telemetry_of
from model.timing import timed
from model.trust import resource_trust
from model.usage_cycle import CYCLE, cycle_deviation, cycle_increments

PROFILE_COLUMNS = ("task_size_bits", "density_cycles_per_bit", "trust_threshold")


def shard_of(keys: np.ndarray, shards: int) -> np.ndarray:
    """The device shard of each key (keys are uniform hashes, so shards are even)."""
    return np.asarray(keys, np.int64) % shards


def held_by(role: str, keys: np.ndarray, tags: np.ndarray) -> np.ndarray:
    """The device keys whose shard holds each key of a role: a pair goes with its owner (its tag), what an owner
    reported of a pair with its collaborator (its first tag), everything else with its own key."""
    return {"pair": lambda: tags, REPORTED: lambda: tags[:, 0]}.get(role, lambda: keys)()


@dataclass
class SlotPart:
    """One slot's contribution for a set of devices, as plain numpy arrays (keys sorted)."""

    slot: int
    keys: np.ndarray  # (m,) the slot's devices
    ids: np.ndarray  # (m,) their ids
    active: np.ndarray  # (a,) keys of the devices with a GNN embedding in the slot
    embeddings: np.ndarray  # (a, d)
    owners: np.ndarray  # (o,) keys of the devices that owned a task in the slot
    profile: np.ndarray  # (o, 4): time of the latest task, then PROFILE_COLUMNS (NaN where absent)
    evidence: dict[str, tuple[np.ndarray, np.ndarray]]  # role -> (keys, increments (k, C)); pairs: pair keys
    pair_owners: np.ndarray  # (p,) the owner key of each pair increment
    has_tasks: bool = True  # whether the slot had any task (in any shard): its devices' reports count only then
    # (r, 2) the collaborator and owner keys of each owner-reported pair (REPORTED increments: pair keys)
    reported_pairs: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))

    def select(self, shard: int, shards: int) -> "SlotPart":
        """The part restricted to the devices of one shard (pairs go with their owner, what an owner reported of a
        pair with its collaborator)."""
        def mine(keys: np.ndarray) -> np.ndarray:
            return shard_of(keys, shards) == shard

        evidence = {}
        for role, (keys, increments) in self.evidence.items():
            keep = mine(held_by(role, keys, self.pair_owners if role == "pair" else self.reported_pairs))
            evidence[role] = (keys[keep], increments[keep])
        k, a, o, p = mine(self.keys), mine(self.active), mine(self.owners), mine(self.pair_owners)
        r = mine(self.reported_pairs[:, 0])
        return SlotPart(self.slot, self.keys[k], self.ids[k], self.active[a], self.embeddings[a], self.owners[o],
                        self.profile[o], evidence, self.pair_owners[p], self.has_tasks, self.reported_pairs[r])


def slot_part(stages: Stages, events: pa.Table, slot: int) -> SlotPart:
    """Embeddings, owner profiles and evidence of one slot from its valid events."""
    config = stages.config
    events = dedup(events)
    d = config.gnn.out_dim
    if events.num_rows == 0:
        empty = np.zeros(0, dtype=np.int64)
        nothing = {role: (empty, np.zeros((0, channels_of(role)))) for role in (*ROLES, REPORTED)}
        return SlotPart(slot, empty, np.zeros(0, object), empty, np.zeros((0, d), np.float32), empty,
                        np.zeros((0, 4)), nothing, empty, has_tasks=False)
    edges = slot_edges(events, config.clock, config.weights)
    local = DeviceIndex.from_edges(edges)  # the slot's devices, by id
    ids = pa.array(local.ids, pa.string())
    keys = device_keys(local.ids)
    graph = slot_graphs(edges, local)[slot]
    if stages.uses_encoder:
        positions, embeddings = stages.slot_embeddings(graph, stages.feature_rows(ids))  # (a,), (a, d)
    else:  # the head reads no Y: no slot GNN
        positions, embeddings = np.zeros(0, np.int64), np.zeros((0, d), np.float32)
    n = len(local)
    evidence, pair_owners, reported = {}, np.zeros(0, np.int64), np.zeros((0, 2), np.int64)
    for role, (local_keys, increments) in role_increments(graph, n, config.evidence).items():
        if role in ("pair", REPORTED):
            owner, collaborator = keys[local_keys // n], keys[local_keys % n]
            evidence[role] = (pair_keys(owner, collaborator), increments)
            if role == "pair":
                pair_owners = owner
            else:
                reported = np.stack([collaborator, owner], axis=1)
        elif role == "population":  # one key, the same everywhere
            evidence[role] = (local_keys, increments)
        else:
            evidence[role] = (keys[local_keys], increments)
    latest = events.sort_by([("owner", "ascending"), ("event_time_ms", "descending"), ("event_id", "descending")])
    owner_ids = latest["owner"].to_numpy(zero_copy_only=False)
    first = np.flatnonzero(np.r_[True, owner_ids[1:] != owner_ids[:-1]])  # each owner's latest task
    columns = [latest["event_time_ms"].to_numpy()[first].astype(np.float64)]
    columns += [pc.fill_null(latest[c], np.nan).to_numpy()[first] for c in PROFILE_COLUMNS]
    owners = device_keys(owner_ids[first].tolist())
    by_key, by_owner, by_active = key_order(keys), key_order(owners), key_order(keys[positions])
    return SlotPart(slot, keys[by_key], np.asarray(local.ids, object)[by_key], keys[positions][by_active],
                    embeddings[by_active], owners[by_owner], np.stack(columns, axis=1)[by_owner], evidence, pair_owners,
                    reported_pairs=reported)


def first_occurrences(events: pa.Table) -> np.ndarray:
    """Sorted row indices of the first occurrence of each ``event_id``: the one dedup rule, offline, in the
    local cycles' snapshots and at a streaming slot's close."""
    _, first = np.unique(events["event_id"].to_numpy(zero_copy_only=False), return_index=True)
    return np.sort(first)


def dedup(events: pa.Table) -> pa.Table:
    """The first occurrence of each ``event_id``."""
    first = first_occurrences(events)
    return events.take(first) if len(first) < events.num_rows else events


def status_horizon(clock: SlotClock, slot: int, window: int) -> int:
    """The time before which statuses superseded by a later one can be forgotten once ``slot`` is scored: the
    start of the first slot of the next frames' windows (each slot's telemetry is the latest report before
    its end)."""
    return int(clock.start_ms(slot - window + 1))


def window_read(stages: Stages) -> int:
    """The slots of embeddings and statuses a device's frame reads: the sequence window where the model uses
    its encoder, else the slot itself (the state kept per device shrinks with it)."""
    return stages.config.window if stages.uses_encoder else 1


def slots_read_back(window: int, ranking: RankingConfig) -> int:
    """How many slots up to a slot its frame reads (the sequence window, the owners' recent slots): the
    retention horizon of slot parts, offline, in the shards and in the local cycles' event snapshots."""
    return max(window, ranking.owner_slots)


@dataclass
class DeviceFrame:
    """One slot's view of a set of devices, ready to score (devices sorted by key, pairs by pair key)."""

    keys: np.ndarray  # (n,)
    ids: np.ndarray  # (n,)
    y: np.ndarray  # (n, d) long-term embeddings
    status: np.ndarray  # (n, 9) STATUS_COLUMNS, NaN where no status is known
    heard_ms: np.ndarray  # (n, 2) when each device's first status and that one were sent (ms; -1 where none is known)
    profile: np.ndarray  # (n, 3) PROFILE_COLUMNS of a recent owner's latest task, NaN for non-owners
    recent_owner: np.ndarray  # (n,) bool
    collaborator: np.ndarray  # (n, L, C) evidence as collaborator
    since: np.ndarray  # (n,) slots since the device last served (NEVER: not known to have)
    owner: np.ndarray  # (n, L, C) evidence as owner
    pairs: np.ndarray  # (m,) pair keys of the recent owners' pairs
    pair_owners: np.ndarray  # (m,) the owner key of each pair
    pair_evidence: np.ndarray  # (m, L, PAIR_CHANNELS): what a pair's state keeps (most of a frame's bytes)
    population: np.ndarray  # (1, L, C) the population's evidence this frame holds (one shard holds it all)
    reports: np.ndarray  # (n, L, 2) each device's REPORTS sums (model.evidence.load_memory)
    shifted: np.ndarray  # (n, L, 4) each device's SHIFTED sums: since its load last shifted (model.shift)
    cycle: np.ndarray  # (n, 1, C) each device's CYCLE sums, its loads' harmonic fit (model.usage_cycle; C = 0: none)
    falls: np.ndarray  # (FALL_AGES, 3) how this frame's devices fared since their loads fell, by the falls' age
    #                    (model.evidence.fall_pool)
    # what owners reported themselves of their pairs (model.credibility), each frame's of its devices as collaborators:
    reported: np.ndarray  # (r,) pair keys
    reported_pairs: np.ndarray  # (r, 2) their collaborator and owner keys
    reported_evidence: np.ndarray  # (r, L + 1, C) what the owner reported (model.evidence.role_lams)
    reported_monitored: np.ndarray  # (r, C) what monitors saw of the collaborator, at the longest memory

    PAIR_FIELDS = ("pairs", "pair_owners", "pair_evidence")
    REPORTED_FIELDS = ("reported", "reported_pairs", "reported_evidence", "reported_monitored")
    WHOLE_FIELDS = ("population", "falls")  # not per device: summed when frames are joined, kept whole in a piece

    @classmethod
    def concat(cls, frames: list["DeviceFrame"]) -> "DeviceFrame":
        joined = {f.name: np.concatenate([getattr(frame, f.name) for frame in frames]) for f in fields(cls)
                  if f.name not in cls.WHOLE_FIELDS}
        order = {"devices": key_order(joined["keys"]), "pairs": key_order(joined["pairs"]),
                 "reported": key_order(joined["reported"])}
        whole = {name: sum(getattr(frame, name) for frame in frames) for name in cls.WHOLE_FIELDS}
        return cls(**{name: value[order[cls.ordered_by(name)]] for name, value in joined.items()}, **whole)

    @classmethod
    def ordered_by(cls, name: str) -> str:
        """Which rows a field's are: devices, pairs or owner-reported pairs."""
        return "pairs" if name in cls.PAIR_FIELDS else "reported" if name in cls.REPORTED_FIELDS else "devices"

    def select(self, devices: np.ndarray, owners: np.ndarray) -> "DeviceFrame":
        """The frame of the rows in ``devices`` or ``owners`` ((n,) bool), where only ``owners`` are scored as
        owners, with their pairs."""
        rows = devices | owners
        recent = self.recent_owner & owners
        mine = np.isin(self.pair_owners, self.keys[recent])

        def part(name: str) -> np.ndarray:  # every piece judges every reporter: it holds every owner-reported pair
            value = getattr(self, name)
            if name in self.WHOLE_FIELDS or name in self.REPORTED_FIELDS:
                return value
            return value[mine if name in self.PAIR_FIELDS else rows]

        return DeviceFrame(**{f.name: part(f.name) for f in fields(self) if f.name != "recent_owner"},
                           recent_owner=recent[rows])

    def pieces(self, pieces: Pieces, range_m: float | None, identity_m: float = 0.0) -> list["DeviceFrame"]:
        """The frame split into ``pieces.count`` frames (:class:`model.candidates.Pieces`): scoring each and
        joining the results gives the records of scoring the whole frame (with ``identity_m``, the farthest
        :mod:`model.identity` judges two ids together at, ``EvidenceConfig.identity_m``: a piece holds the ids within
        it of its candidates)."""
        if pieces.count == 1:  # the whole frame: nothing to copy
            return [self]
        return [self.select(*rows) for rows in self.piece_rows(pieces, range_m, identity_m)]

    def piece_rows(self, pieces: Pieces, range_m: float | None, identity_m: float = 0.0
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per piece of :meth:`pieces`, the (devices, owners) (n,) bool rows that :meth:`select` makes it of."""
        xy = self.status[:, [X, Y]]
        home = pieces.home(xy, range_m)
        rows, piece = pieces.reach(xy, range_m, identity_m)
        out = []
        for k in range(pieces.count):
            devices = np.zeros(len(self.keys), bool)
            devices[rows[piece == k]] = True
            out.append((devices, home == k))
        return out


@dataclass
class DeviceHistory:
    """What :meth:`frame` needs of a set of devices for any recent slot (only numpy, so Beam can pickle it).

    Slot embeddings and owner profiles are kept per slot for the last S slots; statuses per device
    until superseded; evidence as decayed sums (:class:`model.evidence.EvidenceState`) folded up to
    the last final slot, the later slots' increments pending in their parts. Devices are known by
    key, with their ids, from the parts and statuses that named them.
    """

    evidence_config: EvidenceConfig
    clock: SlotClock = field(default_factory=SlotClock)  # the model's: when a slot's reported loads were reported
    names: tuple[np.ndarray, np.ndarray] = field(default_factory=lambda: (np.zeros(0, np.int64), np.zeros(0, object)))
    parts: dict[int, SlotPart] = field(default_factory=dict)
    status: StatusLog = field(default_factory=StatusLog)
    evidence: dict[str, EvidenceState] = field(default_factory=dict)
    folded_through: int = -1  # the last slot whose evidence is in ``evidence``
    model_version: str = ""  # the model whose embeddings the parts hold

    def __post_init__(self) -> None:
        for role in STATE_ROLES:
            self.evidence.setdefault(role, empty_state(role, self.evidence_config.lams))

    def adopt(self, model_version: str, evidence_config: EvidenceConfig) -> bool:
        """Make this history one of ``model_version``: embeddings made by another model are dropped (the next
        slots rebuild them), and evidence counted under another evidence config too. Returns whether any
        state was dropped."""
        if self.model_version in ("", model_version):
            self.model_version = model_version
            return False
        self.parts = {}
        if evidence_config != self.evidence_config:
            self.evidence_config, self.evidence, self.folded_through = evidence_config, {}, -1
            self.__post_init__()
        self.model_version = model_version
        return True

    def name(self, keys: np.ndarray, ids: np.ndarray) -> None:
        """Record the ids of device keys."""
        all_keys = np.concatenate([self.names[0], keys])
        all_ids = np.concatenate([self.names[1], np.asarray(ids, object)])
        unique, first = np.unique(all_keys, return_index=True)
        self.names = (unique, all_ids[first])

    def add_part(self, part: SlotPart) -> None:
        """A slot's part; a later version of the same slot (late events) replaces it while it is pending. The
        part of a slot already final adds its embeddings only (a replay after :meth:`seed`)."""
        self.parts[part.slot] = part
        self.name(part.keys, part.ids)

    def seed(self, snapshot: "EvidenceSnapshot") -> None:
        """Start from final evidence kept by an earlier run (when it is newer than this history's)."""
        if snapshot.folded_through > self.folded_through:
            self.evidence, self.folded_through = snapshot.states, snapshot.folded_through

    def add_status(self, keys: np.ndarray, ids: np.ndarray, times: np.ndarray, values: np.ndarray) -> None:
        self.status.add(keys, times, values)
        self.name(keys, ids)

    def fold(self, through_slot: int) -> None:
        """Make the evidence of the parts up to ``through_slot`` final (they can no longer change)."""
        for slot in sorted(s for s in self.parts if self.folded_through < s <= through_slot):
            summed = {role: self.increments(role, slot) for role in SUMMED_ROLES}
            if self.evidence_config.shifts:
                self.watch(self.evidence, slot, *summed[REPORTS])
            for role, (keys, increments) in summed.items():
                tags = {"pair": self.parts[slot].pair_owners, REPORTED: self.parts[slot].reported_pairs}.get(role)
                if len(keys):
                    self.evidence[role].update(keys, slot, increments, tags)
            self.folded_through = slot  # the next slot's increments read the evidence through this one (its cycles)
        self.folded_through = max(self.folded_through, through_slot)

    def increments(self, role: str, slot: int, among: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(keys, increments) of a role in a held slot: its part's, the collaborators' with their load channels
        filled from the loads they reported by the slot's end and their speeds set against the CPUs they claimed
        (:func:`model.evidence.with_status`; the shard holds
        their statuses); for :data:`REPORTS` (and with ``cycles`` :data:`model.usage_cycle.CYCLE`), every device's
        latest reported load by then, where the slot had tasks (as offline: :meth:`model.history.History.tracks`), or
        only those of ``among`` (sorted keys) where it is given."""
        part, end = self.parts[slot], int(self.clock.end_ms(slot))
        if role in (REPORTS, CYCLE):
            summed = part.has_tasks and (role == REPORTS or self.evidence_config.cycles)
            keys = (np.unique(self.status.keys) if among is None else among) if summed else np.zeros(0, np.int64)
            load = self.status.latest_load(keys, end)
            return report_increments(keys, load) if role == REPORTS else cycle_increments(keys, load, slot)
        keys, increments = part.evidence[role]
        if role not in ("collaborator", REPORTED) or not len(keys):
            return keys, increments
        collaborators = part.reported_pairs[:, 0] if role == REPORTED else keys
        return keys, with_status(increments, self.status.latest_load(collaborators, end),
                                 self.status.latest_value(collaborators, end, CPU),
                                 self.cycle_at(collaborators, slot) if self.evidence_config.cycles else None)

    def cycle_at(self, keys: np.ndarray, slot: int) -> np.ndarray:
        """(k,) where each device's usage cycle put its load in held ``slot``, its report of the slot counted
        (:func:`model.usage_cycle.cycle_deviation`); ``keys`` in any order, repeated or not."""
        unique, inverse = np.unique(keys, return_inverse=True)
        return cycle_deviation(self._evidence(CYCLE, unique, slot)[0], slot)[inverse]

    def watch(self, states: dict[str, EvidenceState], slot: int, keys: np.ndarray, loads: np.ndarray) -> None:
        """:func:`model.shift.watch` of held ``slot`` on the :data:`SHIFT_ROLES` of ``states``, for the devices ``keys``
        (sorted) of the slot's :data:`REPORTS` increments ``loads`` (k, 2), each load set against the level
        ``states[REPORTS]`` held before them."""
        watch(states, slot, keys, loads[:, 1], states[REPORTS].query(keys, slot)[0],
              *self.parts[slot].evidence["collaborator"], self.evidence_config)

    def shifts(self, keys: np.ndarray, slot: int) -> dict[str, EvidenceState]:
        """The :data:`REPORTS` and :data:`SHIFT_ROLES` states of devices ``keys`` at the end of ``slot``: the folded
        ones, summed and watched on through the pending parts up to it as :meth:`fold` would (on copies: the pending
        parts can still change)."""
        states = {role: self.evidence[role].copy() for role in (REPORTS, *SHIFT_ROLES)}
        for s in sorted(p for p in self.parts if self.folded_through < p <= slot):
            reported, loads = self.increments(REPORTS, s)
            mine = np.isin(reported, keys)
            self.watch(states, s, reported[mine], loads[mine])
            states[REPORTS].update(reported[mine], s, loads[mine])
        return states

    def prune(self, before_slot: int, status_before_ms: int) -> None:
        """Forget slot parts before ``before_slot`` (folded first), statuses superseded before
        ``status_before_ms`` (a caller keeps those the sequences' window reads: :func:`status_horizon`), faded
        evidence, and the names of devices nothing refers to any more."""
        self.fold(before_slot - 1)
        self.parts = {s: p for s, p in self.parts.items() if s >= before_slot}
        self.status.prune(status_before_ms)
        for state in self.evidence.values():
            state.prune(max(self.folded_through, 0))
        referred = [self.status.keys, self.evidence["collaborator"].keys, self.evidence["owner"].keys,
                    *(p.keys for p in self.parts.values())]
        keep = np.isin(self.names[0], np.concatenate(referred))
        self.names = (self.names[0][keep], self.names[1][keep])

    def _evidence(self, role: str, keys: np.ndarray, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """(values (k, L, C), slots since the last update) of ``keys`` at the end of ``slot``: the folded state
        plus the pending parts up to the slot (a :data:`SHIFT_ROLES` state is watched on instead: :meth:`shifts`)."""
        values, since = self.evidence[role].query(keys, slot)
        lams = self.evidence[role].lams
        for s in sorted(p for p in self.parts if self.folded_through < p <= slot):  # a status role's, of keys alone
            part_keys, increments = self.increments(role, s, keys if role in (REPORTS, CYCLE) else None)
            at = np.searchsorted(keys, part_keys)
            hit = (at < len(keys)) & (keys[np.minimum(at, max(len(keys) - 1, 0))] == part_keys) if len(keys) else \
                np.zeros(len(part_keys), bool)
            factor = decay(lams, np.full(int(hit.sum()), slot - s))
            values[at[hit]] += increments[hit][:, None, :] * factor[:, :, None]
            since[at[hit]] = slot - s
        return values, since

    def frame(self, stages: Stages, slot: int, ranking: RankingConfig) -> DeviceFrame:
        keys, ids = self.names
        y = stages.long_term(self.windows(stages, slot)) if stages.uses_encoder else \
            np.zeros((len(keys), stages.config.gnn.out_dim), np.float32)  # (n, d); unread without the encoder
        status, heard_ms = self.status.heard(keys, int(stages.config.clock.end_ms(slot)))
        profile = np.full((len(keys), 1 + len(PROFILE_COLUMNS)), np.nan)
        profile[:, 0] = -np.inf
        for s in range(slot - ranking.owner_slots + 1, slot + 1):
            part = self.parts.get(s)
            if part is None or not len(part.owners):
                continue
            at = np.searchsorted(keys, part.owners)
            newer = part.profile[:, 0] > profile[at, 0]
            profile[at[newer]] = part.profile[newer]
        recent = np.isfinite(profile[:, 0])
        collaborator, since = self._evidence("collaborator", keys, slot)
        owner, _ = self._evidence("owner", keys, slot)
        pairs_state = self.evidence["pair"]
        pending = [self.parts[s] for s in self.parts if self.folded_through < s <= slot]
        held = np.isin(pairs_state.tags, keys[recent])
        fresh = [np.isin(p.pair_owners, keys[recent]) for p in pending]
        candidates = np.concatenate([pairs_state.keys[held], *(p.evidence["pair"][0][f] for p, f in zip(pending, fresh))])
        tags = np.concatenate([pairs_state.tags[held], *(p.pair_owners[f] for p, f in zip(pending, fresh))])
        pairs, first = np.unique(candidates, return_index=True)
        pair_evidence, _ = self._evidence("pair", pairs, slot)
        population, _ = self._evidence("population", np.array([POPULATION]), slot)
        if self.evidence_config.shifts:  # the pending slots' reports summed once, and watched for shifts as they are
            states = self.shifts(keys, slot)
            reports, shifted = (states[role].query(keys, slot)[0] for role in (REPORTS, SHIFTED))
        else:
            reports, shifted = self._evidence(REPORTS, keys, slot)[0], self.evidence[SHIFTED].query(keys, slot)[0]
        cycle = self._evidence(CYCLE, keys, slot)[0] if self.evidence_config.cycles else \
            np.zeros((len(keys), 1, 0))
        falls = fall_pool(collaborator, shifted, reports, self.evidence_config)
        reported, reported_pairs, reported_evidence, monitored, reported_since = self.reported(slot)
        at, held = find(keys, reported_pairs[:, 0])
        np.minimum.at(since, at[held], reported_since[held])  # an owner's report of it says it served too
        return DeviceFrame(keys, ids, y, status, heard_ms, profile[:, 1:], recent, collaborator, since, owner, pairs,
                           tags[first].astype(np.int64), pair_evidence, population, reports, shifted, cycle, falls,
                           reported, reported_pairs, reported_evidence, monitored)

    def reported(self, slot: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The :data:`DeviceFrame.REPORTED_FIELDS` at the end of ``slot``: every owner-reported pair of this history's
        collaborators, and what monitors saw of its collaborator; and the slots since each pair's last report."""
        state = self.evidence[REPORTED]
        pending = [self.parts[s] for s in self.parts if self.folded_through < s <= slot]
        keys = np.concatenate([state.keys, *(p.evidence[REPORTED][0] for p in pending)])
        pairs = np.concatenate([state.tags, *(p.reported_pairs for p in pending)])
        keys, first = np.unique(keys, return_index=True)
        pairs = pairs[first]
        evidence, since = self._evidence(REPORTED, keys, slot)
        collaborators, at = np.unique(pairs[:, 0], return_inverse=True)
        monitored, _ = self._evidence("collaborator", collaborators, slot)
        return keys, pairs, evidence, monitored[at, -1, :], since

    def windows(self, stages: Stages, slot: int) -> Windows:
        """Every device's window of slot embeddings over [max(slot - S + 1, 0), slot] (idle where it had no task) and
        what it reported by each slot's end (:meth:`model.history.History.telemetry`: the statuses of the window are
        kept, :meth:`prune`); the window is right-padded by its last slot."""
        keys = self.names[0]
        window, clock = stages.config.window, stages.config.clock
        start = max(slot - window + 1, 0)
        length = slot - start + 1
        tables, rows = [stages.idle[None].astype(np.float32)], np.zeros((len(keys), length), np.intp)  # row 0: idle
        for k in range(length):
            part = self.parts.get(start + k)
            if part is None or not len(part.active):
                continue
            at, hit = find(part.active, keys)
            rows[hit, k] = sum(map(len, tables)) + at[hit]
            tables.append(part.embeddings)
        load = self.status.latest_load(np.repeat(keys, length), np.tile(clock.end_ms(np.arange(start, slot + 1)),
                                                                        len(keys)).astype(np.int64))
        return Windows(np.concatenate(tables).astype(np.float32, copy=False), rows,
                       np.full(len(keys), length, np.int64),
                       telemetry_of(load).reshape(len(keys), length, -1), window)


@dataclass
class EvidenceSnapshot:
    """The final (folded) evidence of a set of devices and pairs through one slot, as a new run's shards start
    from it: the local runner's cycles carry it from one cycle to the next, as they carry statuses."""

    folded_through: int
    states: dict[str, EvidenceState]

    @classmethod
    def merge(cls, shards: list["EvidenceSnapshot"]) -> "EvidenceSnapshot":
        """One snapshot of disjoint shards folded through the same slot."""
        through = {s.folded_through for s in shards}
        if len(through) != 1:
            raise ValueError(f"evidence snapshot: shards folded through different slots {sorted(through)}")
        states = {}
        for role in STATE_ROLES:
            parts = [s.states[role] for s in shards]
            keys = np.concatenate([p.keys for p in parts])
            order = key_order(keys)
            states[role] = EvidenceState(parts[0].lams, keys[order], np.concatenate([p.slots for p in parts])[order],
                                         np.concatenate([p.values for p in parts])[order],
                                         np.concatenate([p.tags for p in parts])[order])
        return cls(through.pop(), states)

    def select(self, shard: int, shards: int) -> "EvidenceSnapshot":
        """The part of one device shard (pairs go with their owner, the tag)."""
        states = {}
        for role, state in self.states.items():
            mine = shard_of(held_by(role, state.keys, state.tags), shards) == shard
            states[role] = EvidenceState(state.lams, state.keys[mine], state.slots[mine], state.values[mine],
                                         state.tags[mine])
        return EvidenceSnapshot(self.folded_through, states)

    def save(self, path: str | Path) -> None:
        """As .npz (no pickle: loading never runs code)."""
        arrays = {"folded_through": np.array(self.folded_through), "lams": self.states["collaborator"].lams}
        for role, state in self.states.items():
            arrays.update({f"{role}.{name}": getattr(state, name) for name in ("keys", "slots", "values", "tags",
                                                                               "lams")})
        with open(path, "wb") as handle:
            np.savez(handle, **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "EvidenceSnapshot":
        """A saved snapshot; a role it does not hold (saved before the role existed) starts empty, and channels it
        does not hold (saved before they existed: the size channels, :data:`model.evidence.SIZED`, the claims'
        :data:`model.evidence.CLAIMS`) start at zero."""
        with np.load(path, allow_pickle=False) as data:
            states = {role: EvidenceState(data.get(f"{role}.lams", data["lams"]), data[f"{role}.keys"],
                                          data[f"{role}.slots"], with_channels(data[f"{role}.values"], role),
                                          data[f"{role}.tags"])
                      if f"{role}.keys" in data else empty_state(role, data["lams"]) for role in STATE_ROLES}
            return cls(int(data["folded_through"]), states)


def with_channels(values: np.ndarray, role: str) -> np.ndarray:
    """A role's saved sums (m, L, C') as this trustbeam keeps them (C): channels added since (C' < C) at zero, and
    for a role that keeps fewer now (a pair, an owner: the channels its features never read) its first C."""
    missing = channels_of(role) - values.shape[-1]
    if missing <= 0:
        return np.ascontiguousarray(values[..., :channels_of(role)])
    return np.concatenate([values, np.zeros((*values.shape[:-1], missing))], axis=-1)


def status_arrays(status: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(keys, ids, times, values (m, 9)) of DeviceStatus rows."""
    ids = status["device"].to_numpy(zero_copy_only=False)
    return device_keys(ids.tolist()), ids.astype(object), status["time_ms"].to_numpy(), status_values(status)


def _pair_rows(frame: DeviceFrame, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(the frame's pair evidence with a zero row appended (m + 1, L, C), each pair key's row in it (P,): the
    zero row for pairs the frame does not hold)."""
    table = np.concatenate([frame.pair_evidence, np.zeros((1, *frame.pair_evidence.shape[1:]))])
    return table, positions(frame.pairs, keys, len(frame.pairs))


def score_pairs(stages: Stages, frame: DeviceFrame, slot: int, ranking: RankingConfig, params: SystemParams,
                version: int = 0, piece: int = 0) -> PairScores:
    """Score each recent owner against its candidates (within range; not its own ids, those at its place:
    :mod:`model.identity`): T_beh, T_res and VoC of every pair. ``version`` numbers the piece's scorings
    (:attr:`PairScores.version`); ``piece`` names the piece of the slot ``frame`` is (:meth:`DeviceFrame.pieces`)."""
    owners = np.flatnonzero(frame.recent_owner)
    known = np.flatnonzero(~np.isnan(frame.status[:, X]))
    xy = frame.status[:, [X, Y]]
    src, dst, _ = candidate_pairs(xy, owners, known, ranking.range_m)  # (P,) frame rows
    evidence = stages.config.evidence  # ids at one place, or one after another: one device
    first, last = heard_slots(frame.heard_ms[:, 0], frame.heard_ms[:, 1], stages.config.clock)
    collaborator, population, reporters, disbelieved = credited_evidence(frame, evidence.discredited)
    group = identity_groups(xy, first, last, evidence.colocation_m, evidence.succession_m, evidence.succession_slots,
                            (collaborator, population[0]), evidence.poor_succession_m)
    if group is not None:
        other = group[src] != group[dst]
        src, dst = src[other], dst[other]
    thresholds = frame.profile[:, 2]
    thresholds = np.where(np.isnan(thresholds), ranking.default_threshold, thresholds)
    if ranking.threshold_floor is not None:
        thresholds = np.minimum(thresholds, ranking.threshold_floor)
    t_beh, t_res, voc, believed = np.zeros(len(src)), np.zeros(len(src)), np.zeros(len(src)), np.ones(len(src))
    step = np.zeros(len(src))  # T_beh's change for a task of the other size class
    p_tr = None if stages.transmission is None else np.zeros(len(src))  # each pair's P(tr) by the model's curve
    status = frame.status
    if len(src):
        pair_table, pair_at = _pair_rows(frame, pair_keys(frame.keys[src], frame.keys[dst]))
        at, known = find(reporters[0], frame.keys[src])
        believed[known] = reporters[1][at[known]]
        since = frame.since
        if group is not None:
            if disbelieved is not None:
                disbelieved = pooled(disbelieved, since, group)[0]
            collaborator, since = pooled(collaborator, since, group)
        if evidence.speed_gap is not None:  # each CPU as far as its tasks' times bear the claim out
            status = status.copy()
            status[:, CPU] = verified_cpu(status[:, CPU], collaborator, evidence)
        physics = pair_physics(status, status, frame.profile[:, :2], params, src, dst)
        credit = fall_credit(frame.falls, fall_age(frame.shifted, evidence.lams)) if evidence.credits_falls else None
        blocks = EvidenceBlocks.of(collaborator, frame.owner, pair_table, since, evidence, population,
                                   frame.status[:, LOAD], frame.reports, disbelieved, frame.shifted,
                                   frame_cycle(frame, slot) if evidence.cycles else None, credit)
        features = physics.features()
        if evidence.shifts:  # the head reads each load as far as its last fall is believed
            credited = status.copy()
            credited[:, LOAD] = credited_load(status[:, LOAD], collaborator, frame.shifted, frame.reports, evidence,
                                              1.0 if credit is None else credit)
            raised = np.flatnonzero((credited[:, LOAD] > status[:, LOAD])[dst])  # pairs whose candidate's load rose
            features[raised] = pair_physics(status, credited, frame.profile[:, :2], params, src[raised],
                                            dst[raised]).features()
        t_beh, step = stages.t_beh_pairs(frame.y, features, blocks, src, dst, pair_at)
        t_res = resource_trust(status[:, WILLINGNESS], status[:, COMM_OK], status[:, COMP_OK])[dst]  # per device
        voc = physics.value(params)
        if stages.transmission is not None:
            p_tr = stages.transmission[0].read(physics.distance_m, stages.transmission[1])
    return PairScores(slot, piece, version, frame.keys, frame.ids, owners, thresholds, src, dst, t_beh, t_res, voc,
                      believed, frame.profile[:, 0], step if stages.size_corrected else None,
                      evidence.size_split_bits, status[:, CPU], p_tr, stages.config.weights)


def frame_cycle(frame: DeviceFrame, slot: int) -> np.ndarray:
    """(n,) where each device's usage cycle puts its load in the slot after ``slot``
    (:func:`model.usage_cycle.cycle_deviation`), for a model that reads it; a frame of a history that keeps none is
    refused."""
    if not frame.cycle.shape[-1]:
        raise ValueError("the model reads the loads' cycles (EvidenceConfig.cycles), and this frame's history keeps "
                         "none: make the history with the model's evidence config")
    return cycle_deviation(frame.cycle, slot + 1)


def credited_evidence(frame: DeviceFrame, with_discredited: bool = False
                      ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray], np.ndarray | None]:
    """(collaborator (n, L, C), population (1, L, C)) of a frame's devices: what monitors saw, and what owners
    reported themselves weighed by their credibility (:func:`model.credibility.credibility`); (the reporting
    owners' keys (o,), sorted, their credibility (o,)); and, ``with_discredited``, what was reported of each device and
    from it and not believed (n, L, 4) (:func:`model.credibility.discredited`; else None)."""
    lams = frame.collaborator.shape[1]
    disbelieved = np.zeros((len(frame.keys), lams, len(DISCREDITED))) if with_discredited else None
    if not len(frame.reported):
        return frame.collaborator, frame.population, (np.zeros(0, np.int64), np.zeros(0)), disbelieved
    weight = credibility(frame.reported_pairs[:, 1], frame.reported_pairs[:, 0], frame.reported_evidence[:, -1, :],
                         frame.reported_monitored)  # judged at the judging memory, added at the model's
    weighed = frame.reported_evidence[:, :lams] * weight[:, None, None]
    collaborator = frame.collaborator.copy()
    at, held = find(frame.keys, frame.reported_pairs[:, 0])
    np.add.at(collaborator, at[held], weighed[held])
    if with_discredited:
        owner_at, owner_held = find(frame.keys, frame.reported_pairs[:, 1])
        disbelieved = discredited(frame.reported_evidence[:, :lams], weight, np.where(held, at, -1),
                                  np.where(owner_held, owner_at, -1), len(frame.keys))
    owners, first = np.unique(frame.reported_pairs[:, 1], return_index=True)
    return collaborator, frame.population + weighed.sum(axis=0), (owners, weight[first]), disbelieved


def score_slot(stages: Stages, frame: DeviceFrame, slot: int, ranking: RankingConfig, params: SystemParams,
               model_version: str, revision: int = 0, piece: int = 0) -> SlotScores:
    """:func:`score_pairs` published as they are (no recalibration)."""
    return score_pairs(stages, frame, slot, ranking, params, revision, piece).publish(
        ranking, model_version, stages.config.clock, revision=revision)


def slot_outcomes(part: SlotPart) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A slot's observed pairs ((k,) pair keys, their T_col, their tasks, the share of those their owner reported)
    from its evidence: what the online recalibration sets against the forecasts published before it."""
    keys, increments = part.evidence["pair"]
    tasks = increments[:, N]
    reported = np.zeros(len(keys))
    reported_keys, reported_increments = part.evidence.get(REPORTED, (np.zeros(0, np.int64), np.zeros((0, N + 1))))
    order = np.argsort(keys)
    at, hit = find(keys[order], reported_keys)
    reported[order[at[hit]]] = reported_increments[hit, N]
    return keys, increments[:, W] / np.maximum(tasks, 1e-12), tasks, reported / np.maximum(tasks, 1e-12)


def score_log(stages: Stages, events: pa.Table, status: pa.Table | None, ranking: RankingConfig,
              params: SystemParams, model_version: str, seconds: dict[str, float] | None = None,
              online: OnlineShift | None = None, pieces: Pieces = Pieces()) -> Iterator[SlotScores]:
    """The offline scorer: every slot with events, in order, from one :class:`DeviceHistory` of all devices.

    ``online``: each slot's T_beh moved by the online level shift, as the job's ``PublishSlots`` does (the state is
    advanced in place: a later run over the next slots continues from it); None publishes the model's T_beh as it
    is. ``seconds``, when given, accumulates the time per stage: ``status``, ``slot_part`` (T_col, slot graph,
    GNN), ``frame`` (BiMamba, evidence, latest statuses), ``pairs`` (candidates, head, ranking). ``pieces``: each
    slot's pairs scored and published in that many pieces at once (:func:`score_pieces`), its records joined in piece
    order, as the job's are.
    """
    seconds = {} if seconds is None else seconds
    clocked = partial(timed, seconds)
    config = stages.config
    clock = config.clock
    history = DeviceHistory(config.evidence, clock)
    publisher = SlotPublisher(online)
    if status is not None:
        with clocked("status"):
            history.add_status(*status_arrays(status))
    slot_of = clock.slot_of(events["event_time_ms"].to_numpy())
    if len(slot_of) and slot_of.min() < 0:
        raise ValueError(f"events: slot {slot_of.min()} lies before the clock's origin {clock.origin_ms} ms")
    order = np.argsort(slot_of, kind="stable")
    slots, starts = np.unique(slot_of[order], return_index=True)
    with ThreadPoolExecutor(min(pieces.count, os.cpu_count() or 1)) if pieces.count > 1 else nullcontext() as pool:
        for slot, rows in zip(slots.tolist(), np.split(order, starts[1:])):
            with clocked("slot_part"):
                part = slot_part(stages, events.take(rows), slot)
                history.add_part(part)
                history.fold(slot)  # offline, a slot is final once read
            with clocked("frame"):
                frame = history.frame(stages, slot, ranking)
            with clocked("pairs"):
                publisher.add_outcomes(slot, 0, slot_outcomes(part))
                publisher.add_pieces(score_pieces(stages, frame, slot, ranking, params, pieces, pool))
                published = publisher.publish(slot, ranking, model_version, clock, 0,
                                              map if pool is None else pool.map)
            yield SlotScores.join(published) if len(published) > 1 else published[0]
            window = window_read(stages)
            history.prune(slot - slots_read_back(window, ranking) + 1, status_horizon(clock, slot, window))


def score_pieces(stages: Stages, frame: DeviceFrame, slot: int, ranking: RankingConfig, params: SystemParams,
                 pieces: Pieces, pool: ThreadPoolExecutor | None) -> list[PairScores]:
    """:func:`score_pairs` of each piece of ``frame`` (:meth:`DeviceFrame.pieces`) on ``pool``'s threads (None: one
    piece): numpy and PyTorch let go of the interpreter in their work, so pieces scored together use the machine's
    cores, as the job's pieces use its workers. Each thread cuts its own piece out of the frame."""
    if pool is None:
        return [score_pairs(stages, frame, slot, ranking, params)]

    def scored(piece: int, rows: tuple[np.ndarray, np.ndarray]) -> PairScores:
        return score_pairs(stages, frame.select(*rows), slot, ranking, params, piece=piece)

    return list(pool.map(scored, range(pieces.count),
                         frame.piece_rows(pieces, ranking.range_m, stages.config.evidence.identity_m)))
