"""Device statuses over time and "the latest status before t": one implementation for every path.

The offline evaluation (BM's pair context), the offline scorer and the streaming shards all ask the
same question, each device's most recent :class:`schemas.DeviceStatus` observed before a time, and
all answer it with :class:`StatusLog`. Devices are int64 keys: rows of a
:class:`model.graphs.DeviceIndex` offline, or any int64 device key online.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


STATUS_COLUMNS = ("cpu_hz", "tx_w", "rx_w", "x_m", "y_m", "willingness", "comm_ok", "comp_ok", "cpu_load")
CPU, TX, RX, X, Y, WILLINGNESS, COMM_OK, COMP_OK, LOAD = range(len(STATUS_COLUMNS))
FREE_MIN = 0.05  # the least share of a CPU a reported load is read to leave free


def free_share(load: np.ndarray) -> np.ndarray:
    """(k,) the share of each device's CPU its reported load (k,) leaves free, at least :data:`FREE_MIN`; 1 where it
    reported none (NaN)."""
    return np.clip(1.0 - np.nan_to_num(load, nan=0.0), FREE_MIN, 1.0)


def status_values(status: pa.Table) -> np.ndarray:
    """(m, 9) float64 STATUS_COLUMNS of a status table (flags as 0/1; NaN where a nullable column is null or a
    file written before it existed lacks it)."""
    def column(name: str) -> np.ndarray:
        if name not in status.column_names:
            return np.full(status.num_rows, np.nan)
        return pc.fill_null(pc.cast(status[name], pa.float64()), np.nan).to_numpy(zero_copy_only=False)

    return np.stack([column(c) for c in STATUS_COLUMNS], axis=1)


TELEMETRY = ("cpu_load", "reported")  # what a sequence encoder reads of a device's status per slot


def telemetry_of(load: np.ndarray) -> np.ndarray:
    """(m,) reported loads (NaN: none known, :meth:`StatusLog.latest_load`) -> (m, TELEMETRY) float32: the load (0
    where none) and whether one was reported."""
    reported = np.isfinite(load)
    return np.stack([np.where(reported, load, 0.0), reported], axis=1).astype(np.float32)


def latest_entries(keys: np.ndarray, times: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Indices of each key's latest entry among ``mask`` (ties: the later-added entry)."""
    candidates = np.flatnonzero(mask)
    order = candidates[np.lexsort((candidates, times[candidates], keys[candidates]))]
    last = np.r_[keys[order][1:] != keys[order][:-1], True] if len(order) else np.zeros(0, bool)
    return order[last]


@dataclass
class StatusLog:
    """Statuses as parallel arrays: device key, time (ms) and the (m, 9) STATUS_COLUMNS values."""

    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    times: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    values: np.ndarray = field(default_factory=lambda: np.zeros((0, len(STATUS_COLUMNS))))

    def __len__(self) -> int:
        return len(self.keys)

    def add(self, keys: np.ndarray, times: np.ndarray, values: np.ndarray) -> None:
        self.keys = np.concatenate([self.keys, np.asarray(keys, np.int64)])
        self.times = np.concatenate([self.times, np.asarray(times, np.int64)])
        self.values = np.concatenate([self.values, np.asarray(values, np.float64).reshape(-1, len(STATUS_COLUMNS))])

    def restrict(self, keep: np.ndarray) -> "StatusLog":
        """The entries whose key is in the sorted array ``keep``."""
        mine = np.isin(self.keys, keep)
        return StatusLog(self.keys[mine], self.times[mine], self.values[mine])

    def latest(self, keys: np.ndarray, before_ms: int | np.ndarray) -> np.ndarray:
        """(len(keys), 9): each key's latest status strictly before ``before_ms`` (one time for all, or one per
        key); NaN rows where none is known."""
        return self.latest_heard(keys, before_ms)[0]

    def latest_heard(self, keys: np.ndarray, before_ms: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`latest`, (len(keys),) int64 when each of those statuses was sent, -1 where none): one search."""
        values = np.full((len(keys), len(STATUS_COLUMNS)), np.nan)
        times = np.full(len(keys), -1, np.int64)
        found, rows = self._latest(keys, before_ms)
        values[found], times[found] = self.values[rows], self.times[rows]
        return values, times

    def latest_load(self, keys: np.ndarray, before_ms: int | np.ndarray) -> np.ndarray:
        """(len(keys),) the load of :meth:`latest`'s statuses alone (NaN where none is known): the column the
        sequence encoder and the evidence read, without gathering the other eight."""
        return self.latest_value(keys, before_ms, LOAD)

    def latest_value(self, keys: np.ndarray, before_ms: int | np.ndarray, column: int) -> np.ndarray:
        """(len(keys),) one of :data:`STATUS_COLUMNS` of :meth:`latest`'s statuses (NaN where none is known)."""
        out = np.full(len(keys), np.nan)
        found, rows = self._latest(keys, before_ms)
        out[found] = self.values[rows, column]
        return out

    def first_ms(self, keys: np.ndarray, before_ms: int) -> np.ndarray:
        """(len(keys),) int64: when each key's first status before ``before_ms`` was sent (the log keeps every key's
        first: :meth:`prune`); -1 where none."""
        keys = np.asarray(keys, np.int64)
        out = np.full(len(keys), -1, np.int64)
        if not len(self.keys):
            return out
        by = self._by_key_and_time()
        first = np.searchsorted(by.keys, keys, side="left")  # each key's earliest entry
        known = first < len(by.keys)
        known[known] = (by.keys[first[known]] == keys[known]) & (by.times[first[known]] < before_ms)
        out[known] = by.times[first[known]]
        return out

    def heard(self, keys: np.ndarray, before_ms: int) -> tuple[np.ndarray, np.ndarray]:
        """(:meth:`latest`, (len(keys), 2) int64 when each key's first status and that one were sent, -1 where none):
        what :mod:`model.identity` judges ids by."""
        values, last_ms = self.latest_heard(keys, before_ms)
        return values, np.stack([self.first_ms(keys, before_ms), last_ms], axis=1)

    def _latest(self, keys: np.ndarray, before_ms: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """((len(keys),) whether a status strictly before ``before_ms`` is known, the entry of each found one)."""
        keys = np.asarray(keys, np.int64)
        if not len(self.keys) or not len(keys):
            return np.zeros(len(keys), bool), np.zeros(0, np.int64)
        by = self._by_key_and_time()
        first = np.searchsorted(by.keys, keys, side="left")
        stop = np.searchsorted(by.keys, keys, side="right")
        at = by.before(by.ordinal[np.minimum(first, len(by.ordinal) - 1)], before_ms)
        found = (stop > first) & (at >= first)
        return found, by.order[at[found]]

    def _by_key_and_time(self) -> "_ByKeyAndTime":
        """The entries by (key, time, insertion), computed once for the log as it stands (the slot's several
        queries share one sort; :meth:`add` and :meth:`prune` replace the arrays, which starts a new one)."""
        cached = self.__dict__.get("_sorted")
        if cached is None or cached.source[0] is not self.keys or cached.source[1] is not self.times:
            cached = _ByKeyAndTime.of(self.keys, self.times)
            self.__dict__["_sorted"] = cached
        return cached

    def __getstate__(self) -> dict:
        """Pickled (the job's state) without the sort, which the next query recomputes."""
        return {name: value for name, value in self.__dict__.items() if name != "_sorted"}

    def prune(self, before_ms: int) -> None:
        """Forget statuses superseded before ``before_ms``: keep each key's latest before it and all after, and each
        key's first (when a device was first heard of: :mod:`model.identity`; ties: the later-added entry)."""
        if not len(self.keys):
            return
        by = self._by_key_and_time()
        starts = np.flatnonzero(np.r_[True, by.keys[1:] != by.keys[:-1]])  # each key's first sorted position
        latest = by.before(by.ordinal[starts], before_ms)
        earliest = by.before(by.ordinal[starts], by.times[starts] + 1)  # the last entry at the key's first time
        keep = self.times >= before_ms
        keep[by.order[latest[latest >= starts]]] = True
        keep[by.order[earliest]] = True
        self.keys, self.times, self.values = self.keys[keep], self.times[keep], self.values[keep]


@dataclass(frozen=True)
class _ByKeyAndTime:
    """A status log's entries sorted by (key, time, insertion), and a search for each key's last entry before a
    time: (key, time) pairs as one int64, ``ordinal * span + time - earliest``, the ordinal counting distinct keys
    and the span wider than every time's distance from the earliest."""

    source: tuple[np.ndarray, np.ndarray]  # the keys and times arrays it sorts (compared by identity)
    order: np.ndarray  # (m,) entry indices in (key, time, insertion) order
    keys: np.ndarray  # (m,) keys in that order
    times: np.ndarray  # (m,) times in that order
    ordinal: np.ndarray  # (m,) 0.. per distinct key
    combined: np.ndarray  # (m,) ordinal * span + time - earliest, ascending
    earliest: int  # the earliest time
    latest: int  # the latest time
    span: int  # latest - earliest + 2: a query time clipped to [earliest, latest + 1] stays inside its key's span

    @classmethod
    def of(cls, keys: np.ndarray, times: np.ndarray) -> "_ByKeyAndTime":
        order = np.lexsort((np.arange(len(keys)), times, keys))
        sorted_keys, sorted_times = keys[order], times[order]
        ordinal = np.cumsum(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]) - 1
        earliest, latest = int(sorted_times.min()), int(sorted_times.max())
        span = latest - earliest + 2
        return cls((keys, times), order, sorted_keys, sorted_times, ordinal,
                   ordinal * span + (sorted_times - earliest), earliest, latest, span)

    def before(self, ordinal: np.ndarray, before_ms: int | np.ndarray) -> np.ndarray:
        """(q,) the sorted position of the last entry of each key ``ordinal`` strictly before ``before_ms`` (one time
        or one per query); before that key's first position where it has none. A time before every entry finds none
        and one after every entry finds the last, as the clipped time does."""
        query = np.clip(np.asarray(before_ms, np.int64), self.earliest, self.latest + 1) - self.earliest
        return np.searchsorted(self.combined, ordinal * self.span + query, side="left") - 1
