"""The paper's constants and trustbeam's conventions, in one typed place.

Units are SI throughout. The paper's energy coefficient is 1e-11 "with f in
GHz"; in SI (f in Hz) the same physics is ``capacitance = 1e-11 / (1e9)**2 =
1e-29`` J per cycle per Hz², which is what :class:`SystemParams` stores. A
5 MB task at 2,339 cycle/bit on a 2 GHz CPU then costs 3.74 J and 46.8 s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEVICES = ("auto", "cpu", "cuda")  # --device: where torch runs the model (model.stages.resolve_device)


def dbm_to_w(dbm: float) -> float:
    return 10.0 ** (dbm / 10.0) / 1000.0


@dataclass(frozen=True)
class SystemParams:
    """Physics of the paper's system model (eqs. 2-9). Defaults are the paper's."""

    bandwidth_hz: float = 5e6  # W
    noise_w: float = dbm_to_w(-80.0)  # N0, -80 dBm
    path_loss_exponent: float = 4.0  # alpha0, channel gain g = d^-alpha0
    capacitance: float = 1e-29  # epsilon, J/(cycle*Hz^2) == paper's 1e-11 with f in GHz
    xi_time: float = 0.5  # xi1, weight of V_time
    xi_energy: float = 0.5  # xi2, weight of V_ener
    min_distance_m: float = 1.0  # the far-field gain d^-alpha0 is not used below this

    def __post_init__(self) -> None:
        for name in ("bandwidth_hz", "noise_w", "path_loss_exponent", "capacitance", "min_distance_m"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SystemParams.{name}: must be > 0 (got {getattr(self, name)!r})")
        if not (self.xi_time >= 0 and self.xi_energy >= 0 and abs(self.xi_time + self.xi_energy - 1) < 1e-9):
            raise ValueError(f"SystemParams.xi_time+xi_energy: must be non-negative and sum to 1 "
                             f"(got {self.xi_time!r}, {self.xi_energy!r})")


@dataclass(frozen=True)
class TrustWeights:
    """T_col = a1 * p_tr + a2 * p_com (the paper's alpha1 = 0.6, alpha2 = 0.4)."""

    a_tr: float = 0.6
    a_com: float = 0.4

    def __post_init__(self) -> None:
        if not (self.a_tr >= 0 and self.a_com >= 0 and abs(self.a_tr + self.a_com - 1) < 1e-9):
            raise ValueError(f"TrustWeights: a_tr and a_com must be non-negative and sum to 1 "
                             f"(got {self.a_tr!r}, {self.a_com!r})")


@dataclass(frozen=True)
class SlotClock:
    """Slot k covers [origin_ms + k*slot_ms, origin_ms + (k+1)*slot_ms). Same offline and streaming."""

    origin_ms: int = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    slot_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.slot_ms <= 0:
            raise ValueError(f"SlotClock.slot_ms: must be > 0 (got {self.slot_ms!r})")
        if self.origin_ms < 0:
            raise ValueError(f"SlotClock.origin_ms: must be >= 0 (got {self.origin_ms!r})")

    def metadata(self) -> dict[bytes, bytes]:
        """Arrow schema metadata recording this clock, so a file carries its slots' definition."""
        return {b"slot_origin_ms": str(self.origin_ms).encode(), b"slot_ms": str(self.slot_ms).encode()}

    @classmethod
    def from_metadata(cls, metadata: dict[bytes, bytes] | None) -> "SlotClock | None":
        """The clock recorded by :meth:`metadata`, or None when the file has none."""
        if not metadata or b"slot_ms" not in metadata:
            return None
        return cls(origin_ms=int(metadata[b"slot_origin_ms"]), slot_ms=int(metadata[b"slot_ms"]))

    def slot_of(self, time_ms: np.ndarray | int) -> np.ndarray:
        """Slot index of each event time (negative before the origin)."""
        return (np.asarray(time_ms, dtype=np.int64) - self.origin_ms) // self.slot_ms

    def start_ms(self, slot: np.ndarray | int) -> np.ndarray:
        return self.origin_ms + np.asarray(slot, dtype=np.int64) * self.slot_ms

    def end_ms(self, slot: np.ndarray | int) -> np.ndarray:
        return self.start_ms(slot) + self.slot_ms


@dataclass(frozen=True)
class RankingConfig:
    """What a slot's scoring publishes; the same offline (``trustbeam score``) and streaming.

    Per slot, every owner with a task in the last ``owner_slots`` slots is scored against the
    candidates with a known status within ``range_m`` (all when None). It gets one ranking at a threshold
    theta (its latest task's, ``default_threshold`` when its tasks carry none, lowered to
    ``threshold_floor`` when one is set): the ``top_k`` candidates with T >= theta by VoC, plus every
    candidate on the (T, VoC) Pareto frontier above theta, best VoC first, so that a scheduler whose
    task asks any theta' >= theta finds the paper's choice for it in the ranking; and trust scores for
    its ``scores_per_owner`` most trusted candidates.
    """

    owner_slots: int = 1
    range_m: float | None = 300.0
    top_k: int = 10
    scores_per_owner: int = 5
    default_threshold: float = 0.5  # theta for an owner whose tasks carry none
    threshold_floor: float | None = None  # the lowest theta the schedulers ask: rankings answer every theta above

    def __post_init__(self) -> None:
        for name in ("owner_slots", "top_k", "scores_per_owner"):
            if getattr(self, name) < 1:
                raise ValueError(f"RankingConfig.{name}: must be >= 1 (got {getattr(self, name)!r})")
        if self.range_m is not None and not self.range_m > 0:
            raise ValueError(f"RankingConfig.range_m: must be > 0 or None (got {self.range_m!r})")
        if not 0 <= self.default_threshold <= 1:
            raise ValueError(f"RankingConfig.default_threshold: must lie in [0, 1] (got {self.default_threshold!r})")
        if self.threshold_floor is not None and not 0 <= self.threshold_floor <= 1:
            raise ValueError(f"RankingConfig.threshold_floor: must lie in [0, 1] (got {self.threshold_floor!r})")


def state_dir() -> Path:
    """Where trustbeam keeps local state (ledgers, broker PID files and logs, caches): ``TRUSTBEAM_STATE_DIR``,
    default ``~/.local/state/trustbeam``."""
    return Path(os.environ.get("TRUSTBEAM_STATE_DIR") or Path.home() / ".local" / "state" / "trustbeam")
