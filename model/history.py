"""A collaboration log as BM sees it: devices, per-slot graphs, statuses and forgetting-weighted evidence.

Positions are relative slots ``0 .. T-1`` counted from ``first_slot`` under the model's
:class:`SlotClock`: by default the first slot that holds data (so a split "the last 20 % of slots"
means the last 20 % of the data, wherever the clock's origin lies). A device's window is the last
S slots, idle slots included (its explicit idle embedding); only slots before the history's start
are padding, never data. This depends on no per-device registry, so the streaming job rebuilds
the same windows from the last S slots of the log.

What a pair head reads about a pair at the end of relative slot ``e`` (:meth:`History.pair_inputs`):
the physics from both devices' latest statuses before the slot's end (:mod:`model.context`) and
the evidence of j, i and the pair up to and including slot ``e`` (:mod:`model.evidence`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from model.config import SlotClock, SystemParams, TrustWeights
from model.context import PHYSICS_COLUMNS, pair_physics
from model.credibility import credibility, discredited
from model.evidence import (DISCREDITED, NEVER, POPULATION, REPORTED, REPORTS, SHIFT_ROLES, SHIFTED, STATE_ROLES,
                            EvidenceConfig, EvidenceTrack, channels_of, credited_load, empty_state, fall_age,
                            fall_credit, fall_pool, pair_evidence_features, report_increments, role_increments,
                            role_lams, verified_cpu, with_status)
from model.graphs import DeviceIndex, SlotGraph, slot_edges, slot_graphs
from model.identity import heard_slots, identity_groups, pooled
from model.shift import watch
from model.status import CPU, LOAD, TELEMETRY, X, Y, StatusLog, status_values, telemetry_of
from model.usage_cycle import CYCLE, cycle_deviation, cycle_increments


@dataclass(frozen=True)
class Credited:
    """What owners reported themselves as of one slot, weighed by their credibility (:mod:`model.credibility`)."""

    collaborator: np.ndarray  # (n, L, C) per device as collaborator
    population: np.ndarray  # (L, C)
    served: np.ndarray  # (n,) slots since an owner last reported of each device (NEVER: none did)
    credibility: np.ndarray  # (n,) each device's as a reporter (1: it reported nothing, or is believed)
    discredited: np.ndarray  # (n, L, 4) per device, what was reported of it and from it and not believed
    #                          (model.credibility.discredited)


@dataclass(frozen=True)
class History:
    index: DeviceIndex
    first_slot: int  # absolute slot index of relative position 0
    graphs: tuple[SlotGraph | None, ...]  # per relative slot; None where no edge
    status: StatusLog | None = None  # keys are index rows
    clock: SlotClock = field(default_factory=SlotClock)
    _tracks: dict = field(default_factory=dict, compare=False, repr=False)  # EvidenceConfig -> tracks
    _credited: dict = field(default_factory=dict, compare=False, repr=False)  # (EvidenceConfig, slot) -> credited
    _groups: dict = field(default_factory=dict, compare=False, repr=False)  # (radii, slot) -> model.identity groups
    _falls: dict = field(default_factory=dict, compare=False, repr=False)  # (EvidenceConfig, slot) -> falls by age

    @classmethod
    def from_events(cls, events: pa.Table, clock: SlotClock, weights: TrustWeights,
                    index: DeviceIndex | None = None, first_slot: int | None = None,
                    status: pa.Table | None = None) -> "History":
        """The log's history; ``status`` (DeviceStatus rows) gives the pairs' physics."""
        history = cls.from_edges(slot_edges(events, clock, weights), index, first_slot)
        log = None
        if status is not None:
            rows = history.index.lookup(status["device"])
            known = rows >= 0
            log = StatusLog(rows[known], status["time_ms"].to_numpy()[known], status_values(status)[known])
        return cls(history.index, history.first_slot, history.graphs, log, clock)

    @classmethod
    def from_edges(cls, edges: pa.Table, index: DeviceIndex | None = None,
                   first_slot: int | None = None) -> "History":
        if edges.num_rows == 0:
            raise ValueError("events: no collaboration in the log")
        index = index or DeviceIndex.from_edges(edges)
        by_slot = slot_graphs(edges, index)
        start = min(by_slot) if first_slot is None else first_slot
        if min(by_slot) < start:
            raise ValueError(f"events: slot {min(by_slot)} lies before the history's first slot {start}")
        if start < 0:
            raise ValueError(f"events: slot {start} lies before the clock's origin")
        graphs = tuple(by_slot.get(start + k) for k in range(max(by_slot) - start + 1))
        return cls(index, start, graphs)

    @property
    def slots(self) -> int:
        return len(self.graphs)

    @property
    def has_flags(self) -> bool:
        """Whether any task carries the tr/com flags (else the outcomes are graded)."""
        return any(g is not None and g.flagged.any() for g in self.graphs)

    def windows(self, devices: np.ndarray, end: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
        """Relative slots of each device's history window ending at ``end`` (inclusive), right-padded.

        Returns (slots (P, window) with padding repeating the last slot, lengths (P,)): the last
        ``window`` slots, or all since the history's start when fewer.
        """
        start = np.maximum(end - window + 1, 0)
        lengths = end - start + 1
        slots = np.minimum(start[:, None] + np.arange(window), end[:, None])
        return slots, lengths

    def telemetry(self, devices: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """(*slots.shape, TELEMETRY) what each device reported by the end of each relative slot (``devices``
        broadcast against ``slots``): its latest status's load and whether it reported one."""
        devices = np.broadcast_to(np.asarray(devices)[..., None] if np.ndim(devices) < np.ndim(slots) else devices,
                                  np.shape(slots))
        if self.status is None:
            return np.zeros((*np.shape(slots), len(TELEMETRY)), np.float32)
        before = self.clock.end_ms(self.first_slot + np.asarray(slots).ravel())
        return telemetry_of(self.status.latest_load(devices.ravel(), before)).reshape(*np.shape(slots), len(TELEMETRY))

    def tracks(self, config: EvidenceConfig) -> dict[str, EvidenceTrack]:
        """The evidence of every role after each slot with tasks, every device's :data:`REPORTS` at the same slots,
        with ``config.shifts`` where its load shifted (:mod:`model.shift`) and with ``config.cycles`` its loads'
        harmonic sums (:mod:`model.usage_cycle`; computed once per config)."""
        key = replace(config, speed_gap=None)  # how claims are judged changes no sum
        if key not in self._tracks:
            n = len(self.index)
            updates: dict[str, list] = {role: [] for role in STATE_ROLES}
            devices = np.arange(n)
            live = {role: empty_state(role, config.lams) for role in (REPORTS, *SHIFT_ROLES, CYCLE)}  # as they go
            for t, graph in enumerate(self.graphs):
                if graph is not None and len(graph.src):
                    load = self.load(devices, np.full(n, t))  # every device's latest reported load by the slot's end
                    cpu = self.claimed_cpu(devices, np.full(n, t))
                    fitted = config.cycles and self.status is not None
                    if fitted:  # the cycles' sums through this slot's reports
                        reported, sums = cycle_increments(devices, load, self.first_slot + t)
                        updates[CYCLE].append((t, reported, sums))
                        live[CYCLE].update(reported, t, sums)
                    slot_increments = role_increments(graph, n, config)
                    for role, (keys, increments) in slot_increments.items():
                        if role in ("collaborator", REPORTED):  # the loads and CPUs its collaborators had reported,
                            at = keys % n if role == REPORTED else keys  # and where their cycles put their loads
                            cycle = cycle_deviation(live[CYCLE].query(at, t)[0], self.first_slot + t) if fitted \
                                else None
                            increments = with_status(increments, load[at], cpu[at], cycle)
                        updates[role].append((t, keys, increments))
                    if self.status is not None:
                        reported, loads = report_increments(devices, load)
                        updates[REPORTS].append((t, reported, loads))
                        if config.shifts:  # each device's load against its level before this slot's report
                            before = live[REPORTS].query(reported, t)[0]
                            for role, update in watch(live, t, reported, load[reported], before,
                                                      *slot_increments["collaborator"], config).items():
                                updates[role].append((t, *update))
                            live[REPORTS].update(reported, t, loads)
            self._tracks[key] = {role: EvidenceTrack.record(role_lams(role, config.lams), updates[role],
                                                            channels_of(role))
                                 for role in STATE_ROLES}
        return self._tracks[key]

    def pair_evidence(self, src: np.ndarray, dst: np.ndarray, end: np.ndarray, config: EvidenceConfig
                      ) -> np.ndarray:
        """(P, F) evidence features of owner ``src`` about collaborator ``dst`` as of the end of slot ``end``."""
        tracks = self.tracks(config)
        collaborator, since = self.collaborator_sums(dst, end, config)
        owner, _ = tracks["owner"].query(src, end)
        pair, _ = tracks["pair"].query(src * len(self.index) + dst, end)
        population, _ = tracks["population"].query(np.full(len(src), POPULATION), end)
        reports, _ = tracks[REPORTS].query(dst, end)
        shifted = tracks[SHIFTED].query(dst, end)[0] if config.shifts else None
        cycle = cycle_deviation(tracks[CYCLE].query(dst, end)[0], self.first_slot + end + 1) if config.cycles else None
        end = np.broadcast_to(end, np.shape(dst))
        discredited = np.zeros((len(dst), len(config.lams), len(DISCREDITED))) if config.discredited else None
        credit = self.fall_credits(shifted, end, config) if config.credits_falls else None
        for slot in np.unique(end):
            rows = end == slot
            if len(tracks[REPORTED].keys):  # what owners reported themselves, weighed by their credibility then
                credited = self.credited(config, int(slot))
                population[rows] += credited.population
                if discredited is not None:
                    discredited[rows] = self.together(config, int(slot), credited.discredited)[dst[rows]]
        return pair_evidence_features(collaborator, owner, pair, since, config, population,
                                      self.load(dst, end), reports=reports, discredited=discredited, shifted=shifted,
                                      cycle=cycle, credit=credit)

    def fall_credits(self, shifted: np.ndarray, end: np.ndarray, config: EvidenceConfig) -> np.ndarray:
        """(P,) how far each device's last fall is read (:func:`model.evidence.fall_credit`), from its
        :data:`SHIFTED` sums (P, L, 4) as of the end of its relative slot ``end`` (P,)."""
        credit = np.ones(len(end))
        for slot in np.unique(end):
            rows = end == slot
            credit[rows] = fall_credit(self.falls(config, int(slot)), fall_age(shifted[rows], config.lams))
        return credit

    def falls(self, config: EvidenceConfig, slot: int) -> np.ndarray:
        """(FALL_AGES, 3) the fleet's falls by age as of the end of relative slot ``slot``
        (:func:`model.evidence.fall_pool`, of what monitors saw of every device, as a streaming shard pools its own;
        cached)."""
        key = (config, slot)
        if key not in self._falls:
            devices = np.arange(len(self.index))
            tracks = self.tracks(config)
            self._falls[key] = fall_pool(tracks["collaborator"].query(devices, slot)[0],
                                         tracks[SHIFTED].query(devices, slot)[0],
                                         tracks[REPORTS].query(devices, slot)[0], config)
        return self._falls[key]

    def collaborator_sums(self, dst: np.ndarray, end: np.ndarray, config: EvidenceConfig
                          ) -> tuple[np.ndarray, np.ndarray]:
        """((P, L, C) sums of each ``dst`` as collaborator as of the end of slot ``end``, slots since it last served):
        what monitors saw, what owners reported weighed by their credibility then, and its ids judged as one."""
        tracks = self.tracks(config)
        collaborator, since = tracks["collaborator"].query(dst, end)
        end = np.broadcast_to(end, np.shape(dst))
        for slot in np.unique(end):
            rows = end == slot
            if len(tracks[REPORTED].keys):
                credited = self.credited(config, int(slot))
                collaborator[rows] += credited.collaborator[dst[rows]]
                since[rows] = np.minimum(since[rows], credited.served[dst[rows]])
            together = self.judged_together(config, int(slot))
            if together is not None:
                collaborator[rows], since[rows] = together[0][dst[rows]], together[1][dst[rows]]
        return collaborator, since

    def identity_group(self, config: EvidenceConfig, slot: int) -> np.ndarray | None:
        """(n,) the group of each id judged as one device through relative slot ``slot`` (at one place, or one after
        another: :mod:`model.identity`); None where every id is judged apart (no statuses, no radius, or no two ids
        linked)."""
        if self.status is None or (config.colocation_m is None and config.succession_m is None
                                   and config.poor_succession_m is None):
            return None
        radii = (config.colocation_m, config.succession_m, config.succession_slots)
        sums = replace(config, speed_gap=None)  # what makes the sums a poor record is read from (:meth:`tracks`)
        key = (sums if config.poor_succession_m is not None else radii, slot)
        if key not in self._groups:
            end = int(self.clock.end_ms(self.first_slot + slot))
            status, heard_ms = self.status.heard(np.arange(len(self.index)), end)
            first, last = heard_slots(heard_ms[:, 0], heard_ms[:, 1], self.clock)
            records = None
            if config.poor_succession_m is not None:
                population = self.tracks(config)["population"].query(np.array([POPULATION]), slot)[0][0]
                if len(self.tracks(config)[REPORTED].keys):
                    population = population + self.credited(config, slot).population
                records = (self.credited_collaborator(config, slot)[0], population)
            self._groups[key] = identity_groups(status[:, [X, Y]], first, last, config.colocation_m,
                                                config.succession_m, config.succession_slots, records,
                                                config.poor_succession_m)
        return self._groups[key]

    def together(self, config: EvidenceConfig, slot: int, sums: np.ndarray) -> np.ndarray:
        """Every device's ``sums`` (n, ...) summed over the ids judged as one device through relative slot ``slot``
        (:meth:`identity_group`)."""
        group = self.identity_group(config, slot)
        return sums if group is None else pooled(sums, np.zeros(len(sums), np.int64), group)[0]

    def judged_together(self, config: EvidenceConfig, slot: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Every device's (evidence as collaborator (n, L, C), slots since it served (n,)) through relative slot
        ``slot``, credited reports included, pooled over the ids judged as one device then
        (:meth:`identity_group`); None where every id is judged apart."""
        group = self.identity_group(config, slot)
        return None if group is None else pooled(*self.credited_collaborator(config, slot), group)

    def credited_collaborator(self, config: EvidenceConfig, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """Every id's (evidence as collaborator (n, L, C), slots since it served (n,)) through relative slot
        ``slot``, what owners reported of it weighed by their credibility included; each id apart."""
        tracks = self.tracks(config)
        collaborator, since = tracks["collaborator"].query(np.arange(len(self.index)), slot)
        if len(tracks[REPORTED].keys):
            credited = self.credited(config, slot)
            collaborator, since = collaborator + credited.collaborator, np.minimum(since, credited.served)
        return collaborator, since

    def credited(self, config: EvidenceConfig, slot: int) -> Credited:
        """What owners reported themselves through relative slot ``slot``, weighed by their credibility as of then
        (:mod:`model.credibility`; cached)."""
        key = (replace(config, speed_gap=None), slot)
        if key not in self._credited:
            n = len(self.index)
            tracks = self.tracks(config)
            pairs = np.unique(tracks[REPORTED].keys)  # a key per update: each pair once
            reports, since = tracks[REPORTED].query(pairs, slot)
            owners, collaborators = pairs // n, pairs % n
            monitored, _ = tracks["collaborator"].query(collaborators, slot)
            weight = credibility(owners, collaborators, reports[:, -1, :], monitored[:, -1, :])  # judged all along
            weighed = reports[:, :len(config.lams)] * weight[:, None, None]
            out = Credited(np.zeros((n, *weighed.shape[1:])), weighed.sum(axis=0), np.full(n, NEVER, np.int64),
                           np.ones(n), discredited(reports[:, :len(config.lams)], weight, collaborators, owners, n))
            np.add.at(out.collaborator, collaborators, weighed)
            np.minimum.at(out.served, collaborators, since)
            out.credibility[owners] = weight
            self._credited[key] = out
        return self._credited[key]

    def load(self, devices: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """(P,) each device's latest reported load by the end of its relative slot (NaN: none)."""
        if self.status is None:
            return np.full(len(devices), np.nan)
        return self.status.latest_load(devices, self.clock.end_ms(self.first_slot + np.asarray(slots)))

    def loads_reported(self, slot: int) -> bool:
        """Whether any device had reported its load by the end of relative ``slot`` (telemetry)."""
        if self.status is None:
            return False
        sent = self.status.times < self.clock.end_ms(self.first_slot + slot)
        return bool(np.isfinite(self.status.values[sent, LOAD]).any())

    def claimed_cpu(self, devices: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """(P,) each device's latest claimed CPU by the end of its relative slot (NaN: none)."""
        if self.status is None:
            return np.full(len(devices), np.nan)
        return self.status.latest_value(devices, self.clock.end_ms(self.first_slot + np.asarray(slots)), CPU)

    def pair_physics(self, src: np.ndarray, dst: np.ndarray, end: np.ndarray, profile: np.ndarray,
                     params: SystemParams, claims: EvidenceConfig | None = None) -> np.ndarray:
        """(P, 5) raw physics of each pair from the statuses before the end of slot ``end`` (NaN without them, but
        for the task's size, which the profile gives); with ``claims``, each device's CPU as far as its tasks' times
        by then bear its claim out (:func:`model.evidence.verified_cpu`), and the candidate's load raised by the part
        of its last fall that is doubted (:func:`model.evidence.credited_load`)."""
        if self.status is None:
            physics = np.full((len(src), len(PHYSICS_COLUMNS)), np.nan, np.float32)
            physics[:, PHYSICS_COLUMNS.index("task_size_bits")] = profile[:, 0]
            return physics
        end = np.broadcast_to(np.asarray(end), np.shape(src))
        before = self.clock.end_ms(self.first_slot + end)
        owner, candidate = self.status.latest(src, before), self.status.latest(dst, before)
        if claims is not None and (claims.speed_gap is not None or claims.shifts):  # both sides' sums in one read
            sums = self.collaborator_sums(np.concatenate([src, dst]), np.concatenate([end, end]), claims)[0]
            owner[:, CPU] = verified_cpu(owner[:, CPU], sums[:len(src)], claims)
            candidate[:, CPU] = verified_cpu(candidate[:, CPU], sums[len(src):], claims)
            if claims.shifts:  # the candidate's load as far as its last fall is believed
                tracks = self.tracks(claims)
                shifted, reports = tracks[SHIFTED].query(dst, end)[0], tracks[REPORTS].query(dst, end)[0]
                credit = self.fall_credits(shifted, end, claims) if claims.credits_falls else 1.0
                candidate[:, LOAD] = credited_load(candidate[:, LOAD], sums[len(src):], shifted, reports, claims,
                                                   credit)
        return pair_physics(owner, candidate, profile, params).features()
