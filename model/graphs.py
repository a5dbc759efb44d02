"""Slot graphs: the paper's T_col edges per time slot, built vectorized from Arrow tables.

In slot s there is an edge i -> j when collaborator j served owner i; its
weight T_col(i, j) is the mean over their tasks in that slot of
``a1 * p_tr + a2 * p_com`` (the two outcome flags), or of the observed
``reliability`` for graded logs. Each edge also keeps its evidence (tasks, tasks
with flags, transmissions and computations that succeeded) and its tasks' mean
profile (size, density), which BM's pair head and the evidence tracks read. The
same function serves the offline path (whole files) and the streaming path (one
slot's batch).
"""

from __future__ import annotations

import hashlib
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
    pa.field("flagged", pa.int64(), nullable=False),  # tasks that carry the tr/com flags
    pa.field("tr", pa.int64(), nullable=False),  # of those, transmissions that succeeded
    pa.field("com", pa.int64(), nullable=False),  # ... and computations that succeeded
    pa.field("size_bits", pa.float64(), nullable=False),  # mean task size (NaN where none is known)
    pa.field("density", pa.float64(), nullable=False),  # mean cycles per bit (NaN where none is known)
    pa.field("time_ratio", pa.float64(), nullable=False),  # mean reported offload time / local time (NaN: none)
    pa.field("reported", pa.int64(), nullable=False),  # of the tasks, those whose outcome the owner reported itself
    pa.field("log_speed", pa.float64(), nullable=False),  # mean log(cycles / reported offload time) (NaN: none)
    pa.field("timed", pa.int64(), nullable=False),  # of the tasks, those log_speed is the mean of
])


def task_weight(events: pa.Table, weights: TrustWeights) -> np.ndarray:
    """a1 * tr + a2 * com per event, or the graded reliability where the flags are null."""

    flags = collaboration_weight(_floats(events, "tr_success"), _floats(events, "com_success"), weights)
    return np.where(np.isnan(flags), _floats(events, "reliability"), flags)


def _floats(events: pa.Table, name: str) -> np.ndarray:
    return pc.cast(events[name], pa.float64()).to_numpy(zero_copy_only=False)  # nulls -> NaN


def reported_time_ratio(events: pa.Table) -> np.ndarray:
    """Each task's reported offload time over the owner's local time (NaN where either is missing or zero)."""
    offload, local = _floats(events, "t_total_s"), _floats(events, "t_local_s")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((local > 0) & (offload > 0), offload / local, np.nan)


def reported_log_speed(events: pa.Table) -> np.ndarray:
    """Each task's log of its cycles (size x density) over its reported offload time: the speed the collaborator
    showed, transmission included (NaN where a figure is missing or not positive)."""
    cycles = _floats(events, "task_size_bits") * _floats(events, "density_cycles_per_bit")
    offload = _floats(events, "t_total_s")
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((cycles > 0) & (offload > 0), np.log(cycles / offload), np.nan)


def reported_by_owner(events: pa.Table) -> np.ndarray:
    """(m,) whether the owner itself reported each task's outcome (the ``reporter`` column names it; a log without the
    column, or a null reporter, was observed by a neutral monitor)."""
    if "reporter" not in events.column_names:
        return np.zeros(events.num_rows, bool)
    return pc.fill_null(pc.equal(events["reporter"], events["owner"]), False).to_numpy(zero_copy_only=False)


def slot_edges(events: pa.Table, clock: SlotClock, weights: TrustWeights) -> pa.Table:
    """One row per (slot, owner, collaborator): T_col, the evidence counts, the mean in-slot offset, the mean
    task profile, and what of it the owner reported itself."""
    times = events["event_time_ms"].to_numpy()
    slots = clock.slot_of(times)
    offsets = (times - clock.start_ms(slots)) / clock.slot_ms
    tr, com = _floats(events, "tr_success"), _floats(events, "com_success")
    flagged = ~np.isnan(tr)
    table = pa.table({"slot": slots, "owner": events["owner"], "collaborator": events["collaborator"],
                      "w": task_weight(events, weights), "offset": offsets, "flagged": flagged.astype(np.int64),
                      "tr": np.nan_to_num(tr).astype(np.int64), "com": np.nan_to_num(com).astype(np.int64),
                      "size": _floats(events, "task_size_bits"), "density": _floats(events, "density_cycles_per_bit"),
                      "ratio": reported_time_ratio(events), "by_owner": reported_by_owner(events).astype(np.int64),
                      "speed": pa.array(reported_log_speed(events), from_pandas=True)})  # NaN: null, not counted
    grouped = table.group_by(["slot", "owner", "collaborator"]).aggregate(
        [("w", "mean"), ("w", "count"), ("offset", "mean"), ("flagged", "sum"), ("tr", "sum"), ("com", "sum"),
         ("size", "mean"), ("density", "mean"), ("ratio", "mean"), ("by_owner", "sum"), ("speed", "mean"),
         ("speed", "count")])

    def profile(name: str) -> pa.Array:  # the mean of the known values; NaN where the edge's tasks have none
        return pc.fill_null(pc.cast(grouped[f"{name}_mean"], pa.float64()), float("nan"))

    out = pa.table({"slot": grouped["slot"], "owner": grouped["owner"], "collaborator": grouped["collaborator"],
                    "t_col": grouped["w_mean"], "tasks": grouped["w_count"], "offset": grouped["offset_mean"],
                    "flagged": grouped["flagged_sum"], "tr": grouped["tr_sum"], "com": grouped["com_sum"],
                    "size_bits": profile("size"), "density": profile("density"), "time_ratio": profile("ratio"),
                    "reported": grouped["by_owner_sum"], "log_speed": profile("speed"),
                    "timed": grouped["speed_count"]},
                   schema=EDGES_SCHEMA)
    return out.sort_by([("slot", "ascending"), ("owner", "ascending"), ("collaborator", "ascending")])


def device_keys(ids: pa.Array | pa.ChunkedArray | list[str]) -> np.ndarray:
    """(n,) int64 keys of device ids: the first 63 bits of blake2b, the same in every process and version.

    The scorer and the streaming job key devices by them, so a device the model never saw has an
    identity too (collision odds: about n^2 / 2^64, 5e-10 for 100k devices)."""
    names = ids.to_pylist() if hasattr(ids, "to_pylist") else ids
    blake2b = hashlib.blake2b
    digests = b"".join([blake2b(name.encode(), digest_size=8).digest() for name in names])
    return (np.frombuffer(digests, "<u8") >> np.uint64(1)).astype(np.int64)


def pair_keys(owners: np.ndarray, collaborators: np.ndarray) -> np.ndarray:
    """(P,) int64 keys of (owner, collaborator) device-key pairs: a 63-bit mix of the two (splitmix64)."""
    with np.errstate(over="ignore"):
        x = owners.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ collaborators.astype(np.uint64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(1)).astype(np.int64)


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
    """One slot's edges as integer arrays over a DeviceIndex (src = owner, dst = collaborator).

    The evidence arrays default to one graded task per edge (no flags) and the profile to unknown."""

    slot: int
    src: np.ndarray  # (E,)
    dst: np.ndarray  # (E,)
    t_col: np.ndarray  # (E,)
    offset: np.ndarray  # (E,)
    tasks: np.ndarray | None = None  # (E,) tasks behind T_col
    flagged: np.ndarray | None = None  # (E,) of those, tasks with the tr/com flags
    tr: np.ndarray | None = None  # (E,) transmissions that succeeded
    com: np.ndarray | None = None  # (E,) computations that succeeded
    profile: np.ndarray | None = None  # (E, 2) mean task size (bit) and density (cycle/bit), NaN unknown
    time_ratio: np.ndarray | None = None  # (E,) mean reported offload time / local time, NaN unknown
    reported: np.ndarray | None = None  # (E,) of those, tasks whose outcome the owner reported itself
    log_speed: np.ndarray | None = None  # (E,) mean log(cycles / reported offload time), NaN unknown
    timed: np.ndarray | None = None  # (E,) of the tasks, those with a log_speed

    def __post_init__(self) -> None:
        e = len(self.src)
        defaults = {"tasks": np.ones(e), "flagged": np.zeros(e), "tr": np.zeros(e), "com": np.zeros(e),
                    "profile": np.full((e, 2), np.nan), "time_ratio": np.full(e, np.nan),
                    "reported": np.zeros(e), "log_speed": np.full(e, np.nan), "timed": np.zeros(e)}
        for name, value in defaults.items():
            object.__setattr__(self, name, value if getattr(self, name) is None
                               else np.asarray(getattr(self, name), dtype=np.float64))

    @property
    def reported_share(self) -> np.ndarray:
        """(E,) the share of each edge's tasks whose outcome its owner reported (0: all seen by a monitor)."""
        return self.reported / np.maximum(self.tasks, 1e-12)

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
    column = {name: edges[name].to_numpy()[known].astype(np.float64)
              for name in ("t_col", "offset", "tasks", "flagged", "tr", "com", "size_bits", "density", "time_ratio",
                           "reported", "log_speed", "timed")}
    profile = np.stack([column["size_bits"], column["density"]], axis=1)
    graphs = {}
    bounds = np.flatnonzero(np.diff(slots)) + 1  # edges are sorted by slot
    for part in np.split(np.arange(len(slots)), bounds):
        if len(part):
            s = int(slots[part[0]])
            graphs[s] = SlotGraph(s, src[part], dst[part], column["t_col"][part], column["offset"][part],
                                  column["tasks"][part], column["flagged"][part], column["tr"][part],
                                  column["com"][part], profile[part], column["time_ratio"][part],
                                  column["reported"][part], column["log_speed"][part], column["timed"][part])
    return graphs
