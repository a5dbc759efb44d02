"""Slot graphs: the paper's T_col edges per time slot, built vectorized from Arrow tables.

In slot s there is an edge i -> j when collaborator j served owner i; its
weight T_col(i, j) is the mean over their tasks in that slot of
``a1 * p_tr + a2 * p_com`` (the two outcome flags), or of the observed
``reliability`` for graded logs. The same function serves the offline path
(whole files) and the streaming path (one slot's batch).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from model.config import SlotClock, TrustWeights
from model.trust import collaboration_weight

EDGES_SCHEMA = pa.schema([
    pa.field("slot", pa.int64(), nullable=False),
    pa.field("owner", pa.string(), nullable=False),
    pa.field("collaborator", pa.string(), nullable=False),
    pa.field("t_col", pa.float64(), nullable=False),
    pa.field("tasks", pa.int64(), nullable=False),
    pa.field("offset", pa.float64(), nullable=False),  # mean position of the tasks within the slot, [0, 1)
])


def task_weight(events: pa.Table, weights: TrustWeights) -> np.ndarray:
    """a1 * tr + a2 * com per event, or the graded reliability where the flags are null."""

    def floats(name: str) -> np.ndarray:
        return pc.cast(events[name], pa.float64()).to_numpy(zero_copy_only=False)  # nulls -> NaN

    flags = collaboration_weight(floats("tr_success"), floats("com_success"), weights)
    return np.where(np.isnan(flags), floats("reliability"), flags)


def slot_edges(events: pa.Table, clock: SlotClock, weights: TrustWeights) -> pa.Table:
    """One row per (slot, owner, collaborator) with T_col, the task count and the mean in-slot offset."""
    times = events["event_time_ms"].to_numpy()
    slots = clock.slot_of(times)
    offsets = (times - clock.start_ms(slots)) / clock.slot_ms
    table = pa.table({"slot": slots, "owner": events["owner"], "collaborator": events["collaborator"],
                      "w": task_weight(events, weights), "offset": offsets})
    grouped = table.group_by(["slot", "owner", "collaborator"]).aggregate(
        [("w", "mean"), ("w", "count"), ("offset", "mean")])
    out = pa.table({"slot": grouped["slot"], "owner": grouped["owner"], "collaborator": grouped["collaborator"],
                    "t_col": grouped["w_mean"], "tasks": grouped["w_count"], "offset": grouped["offset_mean"]},
                   schema=EDGES_SCHEMA)
    return out.sort_by([("slot", "ascending"), ("owner", "ascending"), ("collaborator", "ascending")])


@dataclass(frozen=True)
class DeviceIndex:
    """A stable device id -> row mapping (sorted ids), saved with a model."""

    ids: tuple[str, ...]

    @classmethod
    def from_edges(cls, *tables: pa.Table) -> "DeviceIndex":
        names = set()
        for table in tables:
            names.update(pc.unique(table["owner"]).to_pylist())
            names.update(pc.unique(table["collaborator"]).to_pylist())
        return cls(tuple(sorted(names)))

    def __len__(self) -> int:
        return len(self.ids)

    def lookup(self, names: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Rows of the given ids; -1 for ids the index does not know."""
        rows = pc.index_in(names, value_set=pa.array(self.ids, pa.string()))
        return pc.fill_null(rows, -1).to_numpy().astype(np.int64)


@dataclass(frozen=True)
class SlotGraph:
    """One slot's edges as integer arrays over a DeviceIndex (src = owner, dst = collaborator)."""

    slot: int
    src: np.ndarray  # (E,)
    dst: np.ndarray  # (E,)
    t_col: np.ndarray  # (E,)
    offset: np.ndarray  # (E,)

    @property
    def active(self) -> np.ndarray:
        """Devices with any edge in the slot."""
        return np.unique(np.concatenate([self.src, self.dst]))


def slot_graphs(edges: pa.Table, index: DeviceIndex) -> dict[int, SlotGraph]:
    """Per-slot graphs; edges touching devices outside the index are left out."""
    src, dst = index.lookup(edges["owner"]), index.lookup(edges["collaborator"])
    known = (src >= 0) & (dst >= 0)
    slots = edges["slot"].to_numpy()[known]
    src, dst = src[known], dst[known]
    t_col, offset = edges["t_col"].to_numpy()[known], edges["offset"].to_numpy()[known]
    graphs = {}
    bounds = np.flatnonzero(np.diff(slots)) + 1  # edges are sorted by slot
    for part in np.split(np.arange(len(slots)), bounds):
        if len(part):
            s = int(slots[part[0]])
            graphs[s] = SlotGraph(s, src[part], dst[part], t_col[part], offset[part])
    return graphs
