"""A collaboration log as BM sees it: devices, per-slot graphs, and each device's first slot.

Positions are relative slots ``0 .. T-1`` counted from ``first_slot`` under the
model's :class:`SlotClock`. A device's history starts at its first appearance:
windows before it are padding, never data.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from model.config import SlotClock, TrustWeights
from model.graphs import DeviceIndex, SlotGraph, slot_edges, slot_graphs


@dataclass(frozen=True)
class History:
    index: DeviceIndex
    first_slot: int  # absolute slot index of relative position 0
    graphs: tuple[SlotGraph | None, ...]  # per relative slot; None where no edge
    first_seen: np.ndarray  # (n,) relative slot of each device's first edge (T if never)

    @classmethod
    def from_events(cls, events: pa.Table, clock: SlotClock, weights: TrustWeights,
                    index: DeviceIndex | None = None, first_slot: int | None = None) -> "History":
        return cls.from_edges(slot_edges(events, clock, weights), index, first_slot)

    @classmethod
    def from_edges(cls, edges: pa.Table, index: DeviceIndex | None = None,
                   first_slot: int | None = None) -> "History":
        if edges.num_rows == 0:
            raise ValueError("events: no collaboration in the log")
        index = index or DeviceIndex.from_edges(edges)
        by_slot = slot_graphs(edges, index)
        start = min(by_slot) if first_slot is None else first_slot
        length = max(by_slot) - start + 1
        graphs = tuple(by_slot.get(start + k) for k in range(length))
        first_seen = np.full(len(index), length, dtype=np.int64)
        for k in range(length - 1, -1, -1):
            if graphs[k] is not None:
                first_seen[graphs[k].active] = k
        return cls(index, start, graphs, first_seen)

    @property
    def slots(self) -> int:
        return len(self.graphs)

    def windows(self, devices: np.ndarray, end: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
        """Relative slots of each device's history window ending at ``end`` (inclusive), right-padded.

        Returns (slots (P, window) with padding repeating the last slot, lengths (P,)). A device not
        seen by ``end`` gets a one-slot window at ``end`` (its idle embedding).
        """
        start = np.maximum(end - window + 1, np.minimum(self.first_seen[devices], end))
        lengths = end - start + 1
        slots = np.minimum(start[:, None] + np.arange(window), end[:, None])
        return slots, lengths
