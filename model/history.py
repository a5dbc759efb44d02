"""A collaboration log as BM sees it: devices and per-slot graphs.

Positions are relative slots ``0 .. T-1`` counted from ``first_slot`` (absolute
slot 0, the clock's origin, unless given) under the model's :class:`SlotClock`.
A device's window is the last S slots, idle slots included (its explicit idle
embedding); only slots before the history's start are padding, never data.
This depends on no per-device registry, so the streaming job rebuilds the same
windows from the last S slots of the log.
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
        start = 0 if first_slot is None else first_slot
        if min(by_slot) < start:
            raise ValueError(f"events: slot {min(by_slot)} lies before the history's first slot {start} "
                             "(events before the clock's origin?)")
        graphs = tuple(by_slot.get(start + k) for k in range(max(by_slot) - start + 1))
        return cls(index, start, graphs)

    @property
    def slots(self) -> int:
        return len(self.graphs)

    def windows(self, devices: np.ndarray, end: np.ndarray, window: int) -> tuple[np.ndarray, np.ndarray]:
        """Relative slots of each device's history window ending at ``end`` (inclusive), right-padded.

        Returns (slots (P, window) with padding repeating the last slot, lengths (P,)): the last
        ``window`` slots, or all since the history's start when fewer.
        """
        start = np.maximum(end - window + 1, 0)
        lengths = end - start + 1
        slots = np.minimum(start[:, None] + np.arange(window), end[:, None])
        return slots, lengths
