"""Hidden long-term behaviour: the per-device parameters and the reliability curve they give over slots.

One home for the behaviour model, read by the world (each device's own parameters: the truth) and by the
Bayes filter (a grid of hypotheses over the same parameters: what a learner could infer). Every method
is elementwise and broadcasts, so a (H, 1) column of hypotheses against (1, K) slots gives (H, K).

Glossary: ``high``/``low`` the reliable and unreliable levels; ``start``/``span`` the slot a degrading
or recovering device's change begins and how long it lasts; ``on_len``/``off_len``/``offset`` an
intermittent (on-off) device's cycle; ``period``/``phase`` the usage cycle (a periodic device's
reliability follows it); ``targeted`` whether a selective device misbehaves toward an owner.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from simulator.config import Behaviour

HIGH = (0.85, 0.99)  # U(lo, hi) of the reliable level
LOW = (0.05, 0.4)  # ... of the unreliable level
START = (0.2, 0.6)  # share of the run's slots at which a change begins
SPAN = (0.1, 0.3)  # ... over which it lasts (at least one slot)
ON_LEN = (6, 20)  # intermittent: good slots per cycle (inclusive)
OFF_LEN = (2, 8)  # ... bad slots per cycle
PERIOD = (8.0, 40.0)  # the usage cycle's period, slots
OFFSETS = 1 << 20  # intermittent offsets are uniform in [0, OFFSETS)


@dataclass(frozen=True)
class BehaviourParams:
    """Hidden behaviour parameters, one entry per device (or per hypothesis); arrays of one shape."""

    kind: np.ndarray  # Behaviour values
    high: np.ndarray
    low: np.ndarray
    start: np.ndarray
    span: np.ndarray
    on_len: np.ndarray
    off_len: np.ndarray
    offset: np.ndarray
    period: np.ndarray
    phase: np.ndarray

    @classmethod
    def draw(cls, rng: np.random.Generator, kind: np.ndarray, slots: int) -> "BehaviourParams":
        """The simulator's prior: every parameter drawn for every device (in this order) whatever its kind."""
        n = len(kind)
        high, low = rng.uniform(*HIGH, size=n), rng.uniform(*LOW, size=n)
        start = rng.uniform(*START, size=n) * slots
        span = np.maximum(1.0, rng.uniform(*SPAN, size=n) * slots)
        on_len, off_len = rng.integers(ON_LEN[0], ON_LEN[1] + 1, size=n), rng.integers(OFF_LEN[0], OFF_LEN[1] + 1, size=n)
        offset = rng.integers(0, OFFSETS, size=n)
        period, phase = rng.uniform(*PERIOD, size=n), rng.uniform(0.0, 2 * np.pi, size=n)
        return cls(kind, high, low, start, span, on_len, off_len, offset, period, phase)

    def take(self, rows: np.ndarray | slice) -> "BehaviourParams":
        return BehaviourParams(**{f.name: getattr(self, f.name)[rows] for f in fields(self)})

    def column(self) -> "BehaviourParams":
        """The same entries as an (n, 1) column, to broadcast against a row of slots."""
        return BehaviourParams(**{f.name: getattr(self, f.name)[:, None] for f in fields(self)})

    def cycle(self, slot: np.ndarray | int) -> np.ndarray:
        """The usage cycle sin(2 pi slot / period + phase) in [-1, 1]: the background load's rhythm."""
        return usage_cycle(slot, self.period, self.phase)

    def ramp(self, slot: np.ndarray | int) -> np.ndarray:
        """A degrading or recovering device's progress through its change, in [0, 1]."""
        return change_ramp(slot, self.start, self.span)

    def reliability(self, slot: np.ndarray | int, targeted: np.ndarray | bool, tied: bool = False) -> np.ndarray:
        """P(computing honestly) at ``slot``; ``targeted``: the owner is one a selective device misbehaves
        toward. ``tied`` (the telemetry setting): a periodic device is unreliable when its usage cycle is busy
        (its reliability falls as its reported load rises) instead of following an independent cosine. Only the
        curves of the classes present are computed."""
        slot = np.asarray(slot)
        kinds = [Behaviour(int(k)) for k in np.unique(self.kind)]
        curves = [self.curve(kind, slot, targeted, tied) for kind in kinds]
        shape = np.broadcast_shapes(*(np.shape(v) for v in curves), np.shape(self.kind), np.shape(targeted))
        if len(kinds) == 1:
            return curves[0] if np.shape(curves[0]) == shape else np.broadcast_to(curves[0], shape).copy()
        return np.select([np.broadcast_to(self.kind == kind, shape) for kind in kinds],
                         [np.broadcast_to(v, shape) for v in curves])

    def curve(self, kind: Behaviour, slot: np.ndarray, targeted: np.ndarray | bool, tied: bool) -> np.ndarray:
        """The reliability at ``slot`` of every entry as if it were of class ``kind``."""
        hi, lo = self.high, self.low
        if kind == Behaviour.STABLE_RELIABLE:
            return hi + 0 * slot
        if kind == Behaviour.STABLE_UNRELIABLE:
            return lo + 0 * slot
        if kind == Behaviour.DEGRADING:
            return hi - (hi - lo) * self.ramp(slot)
        if kind == Behaviour.RECOVERING:
            return lo + (hi - lo) * self.ramp(slot)
        if kind == Behaviour.INTERMITTENT:
            return np.where((slot + self.offset) % (self.on_len + self.off_len) < self.on_len, hi, lo)
        if kind == Behaviour.PERIODIC:
            wave = (1 - self.cycle(slot)) / 2 if tied else 0.5 + 0.5 * np.cos(2 * np.pi * slot / self.period + self.phase)
            return lo + (hi - lo) * wave
        return np.where(targeted, lo, hi) + 0 * slot  # selective


def usage_cycle(slot: np.ndarray | int, period: np.ndarray, phase: np.ndarray) -> np.ndarray:
    """sin(2 pi slot / period + phase), in [-1, 1]: a usage cycle of that period and phase at ``slot``."""
    return np.sin(2 * np.pi * np.asarray(slot) / period + phase)


def change_ramp(slot: np.ndarray | int, start: np.ndarray, span: np.ndarray) -> np.ndarray:
    """A change's progress at ``slot``, in [0, 1]: 0 before ``start``, 1 from ``start + span`` on, linear between."""
    return np.clip((np.asarray(slot) - start) / span, 0.0, 1.0)


def drift_share(kind: np.ndarray, ramp: np.ndarray) -> np.ndarray:
    """The share of its load drift a device of class ``kind`` carries at its change's ``ramp``: a degrading device
    takes it on as it degrades, a recovering one sheds it as it recovers, any other carries none."""
    return np.select([kind == Behaviour.DEGRADING, kind == Behaviour.RECOVERING], [ramp, 1 - ramp], 0.0)


def class_prior(mix: dict[Behaviour, float]) -> dict[Behaviour, float]:
    """The share of devices of each behaviour (the mix, normalized; 0 for those it leaves out)."""
    total = sum(mix.values())
    return {b: mix.get(b, 0.0) / total for b in Behaviour}
