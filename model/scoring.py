"""Scoring a slot: the one implementation behind ``trustbeam score`` (offline) and ``trustbeam run`` (Beam).

The path, per closed slot s:

1. :func:`slot_part`: the slot's events (deduplicated by ``event_id``) -> T_col edges -> the slot
   graph -> GNN embeddings of the active devices, plus each owner's latest task in the slot.
2. :class:`DeviceHistory`: a set of devices' sparse slot embeddings, task profiles and statuses. The
   offline scorer holds one for all devices; the pipeline holds one per device shard in Beam state.
   :meth:`DeviceHistory.frame` gives, for slot s, each device's long-term embedding Y (the sequence
   encoder over its last S slots, idle slots as the learned idle embedding), its latest status
   before the slot's end, and its task profile if it owned a task in the last R slots.
3. :func:`score_slot`: frames of all devices -> T_beh = head(Y_i (+) Y_j) for each recent owner i
   against its candidates j -> T = T_beh * T_res -> trust scores and rankings (T >= theta, then the
   highest VoC for the owner's task), as the wire records of :mod:`schemas`.

Glossary: Y the long-term embedding, T_beh/T_res/T the paper's trusts, theta the task's trust
threshold, V (``voc``) the value of task completion (eqs. 2-9, :mod:`model.physics`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from model import physics
from model.config import RankingConfig, SlotClock, SystemParams
from model.graphs import DeviceIndex, slot_edges, slot_graphs
from model.stages import Stages
from model.trust import resource_trust
from schemas import CollaboratorRanking, RankedCandidate, TrustScore

STATUS_COLUMNS = ("cpu_hz", "tx_w", "rx_w", "x_m", "y_m", "willingness", "comm_ok", "comp_ok")
PROFILE_COLUMNS = ("task_size_bits", "density_cycles_per_bit", "trust_threshold")


@dataclass
class SlotPart:
    """One slot's contribution for a set of devices (sorted rows), as plain numpy arrays."""

    slot: int
    active: np.ndarray  # (a,) device rows active in the slot
    embeddings: np.ndarray  # (a, d) their GNN slot embeddings
    owners: np.ndarray  # (o,) device rows that owned a task in the slot
    profile: np.ndarray  # (o, 4): time of the latest task, then PROFILE_COLUMNS (NaN where absent)

    def select(self, rows: np.ndarray) -> "SlotPart":
        """The part restricted to the devices in ``rows`` (sorted)."""
        a, o = np.isin(self.active, rows), np.isin(self.owners, rows)
        return SlotPart(self.slot, self.active[a], self.embeddings[a], self.owners[o], self.profile[o])


def slot_part(stages: Stages, index: DeviceIndex, events: pa.Table, slot: int) -> SlotPart:
    """Embeddings and owner profiles of one slot from its valid events (unknown devices left out)."""
    config = stages.config
    events = dedup(events)
    known = (index.lookup(events["owner"]) >= 0) & (index.lookup(events["collaborator"]) >= 0)
    events = events.filter(pa.array(known))
    d = config.gnn.out_dim
    if events.num_rows == 0:
        empty = np.zeros(0, dtype=np.int64)
        return SlotPart(slot, empty, np.zeros((0, d), np.float32), empty, np.zeros((0, 4)))
    graph = slot_graphs(slot_edges(events, config.clock, config.weights), index)[slot]
    active, embeddings = stages.slot_embeddings(graph)  # (a,), (a, d)
    latest = events.sort_by([("owner", "ascending"), ("event_time_ms", "descending"), ("event_id", "descending")])
    owner_ids = latest["owner"].to_numpy(zero_copy_only=False)
    first = np.flatnonzero(np.r_[True, owner_ids[1:] != owner_ids[:-1]])  # each owner's latest task
    columns = [latest["event_time_ms"].to_numpy()[first].astype(np.float64)]
    columns += [pc.fill_null(latest[c], np.nan).to_numpy()[first] for c in PROFILE_COLUMNS]
    owners = index.lookup(pa.array(owner_ids[first]))
    order = np.argsort(owners)
    return SlotPart(slot, active, embeddings, owners[order],
                    np.stack(columns, axis=1)[order])


def dedup(events: pa.Table) -> pa.Table:
    """The first occurrence of each ``event_id``."""
    ids = events["event_id"].to_numpy(zero_copy_only=False)
    _, first = np.unique(ids, return_index=True)
    return events.take(np.sort(first)) if len(first) < len(ids) else events


@dataclass
class DeviceFrame:
    """One slot's view of a set of devices, ready to score (rows sorted)."""

    rows: np.ndarray  # (n,)
    y: np.ndarray  # (n, d) long-term embeddings
    status: np.ndarray  # (n, 8) STATUS_COLUMNS, NaN where no status is known
    profile: np.ndarray  # (n, 3) PROFILE_COLUMNS of a recent owner's latest task, NaN for non-owners
    recent_owner: np.ndarray  # (n,) bool

    @classmethod
    def concat(cls, frames: list["DeviceFrame"]) -> "DeviceFrame":
        joined = cls(*(np.concatenate([getattr(f, k.name) for f in frames]) for k in fields(cls)))
        order = np.argsort(joined.rows)
        return cls(*(getattr(joined, k.name)[order] for k in fields(cls)))


@dataclass
class DeviceHistory:
    """Sparse history of a set of devices (``rows``): what :meth:`frame` needs for any slot.

    Embeddings are kept per slot for active devices only; a device idle in a slot reads the model's
    idle embedding. Statuses are kept per device until superseded. Only numpy, so Beam can pickle it.
    """

    rows: np.ndarray  # (n,) sorted device rows this history covers
    parts: dict[int, SlotPart] = field(default_factory=dict)
    status_times: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (m,)
    status_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (m,)
    status_values: np.ndarray = field(default_factory=lambda: np.zeros((0, len(STATUS_COLUMNS))))  # (m, 8)

    def add_part(self, part: SlotPart) -> None:
        self.parts[part.slot] = part

    def add_status(self, rows: np.ndarray, times: np.ndarray, values: np.ndarray) -> None:
        keep = np.isin(rows, self.rows)
        self.status_rows = np.concatenate([self.status_rows, rows[keep]])
        self.status_times = np.concatenate([self.status_times, times[keep]])
        self.status_values = np.concatenate([self.status_values, values[keep]])

    def prune(self, before_slot: int, status_before_ms: int) -> None:
        """Forget slot parts before ``before_slot`` and statuses superseded before ``status_before_ms``."""
        self.parts = {s: p for s, p in self.parts.items() if s >= before_slot}
        old = self.status_times < status_before_ms
        newest_old = _latest(self.status_rows, self.status_times, old)
        keep = ~old
        keep[newest_old] = True
        self.status_rows, self.status_times = self.status_rows[keep], self.status_times[keep]
        self.status_values = self.status_values[keep]

    def frame(self, stages: Stages, slot: int, clock: SlotClock, ranking: RankingConfig) -> DeviceFrame:
        sequences, lengths = self.sequences(stages, slot)
        y = stages.long_term(sequences, lengths)  # (n, d)
        status = np.full((len(self.rows), len(STATUS_COLUMNS)), np.nan)
        latest = _latest(self.status_rows, self.status_times, self.status_times < int(clock.end_ms(slot)))
        status[np.searchsorted(self.rows, self.status_rows[latest])] = self.status_values[latest]
        profile = np.full((len(self.rows), 1 + len(PROFILE_COLUMNS)), np.nan)
        profile[:, 0] = -np.inf
        for s in range(slot - ranking.owner_slots + 1, slot + 1):
            part = self.parts.get(s)
            if part is None or not len(part.owners):
                continue
            at = np.searchsorted(self.rows, part.owners)
            newer = part.profile[:, 0] > profile[at, 0]
            profile[at[newer]] = part.profile[newer]
        recent = np.isfinite(profile[:, 0])
        return DeviceFrame(self.rows, y, status, profile[:, 1:], recent)

    def sequences(self, stages: Stages, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """(n, S, d) slot embeddings over [max(slot - S + 1, 0), slot], right-padded by the last; (n,) lengths."""
        window = stages.config.window
        start = max(slot - window + 1, 0)
        length = slot - start + 1
        idle = stages.idle
        out = np.broadcast_to(idle, (len(self.rows), window, len(idle))).copy()
        for k in range(length):
            part = self.parts.get(start + k)
            if part is None or not len(part.active):
                continue
            at = np.clip(np.searchsorted(part.active, self.rows), 0, len(part.active) - 1)
            hit = part.active[at] == self.rows
            out[hit, k] = part.embeddings[at[hit]]
        out[:, length:] = out[:, length - 1:length]
        return out, np.full(len(self.rows), length, dtype=np.int64)


def _latest(rows: np.ndarray, times: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Indices of each row's latest entry among ``mask`` (ties: the later-added entry)."""
    candidates = np.flatnonzero(mask)
    order = candidates[np.lexsort((candidates, times[candidates], rows[candidates]))]
    last = np.r_[rows[order][1:] != rows[order][:-1], True] if len(order) else np.zeros(0, bool)
    return order[last]


def status_arrays(index: DeviceIndex, status: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, times, values (m, 8)) of the status rows whose device the index knows."""
    rows = index.lookup(status["device"])
    known = rows >= 0
    values = np.stack([pc.cast(status[c], pa.float64()).to_numpy() for c in STATUS_COLUMNS], axis=1)
    return rows[known], status["time_ms"].to_numpy()[known], values[known]


@dataclass(frozen=True)
class SlotScores:
    """What a slot publishes: trust scores and rankings (wire records), keyed by owner when sent."""

    slot: int
    scores: list[TrustScore]
    rankings: list[CollaboratorRanking]


def score_slot(stages: Stages, index: DeviceIndex, frame: DeviceFrame, slot: int, ranking: RankingConfig,
               params: SystemParams, model_version: str, is_update: bool = False) -> SlotScores:
    """Score each recent owner against its candidates and rank them by the paper's rule."""
    clock = stages.config.clock
    start_ms, end_ms = int(clock.start_ms(slot)), int(clock.end_ms(slot))
    owners = np.flatnonzero(frame.recent_owner)
    known = np.flatnonzero(~np.isnan(frame.status[:, 0]))
    src, dst = np.repeat(owners, len(known)), np.tile(known, len(owners))  # positions in the frame
    status_i, status_j = frame.status[src], frame.status[dst]
    distance = np.hypot(status_i[:, 3] - status_j[:, 3], status_i[:, 4] - status_j[:, 4])
    keep = (src != dst) & ~np.isnan(distance)
    if ranking.range_m is not None:
        keep &= distance <= ranking.range_m
    src, dst, distance, status_i, status_j = src[keep], dst[keep], distance[keep], status_i[keep], status_j[keep]
    t_beh = stages.t_beh(frame.y[src], frame.y[dst])
    t_res = resource_trust(status_j[:, 5], status_j[:, 6], status_j[:, 7])
    trust = np.clip(t_beh * t_res, 0.0, 1.0)
    size, density, theta = (frame.profile[src, k] for k in range(3))
    voc = physics.value_of_completion(
        physics.offload(size, density, distance, status_i[:, 1], status_j[:, 2], status_j[:, 0], params),
        physics.computation(size, density, status_i[:, 0], params), params)
    voc = np.clip(np.nan_to_num(voc, nan=0.0), 0.0, 1.0)
    theta = np.where(np.isnan(theta), ranking.default_threshold, theta)
    ids = index.ids
    scores: list[TrustScore] = []
    rankings: list[CollaboratorRanking] = []
    bounds = np.flatnonzero(np.r_[True, src[1:] != src[:-1]]) if len(src) else np.zeros(0, np.int64)
    for begin, end in zip(bounds, np.r_[bounds[1:], len(src)]):
        owner = ids[frame.rows[src[begin]]]
        part = np.arange(begin, end)
        collab = frame.rows[dst[part]]
        by_trust = part[np.lexsort((collab, -trust[part]))][: ranking.scores_per_owner]
        scores += [TrustScore(owner=owner, collaborator=ids[frame.rows[dst[p]]], slot=slot, slot_start_ms=start_ms,
                              slot_end_ms=end_ms, t_beh=float(t_beh[p]), t_res=float(t_res[p]),
                              trust=float(trust[p]), model_version=model_version, is_update=is_update)
                   for p in by_trust]
        eligible = part[trust[part] >= theta[begin]]
        chosen = eligible[np.lexsort((frame.rows[dst[eligible]], -trust[eligible], -voc[eligible]))][: ranking.top_k]
        rankings.append(CollaboratorRanking(
            owner=owner, slot=slot, slot_start_ms=start_ms, slot_end_ms=end_ms, threshold=float(theta[begin]),
            model_version=model_version, is_update=is_update,
            candidates=tuple(RankedCandidate(collaborator=ids[frame.rows[dst[p]]], trust=float(trust[p]),
                                             voc=float(voc[p])) for p in chosen)))
    return SlotScores(slot, scores, rankings)


def score_log(stages: Stages, index: DeviceIndex, events: pa.Table, status: pa.Table | None, ranking: RankingConfig,
              params: SystemParams, model_version: str) -> Iterator[SlotScores]:
    """The offline scorer: every slot with events, in order, from one :class:`DeviceHistory` of all devices."""
    clock = stages.config.clock
    history = DeviceHistory(np.arange(len(index)))
    if status is not None:
        history.add_status(*status_arrays(index, status))
    slot_of = clock.slot_of(events["event_time_ms"].to_numpy())
    if len(slot_of) and slot_of.min() < 0:
        raise ValueError(f"events: slot {slot_of.min()} lies before the clock's origin {clock.origin_ms} ms")
    order = np.argsort(slot_of, kind="stable")
    slots, starts = np.unique(slot_of[order], return_index=True)
    for slot, rows in zip(slots.tolist(), np.split(order, starts[1:])):
        history.add_part(slot_part(stages, index, events.take(rows), slot))
        yield score_slot(stages, index, history.frame(stages, slot, clock, ranking), slot, ranking, params,
                         model_version)
        history.prune(slot - max(stages.config.window, ranking.owner_slots) + 1, int(clock.start_ms(slot)))
