"""Forgetting-weighted evidence: what each device and each pair has shown so far, at several memories.

Every task is one unit of evidence in six channels (:data:`CHANNELS`): the task itself (n), its
T_col weight (w), whether it carries the tr/com flags (f), the flags (tr, com), and the
transmission again weighted by the on-time factor of the task's reported times (ton: what a
computation could be expected to achieve given how late the offload left it, so that
P(com | tr) counted against ton measures j's behaviour rather than its CPU or its owners'), and, where
the collaborator reported its CPU load u by the slot's end (telemetry), ton and com again, times u and
ton times u^2 (:data:`LOADED`, :func:`with_status`): the sums of a regression of its success rate on its
load, which a device whose reliability follows its usage (or drifts with it) makes steep; and, where the task's size
is known, ton and com again, times x (+1 for a task larger than :attr:`EvidenceConfig.size_split_bits`, the training
period's typical size, -1 for the rest: :func:`size_x`) and ton times x^2 (:data:`SIZED`): the same regression on
the task's size class, which a device that serves small tasks and fails large ones (opportunistic service) makes
steep (the head's size correction, :class:`model.experts.SizeCorrection`); and, where a task's offload time is
reported, its count and the log of the speed it showed (its cycles over that time) against the CPU the collaborator
claimed in its status then (:data:`CLAIMS`, :func:`with_status`): a device whose claim its tasks' times contradict
has its CPU read as they show (:func:`verified_cpu`). Evidence is
kept per *role*: a device as collaborator (every channel), a device as owner (n, w: what it
reports of others, e.g. a rater's bias), a pair owner -> collaborator (n, w, f, tr, com) and the whole
population (one key, :data:`POPULATION`: every task of the log, so that the level a log drifts to is
tracked online, in the streaming shards as offline); and, where devices report their loads, where each one's load
last shifted to a new level and what it showed since (:data:`SHIFT_ROLES`, :mod:`model.shift`). Each
sum forgets by a factor lambda per slot, for each lambda of :class:`EvidenceConfig` at once, so a
device whose last success was 30 slots ago carries lambda**30 of it, however its slots were
pooled elsewhere.

:class:`EvidenceState` holds the sums as of each key's last update (decayed lazily on read), the
same arrays in the streaming shards and offline. :class:`EvidenceTrack` records every update, so
offline code can ask for any key at any slot. :func:`pair_evidence_features` turns the sums of a
pair's roles into the head's input: normalized features (smoothed rates, log counts, recency) for its
networks, then the raw success and trial sums of the collaborator and of the population
(:data:`STATS`) for its rules (:mod:`model.head`).

Glossary: lambda (``lams``) is the forgetting factor per slot; N, W, F, TR, COM, TON the channels.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from model.channel import OnTimeCurve
from model.graphs import SlotGraph
from model.status import free_share
from model.usage_cycle import CHANNELS as CYCLE_CHANNELS
from model.usage_cycle import CYCLE, CYCLE_MEMORY

CHANNELS = ("n", "w", "f", "tr", "com", "ton", "tk", "ck", "tu", "cu", "tuu", "ts", "cs", "tx", "cx", "txx", "sk",
            "sv", "tz", "cz", "tzz")
N, W, F, TR, COM, TON, TK, CK, TU, CU, TUU, TS, CS, TX, CX, TXX, SK, SV, TZ, CZ, TZZ = range(len(CHANNELS))
LOADED = (TK, CK, TU, CU, TUU)  # the collaborator's ton and com where its load u was reported, times u and u^2
SIZED = (TS, CS, TX, CX, TXX)  # ton and com of tasks of known size, times x (their size class, +-1) and x^2
CYCLED = (TZ, CZ, TZZ)  # ton and com times z, where the collaborator's usage cycle put its load in the task's slot
#                         (model.usage_cycle.cycle_deviation), and ton times z^2 (with EvidenceConfig.cycles:
#                         with_status)
CLAIMS = (SK, SV)  # the collaborator's tasks with a reported offload time and a claimed CPU, and their summed log of
#                    the speed shown over the CPU claimed (the collaborator's roles only: with_status)
CLAIM_TOLERANCE = 1.25  # how far below the typical share of its claim a device's shown speed may lie and be believed,
#                         once its timed tasks are many (with few, :data:`CLAIM_SCATTER` more)
CLAIM_SCATTER = 0.3  # the log-speed margin one timed task adds: an honest device's speed swings with its hidden load,
#                      so the mean of n timed tasks is allowed CLAIM_SCATTER / sqrt(n) more below the typical share
CLAIM_MIN_TASKS = 2.0  # timed tasks (at the longest memory) before a claim is judged
LOAD_AGREEMENT = 0.5  # the share of a claim's margin within which a device's tasks' times bear its loads out: a
#                       reported load takes the hidden load's swing out of the speeds, so honest devices' gaps lie
#                       within 0.36-0.44 of the margin (six 500-device worlds), and nine in ten devices that say they
#                       are 0.25 busier than they are beyond 0.95 of it (loads_contradicted)
PAIR_CHANNELS = COM + 1  # a pair's features read only n, w, f, tr, com: all a pair's state keeps
OWNER_CHANNELS = W + 1  # an owner's features read n and w (what it reports): all an owner's state keeps
ROLES = ("collaborator", "owner", "pair", "population")
REPORTS = "reports"  # a device's reported loads: a state of its own, fed by statuses rather than by tasks
REPORT_CHANNELS = ("slots", "load")  # per slot with a report known by its end: 1, and the latest load reported
# what owners reported themselves of a pair's tasks, per pair (tags: its collaborator and owner keys), kept where its
# collaborator's evidence is and weighed by the owner's credibility where it is read (model.credibility); the
# collaborator's and the population's roles hold what monitors saw
REPORTED = "reported"
JUDGING_MEMORY = 0.995  # REPORTED's extra, longest memory, at which owners are judged: a liar lies all along
LONG_MEMORY = 0.995  # the memory kept beside the others where devices report their loads (:func:`memories`): a
#                     device's record over about a thousand slots (half-life 138), still fading, so a key that falls
#                     silent is pruned in time
# what the credibility did not let in (model.credibility.discredited), per device and memory, that the head reads: the
# tasks owners reported of it as collaborator and were not believed in, and their reported T_col; the tasks it reported
# of others as an owner and was not believed in, and all the tasks it reported
DISCREDITED = ("doubted_of_it", "doubted_of_it_w", "doubted_from_it", "reported_by_it")
# where a device's reported load shifts to a new level (model.shift), per device: the two sides of its load's CUSUM
# (no forgetting: open is 1 while either side is above zero), its sums since each side's open excursion began, and
# its sums since its last shift; each sum is of SINCE_CHANNELS
SHIFT_TEST, SHIFT_OPEN, SHIFTED = "shift_test", "shift_open", "shifted"
SHIFT_ROLES = (SHIFT_TEST, SHIFT_OPEN, SHIFTED)
TEST_CHANNELS = ("open", "up", "down")
SINCE_CHANNELS = ("slots", "load", "ton", "com")  # slots with a report, their loads, on-time transmissions, successes
OPEN_CHANNELS = ("slots", *(f"{side}_{c}" for side in ("up", "down") for c in SINCE_CHANNELS))  # slots: both sides'
SUMMED_ROLES = (*ROLES, REPORTS, REPORTED, CYCLE)  # the states that each slot's increments add to
STATE_ROLES = (*SUMMED_ROLES, *SHIFT_ROLES)  # the states a holder of evidence keeps
POPULATION = -1  # the population role's one key (device keys and history rows are >= 0)
NEVER = 10 ** 9  # slots since the last update of a key never seen
# the raw sums at the end of the evidence input, per lambda: (role, channel) of the collaborator and the population
STATS = (("collaborator", COM), ("collaborator", TON), ("collaborator", W), ("collaborator", N),
         ("population", COM), ("population", TON), ("population", W), ("population", N),
         *(("collaborator", channel) for channel in SIZED))


@dataclass(frozen=True)
class EvidenceConfig:
    lams: tuple[float, ...] = (0.7, 0.9, 0.95, 0.98)  # forgetting factors per slot, short to long memory (training
    #                                                   adds LONG_MEMORY where devices report their loads: memories)
    recency_cap: int = 100  # slots since the last task, capped (and scaled by it) in the features
    on_time: tuple[float, ...] = ()  # OnTimeCurve factors weighting the ton channel (fitted in training); none: 1
    level_memory: float = 0.9  # the lambda of the population's rate the head's forecasts are read against
    colocation_m: float | None = 0.1  # ids reporting positions this close are judged as one collaborator
    #                                   (model.identity: Sybils, whitewashers); None: every id apart
    succession_m: float | None = 5.0  # a fresh id reporting this close to where an id fell silent continues its
    succession_slots: int = 10  # record, if that was at most this many slots before (model.identity); None: never
    poor_succession_m: float | None = 150.0  # a fresh id this far from an id that fell silent with a record poorer
    #                                          than the fleet's continues it (model.identity.poor_successions); None:
    #                                          no. Farther reaches farther moves, at a cost where honest devices
    #                                          leave (README, *Manipulation*, *How far a poor record passes*)
    discredited: bool = False  # the head reads what the credibility did not let in, of each collaborator and from it
    #                           (:func:`discredited_block`); training sets it where owners report their own tasks
    size_split_bits: float | None = None  # the size that parts large tasks from small ones in the size evidence
    #                                       (:func:`size_x`); training sets it to its period's typical task size
    #                                       (model.baselines.size_split) where sizes vary; None: no size evidence
    speed_gap: float | None = None  # the typical log of a device's shown speed over its claimed CPU (training sets it:
    #                                 :func:`typical_speed_gap`); None: claims believed (a log without times)
    shifts: bool = False  # watch each device's reported load for shifts and read its evidence since the last one
    #                       (:mod:`model.shift`, :func:`shift_block`); training sets it where devices report loads
    shift_slack: float = 0.125  # the load's move per slot a shift's CUSUM lets pass (half the least shift it is for)
    shift_alarm: float = 0.5  # the CUSUM's sum of moves beyond the slack that makes a shift
    cycles: bool = False  # fit each device's reported loads' usage cycle and read the head its success rate at the
    #                       load the cycle brings next (:mod:`model.usage_cycle`, :func:`cycle_block`); training sets it
    #                       where devices report loads
    fall_earned: float = 0.0  # on-time tasks (at the longest memory) a device must have served since its load fell
    #                           before the fall is read (shift_block); 0: read at once. A load can be run at will, and
    #                           dropped: 2 cuts what devices that burn a load to drop it win, at a cost to honest
    #                           recovering devices, whose falls wait about ten slots unread (README, *Manipulation*)
    fall_credit: bool = False  # read a fall only as far as the falls of its cohort, the fleet's falls about as old,
    #                            have been borne out (fall_credit); training sets it where devices report loads

    def __post_init__(self) -> None:
        if not self.lams or any(not 0 < lam <= 1 for lam in self.lams):
            raise ValueError(f"EvidenceConfig.lams: each must lie in (0, 1] (got {self.lams!r})")
        if self.level_memory not in self.lams:
            raise ValueError(f"EvidenceConfig.level_memory: must be one of lams {self.lams!r} "
                             f"(got {self.level_memory!r})")
        if self.colocation_m is not None and not self.colocation_m > 0:
            raise ValueError(f"EvidenceConfig.colocation_m: must be > 0 or None (got {self.colocation_m!r})")
        if self.succession_m is not None and not self.succession_m > 0:
            raise ValueError(f"EvidenceConfig.succession_m: must be > 0 or None (got {self.succession_m!r})")
        if self.poor_succession_m is not None and not self.poor_succession_m > 0:
            raise ValueError(f"EvidenceConfig.poor_succession_m: must be > 0 or None (got {self.poor_succession_m!r})")
        if self.succession_slots < 1:
            raise ValueError(f"EvidenceConfig.succession_slots: must be >= 1 (got {self.succession_slots!r})")
        if self.size_split_bits is not None and not self.size_split_bits > 0:
            raise ValueError(f"EvidenceConfig.size_split_bits: must be > 0 or None (got {self.size_split_bits!r})")
        if self.speed_gap is not None and not np.isfinite(self.speed_gap):
            raise ValueError(f"EvidenceConfig.speed_gap: must be finite or None (got {self.speed_gap!r})")
        for name in ("shift_slack", "shift_alarm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"EvidenceConfig.{name}: must be > 0 (got {getattr(self, name)!r})")
        if not self.fall_earned >= 0:
            raise ValueError(f"EvidenceConfig.fall_earned (--fall-earned): must be >= 0 (got {self.fall_earned!r})")

    @property
    def credits_falls(self) -> bool:
        """Whether a fall is weighed by its cohort's credit (:func:`fall_credit`): ``fall_credit`` where shifts are
        read at all."""
        return self.shifts and self.fall_credit

    @property
    def identity_m(self) -> float:
        """How far apart two ids judged together (model.identity) may stand at most, chains aside."""
        return max(self.colocation_m or 0.0, self.succession_m or 0.0, self.poor_succession_m or 0.0)

    @property
    def collaborator_normalized(self) -> int:
        """Width of the collaborator's normalized columns: its head block (9L), then recency, seen, load, reported,
        the load's drift and its memory (4 + 2L), with ``discredited`` :func:`discredited_block` (4L) and with
        ``shifts`` :func:`shift_block` (2 + 2L) and with ``cycles`` :func:`cycle_block` (1 + 2L); its raw
        :data:`STATS` follow them in its rows of the head's inputs."""
        lams = len(self.lams)
        return (lams * 11 + 4 + (4 * lams if self.discredited else 0) + (2 * lams + 2 if self.shifts else 0)
                + (2 * lams + 1 if self.cycles else 0))

    @property
    def normalized(self) -> int:
        """Width of the normalized part of :func:`pair_evidence_features` (what the head's networks read): the
        collaborator's columns, the owner's (2L) and the pair's (4L)."""
        return self.collaborator_normalized + len(self.lams) * 6

    @property
    def features(self) -> int:
        """Width of :func:`pair_evidence_features`: the normalized part, then the raw :data:`STATS`."""
        return self.normalized + len(self.lams) * len(STATS)

    def on_time_factor(self, time_ratio: np.ndarray) -> np.ndarray:
        return OnTimeCurve(self.on_time)(time_ratio) if self.on_time else np.ones(len(time_ratio))

    def with_memories(self, lams: Sequence[float]) -> "EvidenceConfig":
        """The same evidence kept at the forgetting factors ``lams`` (``--memories``; training still adds
        :data:`LONG_MEMORY` where devices report their loads), the population's level read at the one nearest
        :attr:`level_memory`. ``--memories 0.7`` leaves a device's record beyond a few slots to the sequence encoder."""
        if not lams or len(set(lams)) != len(lams) or any(not 0 < lam <= 1 for lam in lams):
            raise ValueError(f"--memories: distinct forgetting factors in (0, 1] (got {' '.join(map(str, lams))})")
        ordered = tuple(sorted(lams))
        return replace(self, lams=ordered, level_memory=min(ordered, key=lambda lam: abs(lam - self.level_memory)))


def channels_of(role: str) -> int:
    """How many channels a role's sums keep: the first :data:`PAIR_CHANNELS` of :data:`CHANNELS` for a pair, the
    first :data:`OWNER_CHANNELS` for an owner (what their features read: a pair's state is most of a shard's), all of
    them for the collaborator, the population and :data:`REPORTED`, :data:`REPORT_CHANNELS` for :data:`REPORTS`, and
    the :data:`SHIFT_ROLES`' and :data:`model.usage_cycle.CYCLE`'s own."""
    return {"pair": PAIR_CHANNELS, "owner": OWNER_CHANNELS, REPORTS: len(REPORT_CHANNELS), CYCLE: CYCLE_CHANNELS,
            SHIFT_TEST: len(TEST_CHANNELS), SHIFT_OPEN: len(OPEN_CHANNELS), SHIFTED: len(SINCE_CHANNELS)
            }.get(role, len(CHANNELS))


def memories(lams: tuple[float, ...], loads_reported: bool) -> tuple[float, ...]:
    """The memories the evidence keeps: ``lams``, and where devices report their loads also :data:`LONG_MEMORY`.

    A long memory suits a device whose behaviour stays put and misleads about one that changed. From the outcomes
    alone the head cannot tell them apart in time (without loads it errs more with it), but a change leaves its trace
    in the load a device reports (its drift and memory, which the head reads beside it), so there it can trust the
    long record of a device whose load shows no change.
    """
    return tuple(sorted({*lams, LONG_MEMORY})) if loads_reported else tuple(lams)


def role_lams(role: str, lams: tuple[float, ...] | np.ndarray) -> np.ndarray:
    """The forgetting factors a role's sums are kept at: the config's, and for :data:`REPORTED` also
    :data:`JUDGING_MEMORY` (last); :data:`SHIFT_TEST` forgets nothing (one factor, 1);
    :data:`model.usage_cycle.CYCLE` keeps its fit's own (:data:`model.usage_cycle.CYCLE_MEMORY`)."""
    if role == SHIFT_TEST:
        return np.ones(1)
    if role == CYCLE:
        return np.full(1, CYCLE_MEMORY)
    return np.asarray((*lams, JUDGING_MEMORY) if role == REPORTED else lams, np.float64)


def empty_state(role: str, lams: tuple[float, ...] | np.ndarray) -> "EvidenceState":
    """A role's state with nothing in it, at :func:`role_lams` (:data:`REPORTED` keys carry two tags: collaborator
    and owner)."""
    tags = np.zeros((0, 2) if role == REPORTED else 0, np.int64)
    return EvidenceState(role_lams(role, lams), tags=tags, channels=channels_of(role))


def find(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions, found) of ``keys`` in the sorted array ``sorted_keys``."""
    at = np.searchsorted(sorted_keys, keys)
    if not len(sorted_keys):
        return at, np.zeros(len(keys), bool)
    return at, (at < len(sorted_keys)) & (sorted_keys[np.minimum(at, len(sorted_keys) - 1)] == keys)


KEY_ORDER_MIN = 1 << 16  # below this many keys np.argsort is as quick


def key_order(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` of (n,) int64 keys, a few times faster for many: the keys' low bits are
    replaced by each key's index and the codes sorted by value, which numpy does with SIMD where an argsort cannot
    (8.4M hashed pair keys: ~0.25 s against ~1 s); keys that share all but those bits are then put in order."""
    keys = np.asarray(keys, np.int64)
    if len(keys) < KEY_ORDER_MIN:
        return np.argsort(keys, kind="stable")
    low = np.int64((1 << (len(keys) - 1).bit_length()) - 1)  # as many low bits as an index needs
    codes = (keys & ~low) | np.arange(len(keys), dtype=np.int64)  # the high bits keep their order (a floor)
    codes.sort()
    order, high = codes & low, codes & ~low
    tied = high[1:] == high[:-1]
    if tied.any():  # rare for hashed keys: each run of one high part in full-key order, ties by index
        at = np.flatnonzero(np.r_[tied, False] | np.r_[False, tied])
        rows = order[at]
        order[at] = rows[np.lexsort((keys[rows], high[at]))]
    return order


def positions(sorted_keys: np.ndarray, keys: np.ndarray, missing: int) -> np.ndarray:
    """(k,) each of ``keys``' position in the sorted ``sorted_keys`` (the first of repeats, as :func:`find` gives it);
    ``missing`` where it is not there. :func:`find` asks for every key; this sorts the keys (:func:`key_order`) and
    looks each sorted key up among them instead, which is quicker where the keys are many (a slot's candidate pairs
    against the pairs with evidence: 8.4M in 60k, ~0.5 s against ~1.2 s)."""
    keys = np.asarray(keys, np.int64)
    out = np.full(len(keys), missing, np.int64)
    if not len(sorted_keys) or not len(keys):
        return out
    order = key_order(keys)
    ordered = keys[order]
    at = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])  # each distinct sorted key's first place
    begin = np.searchsorted(ordered, sorted_keys[at], "left")
    counts = np.searchsorted(ordered, sorted_keys[at], "right") - begin  # the keys equal to each sorted key
    first = np.repeat(begin - (np.cumsum(counts) - counts), counts)  # where each one's run starts, less its offset
    out[order[first + np.arange(counts.sum())]] = np.repeat(at, counts)
    return out


def decay(lams: np.ndarray, gap: np.ndarray) -> np.ndarray:
    """(k, L) factors lambda**gap for gaps (k,) in slots."""
    return np.power(lams[None, :], np.maximum(gap, 0)[:, None].astype(np.float64))


@dataclass
class EvidenceState:
    """Decayed sums per int64 key: ``values[k]`` (L, C) as of slot ``slots[k]``, keys sorted.

    ``tags`` holds the int64s given with each key when it is first seen ((m,): a pair's owner key; (m, 2): an
    owner-reported pair's collaborator and owner keys), so that a reader can pick keys by them."""

    lams: np.ndarray
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    slots: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    values: np.ndarray | None = None  # (m, L, C)
    tags: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    channels: int = len(CHANNELS)  # C where ``values`` is not given (:data:`REPORT_CHANNELS` for the reports)

    def __post_init__(self) -> None:
        self.lams = np.asarray(self.lams, np.float64)
        if self.values is None:
            self.values = np.zeros((0, len(self.lams), self.channels))
        self.channels = self.values.shape[-1]

    def __len__(self) -> int:
        return len(self.keys)

    def copy(self) -> "EvidenceState":
        """A copy that later updates of this state leave alone (:meth:`update` writes its arrays in place)."""
        return EvidenceState(self.lams, self.keys.copy(), self.slots.copy(), self.values.copy(), self.tags.copy(),
                             self.channels)

    def update(self, keys: np.ndarray, slot: int, increments: np.ndarray, tags: np.ndarray | None = None
               ) -> np.ndarray:
        """Add (k, C) increments at ``slot``, or (k, L, C) ones per lambda (keys unique, slot >= their last update);
        returns the rows updated."""
        keys = np.asarray(keys, np.int64)
        tags = np.zeros((len(keys), *self.tags.shape[1:]), np.int64) if tags is None else np.asarray(tags, np.int64)
        order = key_order(keys)
        keys, increments, tags = keys[order], increments[order], tags[order]
        at, known = find(self.keys, keys)
        if (~known).any():  # new keys start at zero evidence, inserted where they sort (one copy of each array)
            new = keys[~known]
            where = np.searchsorted(self.keys, new)
            self.keys = np.insert(self.keys, where, new)
            self.slots = np.insert(self.slots, where, slot)
            self.values = np.insert(self.values, where, 0.0, axis=0)
            self.tags = np.insert(self.tags, where, tags[~known], axis=0)
            at = np.searchsorted(self.keys, keys)
        factor = decay(self.lams, slot - self.slots[at])  # (k, L)
        self.values[at] = self.values[at] * factor[:, :, None] + (increments if increments.ndim == 3 else
                                                                   increments[:, None, :])
        self.slots[at] = slot
        return at

    def query(self, keys: np.ndarray, slot: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values (k, L, C) decayed to ``slot``, slots since the last update (k,); NEVER for unknown keys)."""
        keys = np.asarray(keys, np.int64)
        at, known = find(self.keys, keys)
        out = np.zeros((len(keys), len(self.lams), self.channels))
        since = np.full(len(keys), NEVER, np.int64)
        rows = at[known]
        gap = np.broadcast_to(np.asarray(slot, np.int64), keys.shape)[known] - self.slots[rows]
        out[known] = self.values[rows] * decay(self.lams, gap)[:, :, None]
        since[known] = gap
        return out, since

    def prune(self, slot: int, below: float = 1e-3) -> None:
        """Forget keys whose count (channel 0: tasks, or slots with a report) has decayed below ``below`` at the
        longest memory by ``slot``."""
        remaining = self.values[:, -1, N] * decay(self.lams[-1:], slot - self.slots)[:, 0]
        keep = remaining >= below
        self.keys, self.slots, self.values, self.tags = (self.keys[keep], self.slots[keep], self.values[keep],
                                                         self.tags[keep])


MONITORED = ("collaborator", "population")  # the roles that hold what monitors saw (owners' reports: REPORTED)


def size_x(size_bits: np.ndarray, split_bits: float | None) -> np.ndarray:
    """Each task's size class x: +1 larger than ``split_bits``, else -1 (NaN where the size or the split is unknown).
    An opportunistic device fails large tasks and serves small ones: a step, which a line in the log of the size reads
    badly near the step (stop 58, README: *Opportunistic service*)."""
    if split_bits is None:
        return np.full(np.shape(size_bits), np.nan)
    return np.where(size_bits > 0, np.where(size_bits > split_bits, 1.0, -1.0), np.nan)


def edge_increments(graph: SlotGraph, config: EvidenceConfig) -> np.ndarray:
    """(E, C) each edge's evidence; the load channels stay zero (:func:`with_status`), the size channels hold the
    edges whose mean task size is known, :data:`CLAIMS` the timed tasks and their summed log speed (their claim
    taken off where the collaborator's status is known: :func:`with_status`)."""
    ton = graph.tr * config.on_time_factor(graph.time_ratio)
    per_edge = np.zeros((len(graph.src), len(CHANNELS)))
    per_edge[:, [N, W, F, TR, COM, TON]] = np.stack([graph.tasks, graph.t_col * graph.tasks, graph.flagged, graph.tr,
                                                     graph.com, ton], axis=1)
    x = size_x(graph.profile[:, 0], config.size_split_bits)
    known = np.isfinite(x)
    if known.any():
        u, ts, cs = np.where(known, x, 0.0), np.where(known, ton, 0.0), np.where(known, graph.com, 0.0)
        per_edge[:, list(SIZED)] = np.stack([ts, cs, ts * u, cs * u, ts * u * u], axis=1)
    timed = np.isfinite(graph.log_speed) & (graph.timed > 0)
    per_edge[:, SK] = np.where(timed, graph.timed, 0.0)
    per_edge[:, SV] = np.where(timed, graph.timed * np.nan_to_num(graph.log_speed), 0.0)  # the claim: with_status
    return per_edge


def sum_by(keys: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(unique keys (k,), the rows (m, C) summed per key (k, C))."""
    unique, inverse = np.unique(np.asarray(keys, np.int64), return_inverse=True)
    sums = np.zeros((len(unique), rows.shape[1]))
    np.add.at(sums, inverse, rows)
    return unique, sums


def role_keys(graph: SlotGraph, n: int, role: str) -> np.ndarray:
    """(E,) each edge's key in ``role``: pair keys are src * n + dst."""
    return {"collaborator": graph.dst, "owner": graph.src, "pair": graph.src * n + graph.dst,
            "population": np.full(len(graph.src), POPULATION)}[role]


def role_increments(graph: SlotGraph, n: int, config: EvidenceConfig) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A slot's evidence per role: {role: (keys (k,), increments (k, C))}, keys in the graph's rows (pair keys src *
    n + dst). The collaborator's and the population's evidence of an edge is the share of its tasks a monitor saw;
    the share its owner reported itself goes to :data:`REPORTED`, per pair (weighed where it is read: credibility)."""
    per_edge = edge_increments(graph, config)
    share = graph.reported_share
    monitored = per_edge * (1.0 - share)[:, None] if share.any() else per_edge
    out = {}
    for role in ROLES:
        unique, sums = sum_by(role_keys(graph, n, role), monitored if role in MONITORED else per_edge)
        sums = sums[:, :channels_of(role)]  # what the role's features read (an owner's: what it reports, n and w)
        if role == "population":  # no one status to set the speeds against
            sums[:, list(CLAIMS)] = 0.0
        if role == "collaborator" and share.any():  # a collaborator only owners reported of: in REPORTED alone
            unique, sums = unique[sums[:, N] > 0], sums[sums[:, N] > 0]
        out[role] = (unique, sums)
    reported = np.flatnonzero(share > 0)  # an edge per pair in a slot: the pair keys are unique
    out[REPORTED] = (role_keys(graph, n, "pair")[reported], per_edge[reported] * share[reported, None])
    return out


def with_status(increments: np.ndarray, load: np.ndarray, cpu_hz: np.ndarray, cycle: np.ndarray | None = None
                ) -> np.ndarray:
    """A collaborator role's increments (k, C) with the :data:`LOADED` channels filled from its ton and com and
    its reported load (k,) (NaN: none reported, and those channels stay zero), the :data:`CYCLED` ones from where its
    usage cycle put its load in the slot (k,) (:func:`model.usage_cycle.cycle_deviation`; None: zero), and the
    :data:`CLAIMS` speeds set against the CPU it claimed (k,) (NaN: none known, and those channels are zeroed), times
    the share its reported load leaves free where it reported one (a busy device is slower, and says so). The statuses
    are known where the collaborator's are kept (its shard, online), not where the slot's events are gathered, so the
    role's holder calls this on the increments :func:`role_increments` made."""
    out = increments.copy()
    known = np.isfinite(load)
    u = np.where(known, load, 0.0)
    ton, com = np.where(known, increments[:, TON], 0.0), np.where(known, increments[:, COM], 0.0)
    out[:, TK], out[:, CK], out[:, TU], out[:, CU], out[:, TUU] = ton, com, ton * u, com * u, ton * u * u
    z = np.zeros(len(u)) if cycle is None else np.where(known, cycle, 0.0)
    out[:, TZ], out[:, CZ], out[:, TZZ] = ton * z, com * z, ton * z * z
    claimed = np.isfinite(cpu_hz) & (np.nan_to_num(cpu_hz) > 0)
    log_claim = np.log(np.where(claimed, cpu_hz, 1.0) * free_share(u))
    out[:, SK] = np.where(claimed, increments[:, SK], 0.0)
    out[:, SV] = np.where(claimed, increments[:, SV] - increments[:, SK] * log_claim, 0.0)
    return out


def typical_speed_gap(sums: np.ndarray) -> float | None:
    """The median over collaborators of the mean log of their shown speed over their claimed CPU, from their sums
    (n, L, C) at the longest memory, among those with :data:`CLAIM_MIN_TASKS` timed tasks; None where none has."""
    timed, total = sums[:, -1, SK], sums[:, -1, SV]
    judged = timed >= CLAIM_MIN_TASKS
    return float(np.median(total[judged] / timed[judged])) if judged.any() else None


def claim_gap(sums: np.ndarray, speed_gap: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(timed, gap, margin), each (n,), from n collaborators' sums (n, L, C) at the longest memory: their timed tasks,
    the mean log of their shown speed over what their claims (CPU, and the share their reported load leaves free) say,
    less the typical one (``speed_gap``), and how far a gap may lie from 0 and be believed: log
    :data:`CLAIM_TOLERANCE` + :data:`CLAIM_SCATTER` / sqrt(timed tasks)."""
    timed = sums[:, -1, SK]
    gap = sums[:, -1, SV] / np.maximum(timed, 1e-12) - speed_gap
    return timed, gap, np.log(CLAIM_TOLERANCE) + CLAIM_SCATTER / np.sqrt(np.maximum(timed, CLAIM_MIN_TASKS))


def verified_cpu(cpu_hz: np.ndarray, sums: np.ndarray, config: EvidenceConfig) -> np.ndarray:
    """(n,) each device's claimed CPU (n,), or where its tasks' times contradict the claim the CPU they show: a device
    with :data:`CLAIM_MIN_TASKS` timed tasks (at the longest memory) whose gap (:func:`claim_gap`) lies below minus
    its margin is read at its claim times exp(its gap). Its sums (n, L, C) as a collaborator; nothing changes without
    ``config.speed_gap``."""
    if config.speed_gap is None:
        return cpu_hz
    timed, gap, margin = claim_gap(sums, config.speed_gap)
    caught = (timed >= CLAIM_MIN_TASKS) & (gap < -margin)
    return np.where(caught, cpu_hz * np.exp(np.minimum(gap, 0.0)), cpu_hz)


def loads_contradicted(sums: np.ndarray, config: EvidenceConfig) -> np.ndarray:
    """(n,) whether each collaborator's tasks' times contradict its claims (sums (n, L, C)): :data:`CLAIM_MIN_TASKS`
    timed tasks at the longest memory and a gap (:func:`claim_gap`) beyond :data:`LOAD_AGREEMENT` of its margin on
    either side. A device that says it is busier than it is runs faster than its claims say, one that says it is idler
    runs slower. None without ``config.speed_gap`` (no times to set its loads against: they are read as said)."""
    if config.speed_gap is None:
        return np.zeros(len(sums), dtype=bool)
    timed, gap, margin = claim_gap(sums, config.speed_gap)
    return (timed >= CLAIM_MIN_TASKS) & (np.abs(gap) > LOAD_AGREEMENT * margin)


RIDGE = 0.01  # the load's variance a regression is shrunk by (a load swings by about +-0.1 around its mean)


def mean_load(sums: np.ndarray) -> np.ndarray:
    """(..., L) a collaborator's mean load at its tasks (on-time weighted) from its :data:`LOADED` sums (..., L, C)."""
    return sums[..., TU] / np.maximum(sums[..., TK], 1e-9)


def line_rate(sums: np.ndarray, channels: tuple[int, ...], ridge: float, at: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """(rate at ``at``, slope) per lambda from a collaborator's sums (P, L, C) of a line's ``channels`` (ton, com,
    ton x, com x, ton x^2 where x is known) and where to read it (P,) (NaN: nowhere, the base rate): the weighted
    least-squares line of P(com | ton) on x, its slope shrunk toward zero by ``ridge`` times the tasks,
    Laplace-smoothed at x's mean; (0.5, 0) where nothing is known."""
    tk, ck, tx, cx, txx = (sums[..., c] for c in channels)
    centred = txx - tx ** 2 / np.maximum(tk, 1e-9)  # sum of ton * (x - mean x)^2
    slope = (cx - ck * tx / np.maximum(tk, 1e-9)) / (centred + ridge * tk + 1e-9)
    mean_x = tx / np.maximum(tk, 1e-9)
    base = (ck + 1.0) / (tk + 2.0)
    x = np.where(np.isfinite(at), at, np.nan)[:, None]
    rate = np.where(np.isfinite(x) & (tk > 0), base + slope * (np.nan_to_num(x) - mean_x), base)
    return np.clip(rate, 0.0, 1.0), np.where(tk > 0, slope, 0.0)


def load_rate(sums: np.ndarray, load_now: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rate at the load now, slope) per lambda from a collaborator's :data:`LOADED` sums (P, L, C) and its
    latest reported load (P,) (NaN: none): :func:`line_rate` on the load, its slope shrunk by :data:`RIDGE`."""
    return line_rate(sums, LOADED, RIDGE, load_now)


DRIFT_SCALE = 2.0  # a load moved by 0.5 (a changing device's drift is 0.25) reads as 1


def load_drift(sums: np.ndarray, load_now: np.ndarray) -> np.ndarray:
    """(n, L) how far a collaborator's latest reported load (n,) (NaN: none) lies from its mean load at its tasks
    per lambda (from its :data:`LOADED` sums (n, L, C)), scaled by :data:`DRIFT_SCALE` and clipped to [-1, 1]; 0
    where either is unknown. A device whose behaviour changes with its load (a degrading one takes load on) shows
    the change here before its outcomes do."""
    known = np.isfinite(load_now)[:, None] & (sums[..., TK] > 0)
    drift = np.nan_to_num(load_now)[:, None] - mean_load(sums)
    return np.where(known, np.clip(DRIFT_SCALE * drift, -1.0, 1.0), 0.0)


def shifted_load(shifted: np.ndarray) -> np.ndarray:
    """(n,) a device's mean load since its load last shifted, at the longest memory, from its :data:`SHIFTED` sums
    (n, L, 4); 0 where it never shifted."""
    return shifted[:, -1, 1] / np.maximum(shifted[:, -1, 0], 1e-12)


def report_increments(keys: np.ndarray, load: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A slot's :data:`REPORTS` update from each device's latest reported load by the slot's end (k,) (NaN: none
    yet): (keys of the devices with one, increments (k', 2): 1 and that load)."""
    known = np.isfinite(load)
    return np.asarray(keys, np.int64)[known], np.stack([np.ones(int(known.sum())), load[known]], axis=1)


def load_memory(reports: np.ndarray | None, n: int, lams: int) -> np.ndarray:
    """(n, L) a device's reported load, forgetting-weighted over the slots at each lambda (the mean of the latest
    load it had reported by each slot's end), from its :data:`REPORTS` sums (n, L, 2); 0 where none is known. Every
    status counts here, between a device's tasks too: the trajectory of a load that drifts or cycles."""
    if reports is None:
        return np.zeros((n, lams))
    return np.where(reports[..., 0] > 0, reports[..., 1] / np.maximum(reports[..., 0], 1e-12), 0.0)


def discredited_block(sums: np.ndarray | None, n: int, lams: int) -> np.ndarray:
    """(n, 4L): per lambda, the log count of the tasks owners reported of a collaborator and were not believed in
    (their reports times one less their credibility, :mod:`model.credibility`), and their mean reported T_col less
    one half; then the log count of the tasks it reported itself as an owner and was not believed in, and their share
    of all it reported (smoothed by one); 0 where none (sums (n, L, 4) of :data:`DISCREDITED`; None: none known). A
    device that liars praise is likely one of theirs (ballot-stuffing), one they blame likely honest (bad-mouthing),
    and a device that lies of others as an owner likely serves as a liar would: what the weighing takes out still says
    something of it."""
    if sums is None:
        return np.zeros((n, 4 * lams))
    told, said, doubted, reported = (sums[..., k] for k in range(len(DISCREDITED)))
    return np.concatenate([_log_count(told), (said - told / 2) / (told + 1.0), _log_count(doubted),
                           doubted / (reported + 1.0)], axis=1)


@dataclass
class EvidenceTrack:
    """Every update of an :class:`EvidenceState`, so any key can be read at any slot (offline).

    Records are sorted by (key, slot); a read takes the key's last record at or before the slot and
    decays it, which equals the state a slot-by-slot replay would hold then.
    """

    lams: np.ndarray
    keys: np.ndarray
    slots: np.ndarray
    values: np.ndarray  # (m, L, C) state right after the update at ``slots``

    @classmethod
    def record(cls, lams: np.ndarray, updates: list[tuple[int, np.ndarray, np.ndarray]],
               channels: int = len(CHANNELS)) -> "EvidenceTrack":
        """Replay ``updates`` [(slot, keys, increments (k, channels))] in slot order through one state, keeping each
        result."""
        state = EvidenceState(lams, channels=channels)
        keys, slots, values = [], [], []
        for slot, update_keys, increments in updates:
            rows = state.update(update_keys, slot, increments)
            keys.append(state.keys[rows])
            slots.append(np.full(len(rows), slot, np.int64))
            values.append(state.values[rows].copy())
        if not keys:
            return cls(np.asarray(lams, np.float64), np.zeros(0, np.int64), np.zeros(0, np.int64),
                       np.zeros((0, len(lams), channels)))
        keys, slots, values = np.concatenate(keys), np.concatenate(slots), np.concatenate(values)
        order = np.lexsort((slots, keys))
        return cls(np.asarray(lams, np.float64), keys[order], slots[order], values[order])

    def query(self, keys: np.ndarray, slot: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values (k, L, C) as of the end of ``slot`` (one per key), slots since the key's last update)."""
        keys, slot = np.asarray(keys, np.int64), np.broadcast_to(np.asarray(slot, np.int64), np.shape(keys))
        out = np.zeros((len(keys), len(self.lams), self.values.shape[-1]))
        since = np.full(len(keys), NEVER, np.int64)
        if not len(self.keys):
            return out, since
        first = np.searchsorted(self.keys, keys, side="left")
        stop = np.searchsorted(self.keys, keys, side="right")
        # the last record with record slot <= slot inside the key's block [first, stop)
        ordinal = np.cumsum(np.r_[True, self.keys[1:] != self.keys[:-1]]) - 1
        span = int(max(self.slots.max(), slot.max()) - min(self.slots.min(), slot.min())) + 2
        base = min(int(self.slots.min()), int(slot.min()))
        combined = ordinal * span + (self.slots - base)
        query_ordinal = ordinal[np.minimum(first, len(ordinal) - 1)]
        at = np.searchsorted(combined, query_ordinal * span + (slot - base), side="right") - 1
        found = (stop > first) & (at >= first)
        rows = at[found]
        gap = slot[found] - self.slots[rows]
        out[found] = self.values[rows] * decay(self.lams, gap)[:, :, None]
        since[found] = gap
        return out, since


def _rate(hits: np.ndarray, trials: np.ndarray) -> np.ndarray:
    """Laplace-smoothed rate (hits + 1) / (trials + 2)."""
    return (hits + 1.0) / (trials + 2.0)


def _log_count(x: np.ndarray) -> np.ndarray:
    return np.log1p(x) / 3.0


def _mean_weight(x: np.ndarray) -> np.ndarray:
    return (x[..., W] + 0.5) / (x[..., N] + 1.0)


FALL_AGES = 40  # the fleet's falls are pooled by their age, 0 to 39 slots with a report since (fall_pool's rows)
COHORT = 5  # a fall is judged by the falls within this many slots of its own age, its cohort (fall_credit)
FALL_MARGIN = 0.1  # the gain of P(com | ton) since a fall over the device's whole record, pooled over its cohort, at
#                    which a fall is read in full (fall_credit)
FALL_PRIOR = 10.0  # on-time tasks' worth of a gain that a cohort starts from
FALL_BELIEF = 0.5  # that gain, as a share of FALL_MARGIN: a fall is read at half until the fallen have served
FALL_POOL = ("ton", "com", "expected")  # fall_pool's sums per age


def fall_age(shifted: np.ndarray, lams: tuple[float, ...]) -> np.ndarray:
    """(n,) the slots with a report since each device's load last shifted, from its :data:`SHIFTED` sums (n, L, 4):
    the longest memory's count of them, its forgetting undone (0 where it never shifted)."""
    slots, lam = shifted[:, -1, 0], lams[-1]
    if lam == 1.0:
        return slots
    return np.log(np.maximum(1.0 - slots * (1.0 - lam), 1e-12)) / np.log(lam)


def fall_pool(c: np.ndarray, shifted: np.ndarray | None, reports: np.ndarray | None, config: EvidenceConfig
              ) -> np.ndarray:
    """(:data:`FALL_AGES`, 3) :data:`FALL_POOL` per age: how the devices whose load fell that many slots ago have fared
    since, from n devices' sums as collaborator (n, L, C), :data:`SHIFTED` (n, L, 4) and :data:`REPORTS` (n, L, 2) sums:
    their on-time tasks since the fall and the successes among them at the level memory, and the successes their whole
    records (at the longest memory) would have given those tasks. Falls read as no shift (where the tasks' times
    contradict the loads: :func:`loads_contradicted`) are left out. Sums over devices, so a fleet's pool is its shards'
    summed (:class:`model.scoring.DeviceFrame`). Zeros where ``config`` reads no credit (``credits_falls``)."""
    pool = np.zeros((FALL_AGES, len(FALL_POOL)))
    if shifted is None or not config.credits_falls or not len(c):
        return pool
    level = config.lams.index(config.level_memory)
    age = np.rint(fall_age(shifted, config.lams)).astype(np.int64)
    away = shifted_load(shifted) - load_memory(reports, len(c), len(config.lams))[:, -1]
    fell = (shifted[:, -1, 0] > 0) & (age < FALL_AGES) & (away < 0) & ~loads_contradicted(c, config)
    ton, com = shifted[fell, level, 2], shifted[fell, level, 3]
    whole = _rate(c[fell, -1, COM], c[fell, -1, TON])
    np.add.at(pool, age[fell], np.stack([ton, com, ton * whole], axis=1))
    return pool


def fall_credit(pool: np.ndarray, age: np.ndarray) -> np.ndarray:
    """(n,) how far each device's fall is read, in [0, 1], from the fleet's :func:`fall_pool` (:data:`FALL_AGES`, 3)
    and the fall's age (n,) (:func:`fall_age`): over the falls of its cohort (ages within :data:`COHORT` of its own),
    the gain of their success rate since over what their records gave, shrunk toward :data:`FALL_BELIEF` times
    :data:`FALL_MARGIN` by :data:`FALL_PRIOR` tasks, over that margin: a fall whose cohort has served nothing since is
    read at half. An honest device sheds load as it recovers, and after its fall serves better than its record, at
    its own time: its cohort's falls are read in full. Devices that drop a load they ran to buy a fresh record
    (``fake-burn``), in a wave, serve as before: once their outcomes since come in, their falls, and any other in the
    wave, stop buying trust, for as long as the wave's falls are pooled."""
    own = np.clip(np.rint(age).astype(np.int64), 0, FALL_AGES - 1)  # (n,)
    cumulative = np.concatenate([np.zeros((1, len(FALL_POOL))), np.cumsum(pool, axis=0)])  # (A + 1, 3)
    cohort = cumulative[np.minimum(own + COHORT + 1, FALL_AGES)] - cumulative[np.maximum(own - COHORT, 0)]  # (n, 3)
    ton, com, expected = cohort.T
    gain = (com - expected + FALL_PRIOR * FALL_BELIEF * FALL_MARGIN) / (ton + FALL_PRIOR)
    return np.clip(gain / FALL_MARGIN, 0.0, 1.0)


SINCE_PRIOR = 2.0  # tasks' worth of its whole record that a doubted device's rate since its load rose is shrunk
#                   toward (shift_block)


def shift_block(c: np.ndarray, shifted: np.ndarray | None, reports: np.ndarray | None,
                doubted: np.ndarray, fall_earned: float = 0.0, credit: np.ndarray | float = 1.0) -> list[np.ndarray]:
    """(n, 2 + 2L) from n collaborators' sums as collaborator (n, L, C), since their load last shifted (n, L, 4)
    (:data:`SHIFTED`, :mod:`model.shift`; None: none known), their :data:`REPORTS` sums (n, L, 2) and whether their
    tasks' times contradict their loads (n,) (:func:`loads_contradicted`): whether the load shifted; per lambda
    P(com | tr) on-time since the shift less over the whole record, and the log on-time count since the shift; and how
    far its mean load since the shift lies from its mean reported load at the longest memory (times
    :data:`DRIFT_SCALE`, clipped to [-1, 1]). Zero where it never shifted.

    The load is what a device says of itself, and runs at will. Where its tasks' times contradict it, its load's move
    may take trust away (a load that rose, as a degrading device's does, with the rate since shrunk toward the whole
    record's by :data:`SINCE_PRIOR` tasks) but never gives it: a fall reads as no shift at all, every column zero. Read
    as it is, a fall in a load that an unreliable device reports would buy it a fresh record (the ``fake-recovery``
    attack, which must first say it is busier than it is). With ``fall_earned`` (:attr:`EvidenceConfig.fall_earned`) a
    fall is read only once the device has served that many on-time tasks since (until then no shift at all): a device
    that really runs a load to drop it (``fake_burn``) tells the truth, and its fall alone, read before anything was
    shown since, buys it trust. ``credit`` (n,) or scalar (:func:`fall_credit`) weighs a fall's columns: how far the
    falls of its cohort have been borne out."""
    n, lams = c.shape[:2]
    if shifted is None:
        return [np.zeros((n, 1)), np.zeros((n, lams)), np.zeros((n, lams)), np.zeros((n, 1))]
    _, _, ton, com = (shifted[..., k] for k in range(len(SINCE_CHANNELS)))
    whole = _rate(c[..., COM], c[..., TON])
    since = np.where(doubted[:, None], (com + SINCE_PRIOR * whole) / (ton + SINCE_PRIOR), _rate(com, ton))
    moved, weight = shift_weight(shifted, reports, doubted, fall_earned, credit)
    read = weight > 0
    away = np.clip(DRIFT_SCALE * moved, -1.0, 1.0)
    rate = weight[:, None] * np.where(read[:, None], since - whole, 0.0)
    count = weight[:, None] * np.where(read[:, None], _log_count(ton), 0.0)
    return [weight[:, None], rate, count, (weight * np.where(read, away, 0.0))[:, None]]


def shift_weight(shifted: np.ndarray, reports: np.ndarray | None, doubted: np.ndarray, fall_earned: float = 0.0,
                 credit: np.ndarray | float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(how far each device's mean load since its load last shifted lies from its mean reported load at the longest
    memory (n,), how far :func:`shift_block` reads the shift (n,), in [0, 1]) from its :data:`SHIFTED` (n, L, 4) and
    :data:`REPORTS` (n, L, 2) sums: a rise in full; a fall as far as ``credit`` (:func:`fall_credit`) goes, once the
    device has served ``fall_earned`` on-time tasks since and where its tasks' times do not contradict its loads
    (``doubted``), else not at all; 0 where it never shifted."""
    moved = shifted_load(shifted) - load_memory(reports, len(shifted), shifted.shape[1])[:, -1]
    earned = ~doubted & (shifted[:, -1, 2] >= fall_earned)
    weight = np.where(moved > 0, 1.0, np.where(earned, credit, 0.0))
    return moved, np.where(shifted[:, -1, 0] > 0, weight, 0.0)


def credited_load(load: np.ndarray, c: np.ndarray, shifted: np.ndarray | None, reports: np.ndarray | None,
                  config: EvidenceConfig, credit: np.ndarray | float = 1.0) -> np.ndarray:
    """(n,) the load the head's physics reads of each device (:func:`model.context.pair_physics`): its reported load
    (n,), raised by the part of its last fall that is doubted (its sums as collaborator (n, L, C), :data:`SHIFTED`
    (n, L, 4) and :data:`REPORTS` (n, L, 2), ``credit`` (n,) or scalar, :func:`fall_credit`): all of a fall that
    :func:`shift_weight` does not read at all, and of the rest as far as its cohort's credit lies below
    :data:`FALL_BELIEF`, where the fleet's falls of its age have served worse than a fall is believed to before they
    serve. A load is run at will: a device that burns one to drop it frees its CPU as it drops it, and a wave of them
    buys no trust with it once their falls are seen to serve as before. Unchanged without shifts watched
    (``config.shifts``)."""
    if shifted is None or not config.shifts:
        return load
    believed = np.minimum(np.asarray(credit, np.float64) / FALL_BELIEF, 1.0) if config.credits_falls else 1.0
    moved, weight = shift_weight(shifted, reports, loads_contradicted(c, config), config.fall_earned, believed)
    unread = np.where(shifted[:, -1, 0] > 0, 1.0 - weight, 0.0)  # (n,) 0 where the load never shifted
    return load + unread * np.maximum(-moved, 0.0)


CYCLE_RIDGE = 0.1  # the cycle's variance a regression on it is shrunk by (a cycle's z swings by about +-1)


def cycle_block(c: np.ndarray, deviation: np.ndarray | None) -> list[np.ndarray]:
    """(n, 1 + 2L) from n collaborators' sums as collaborator (n, L, C) and where their usage cycle puts their load
    next slot (n,) (:func:`model.usage_cycle.cycle_deviation`, z; None: none known): z, and per lambda the weighted
    least-squares line of P(com | ton) on where the cycle put the load at each task (:data:`CYCLED`), its slope shrunk
    by :data:`CYCLE_RIDGE` (:func:`line_rate`): its value at z, and its slope (over 2, clipped to [-1, 1]). A device
    whose reliability follows its usage shows it here before the slot does: the cycle is read without the slots'
    noise, which the last load and the regression on the loads reported (:func:`load_rate`) carry."""
    n, lams = c.shape[:2]
    if deviation is None:
        return [np.zeros((n, 1)), np.zeros((n, lams)), np.zeros((n, lams))]
    rate, slope = line_rate(c, (TK, CK, *CYCLED), CYCLE_RIDGE, deviation)
    return [deviation[:, None], rate, np.clip(slope / 2.0, -1.0, 1.0)]


def _collaborator_block(c: np.ndarray, since: np.ndarray, config: EvidenceConfig, population: np.ndarray | None,
                        load_now: np.ndarray | None, reports: np.ndarray | None, discredited: np.ndarray | None,
                        shifted: np.ndarray | None, cycle: np.ndarray | None, credit: np.ndarray | None
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(normalized features (n, 9L), tail (n, 4 + 2L [+ 4L] [+ 2 + 2L] [+ 1 + 2L] + len(STATS) * L): recency, seen,
    load, reported, the load's drift per lambda (:func:`load_drift`), its load's memory per lambda
    (:func:`load_memory`), with ``config.discredited`` :func:`discredited_block`, with ``config.shifts``
    :func:`shift_block` (its falls weighed by ``credit`` (n,), :func:`fall_credit`, where ``config.fall_credit``), with
    ``config.cycles`` :func:`cycle_block`, the STATS)
    float32 of n collaborators: everything of :func:`pair_evidence_features` that depends on j alone."""
    now = np.full(len(c), np.nan) if load_now is None else np.asarray(load_now, np.float64)
    at_load, slope = load_rate(c, now)
    head = [_log_count(c[..., N]), _mean_weight(c), _log_count(c[..., F]), _rate(c[..., TR], c[..., F]),
            _rate(c[..., COM], c[..., TR]), _log_count(c[..., TON]), _rate(c[..., COM], c[..., TON]),
            at_load, np.clip(slope, -5.0, 5.0) / 5.0]
    seen = since < NEVER
    recency = np.where(seen, np.minimum(since, config.recency_cap) / config.recency_cap, 1.0)
    reported = np.isfinite(now)
    whole = np.zeros((1, *c.shape[1:])) if population is None else population
    sums = {"collaborator": c, "population": np.broadcast_to(whole, c.shape)}
    tail = [recency[:, None], seen[:, None].astype(np.float64), np.where(reported, now, 0.0)[:, None],
            reported[:, None].astype(np.float64), load_drift(c, now), load_memory(reports, len(c), len(config.lams)),
            *([discredited_block(discredited, len(c), len(config.lams))] if config.discredited else []),
            *(shift_block(c, shifted, reports, loads_contradicted(c, config), config.fall_earned,
                          credit if config.credits_falls and credit is not None else 1.0)
              if config.shifts else []),
            *(cycle_block(c, cycle) if config.cycles else []),
            *(sums[role][..., channel] for role, channel in STATS)]
    return _float32_columns(head), _float32_columns(tail)


def _float32_columns(blocks: list[np.ndarray]) -> np.ndarray:
    """The (n, k) blocks side by side as float32, each value cast once as it is written (no float64 copy first)."""
    return np.concatenate(blocks, axis=1, dtype=np.float32, casting="same_kind")


def _owner_block(o: np.ndarray) -> np.ndarray:
    """(n, 2L) float32: the owner's log count and mean reported T_col."""
    return _float32_columns([_log_count(o[..., N]), _mean_weight(o)])


def _pair_block(p: np.ndarray) -> np.ndarray:
    """(P, 4L) float32 from a pair's sums (P, L, >= :data:`PAIR_CHANNELS`): its log count, mean T_col, P(tr) and
    P(com | tr)."""
    return _float32_columns([_log_count(p[..., N]), _mean_weight(p), _rate(p[..., TR], p[..., F]),
                             _rate(p[..., COM], p[..., TR])])


def pair_evidence_features(collaborator: np.ndarray, owner: np.ndarray, pair: np.ndarray, since: np.ndarray,
                           config: EvidenceConfig, population: np.ndarray | None = None,
                           load_now: np.ndarray | None = None, src: np.ndarray | None = None,
                           dst: np.ndarray | None = None, pair_at: np.ndarray | None = None,
                           reports: np.ndarray | None = None, discredited: np.ndarray | None = None,
                           shifted: np.ndarray | None = None, cycle: np.ndarray | None = None,
                           credit: np.ndarray | None = None) -> np.ndarray:
    """The pair head's evidence input, (P, ``config.features``) float32.

    collaborator, owner, pair: (P, L, C) decayed sums of the candidate j as collaborator, the owner i
    as owner, and the pair i -> j; since: (P,) slots since j last served; population: (P or 1, L, C) the
    whole log's sums (None: none known); load_now: (P,) j's latest reported load (NaN or None: none); reports:
    (P, L, 2) j's :data:`REPORTS` sums (None: none known); discredited: (P, L, 4) j's :data:`DISCREDITED` sums
    (read where ``config.discredited``; None: none known); shifted: (P, L, 4) j's :data:`SHIFTED` sums (read where
    ``config.shifts``; None: none known); cycle: (P,) where j's usage cycle puts its load next slot
    (:func:`model.usage_cycle.cycle_deviation`; read where ``config.cycles``; None: none known); credit: (P,) how
    far j's fall is read (:func:`fall_credit`; read where ``config.fall_credit``; None: in full).
    With ``src`` and ``dst`` (P,), collaborator, since, load_now, reports, discredited, shifted, cycle and credit are
    per device (n, ...) and read at ``dst``, owner at ``src``; with ``pair_at`` (P,), pair holds distinct pairs' sums
    (m, L, C) read at it: what depends on one device (or one pair) is computed once, not once per candidate pair.
    Normalized part, per lambda: j's log task count, mean T_col, log flagged count, P(tr), P(com | tr), log
    on-time-weighted count and P(com | tr) against it, P(com | tr) at its load now and the slope of its rate
    on its load (:func:`load_rate`); i's log count and mean reported T_col; the pair's log count, mean
    T_col, P(tr) and P(com | tr); then j's recency, whether j was ever seen and its load now (and whether
    it reported one), its load's drift per lambda (:func:`load_drift`), its load's memory per lambda
    (:func:`load_memory`), with ``config.discredited`` :func:`discredited_block`, with ``config.shifts``
    :func:`shift_block` and with ``config.cycles`` :func:`cycle_block`. Then the raw sums of :data:`STATS`, each per
    lambda.
    """
    return EvidenceBlocks.of(collaborator, owner, pair, since, config, population, load_now, reports,
                             discredited, shifted, cycle, credit).features(src, dst, pair_at)


@dataclass(frozen=True)
class EvidenceBlocks:
    """The parts of :func:`pair_evidence_features` that depend on one device or one pair, computed once (float32),
    so that candidate pairs can be read in chunks: (n, 9L) and (n, 4 + 2L [+ 4L] [+ 2 + 2L] [+ 1 + 2L] + len(STATS) L)
    per collaborator, (n, 2L) per owner, (m, 4L) per pair."""

    collaborator_head: np.ndarray
    collaborator_tail: np.ndarray
    owner: np.ndarray
    pair: np.ndarray

    @classmethod
    def of(cls, collaborator: np.ndarray, owner: np.ndarray, pair: np.ndarray, since: np.ndarray,
           config: EvidenceConfig, population: np.ndarray | None = None,
           load_now: np.ndarray | None = None, reports: np.ndarray | None = None,
           discredited: np.ndarray | None = None, shifted: np.ndarray | None = None,
           cycle: np.ndarray | None = None, credit: np.ndarray | None = None) -> "EvidenceBlocks":
        head, tail = _collaborator_block(collaborator, since, config, population, load_now, reports, discredited,
                                         shifted, cycle, credit)
        return cls(head, tail, _owner_block(owner), _pair_block(pair))

    def features(self, src: np.ndarray | None = None, dst: np.ndarray | None = None,
                 pair_at: np.ndarray | None = None) -> np.ndarray:
        """(P, F) float32: the rows at ``dst`` (collaborators), ``src`` (owners) and ``pair_at`` (pairs); all rows
        in order where an index is None."""
        head, tail, owner, pair = self.collaborator_head, self.collaborator_tail, self.owner, self.pair
        if dst is not None:
            head, tail, owner = head[dst], tail[dst], owner[src]
        if pair_at is not None:
            pair = pair[pair_at]
        return np.concatenate([head, owner, pair, tail], axis=1)
