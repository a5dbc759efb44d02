"""Publishing scored slots in order, with the online recalibration: one implementation for ``score_log`` (offline)
and the job's ``PublishSlots`` (Beam state).

Slot s's forecasts move by the level shift of every outcome seen through s (:class:`model.recalibration.OnlineShift`:
s's observed pairs set against the raw forecasts of the slot published before it). In the streaming job an update
of a published slot u (late events within the allowed lateness) brings u's newer outcomes and pieces, and the shards
send the slots after it again: the publisher goes back to the state before u, recomputes the shifts from u on, and
publishes again every piece whose records changed, so that each slot's last publication equals the offline one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable

import numpy as np

from model.config import RankingConfig, SlotClock
from model.published import PairScores, SlotScores
from model.recalibration import OnlineShift

# a slot's observed pairs: (k,) pair keys, T_col, tasks, the share of them their owner reported
Outcomes = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
NO_OUTCOMES: Outcomes = (np.zeros(0, np.int64), np.zeros(0), np.zeros(0), np.zeros(0))


@dataclass
class RecentSlot:
    """What the publisher holds of one slot while an update can still reach it."""

    pieces: dict[int, PairScores] = field(default_factory=dict)  # the newest version of each piece
    outcomes: tuple[int, Outcomes] | None = None  # (the close's version, its observed pairs): the newest
    changed: set[int] = field(default_factory=set)  # pieces newer than their last publication
    outcomes_changed: bool = False
    before: OnlineShift | None = None  # the recalibration before this slot (once published)
    shift: float | None = None  # the shift its records were last published with
    revisions: dict[int, int] = field(default_factory=dict)  # publications so far, per piece


@dataclass
class SlotPublisher:
    """The slots scored but not final yet, and the recalibration after the last one published (None: off)."""

    online: OnlineShift | None
    recent: dict[int, RecentSlot] = field(default_factory=dict)
    published_through: int = -1

    def add_pieces(self, pieces: list[PairScores]) -> None:
        """Scored pieces in; an older version of a piece than the one held is ignored."""
        for piece in pieces:
            slot = self.recent.setdefault(piece.slot, RecentSlot())
            held = slot.pieces.get(piece.piece)
            if held is None or piece.version > held.version:
                slot.pieces[piece.piece] = piece
                slot.changed.add(piece.piece)

    def add_outcomes(self, slot: int, version: int, outcomes: Outcomes) -> None:
        """A close of ``slot`` (``version`` 0 the first, updates after): its observed pairs."""
        recent = self.recent.setdefault(slot, RecentSlot())
        if recent.outcomes is None or version > recent.outcomes[0]:
            recent.outcomes = (version, outcomes)
            recent.outcomes_changed = True

    def publish(self, through: int, ranking: RankingConfig, model_version: str, clock: SlotClock,
                keep_slots: int, each: Callable[[Callable, Iterable], Iterable] = map) -> list[SlotScores]:
        """Publish what changed among the slots up to ``through`` that hold pieces, in slot order (a change to a
        published slot recomputes every published slot after it); then forget the slots more than ``keep_slots``
        before the last published (no update can reach them). ``each`` maps a slot's pieces to their records (a
        thread pool's ``map``: the offline scorer publishes them on its threads)."""
        last = max(through, self.published_through)
        due = sorted(s for s, r in self.recent.items() if s <= last and r.pieces)
        dirty = [s for s in due if self.recent[s].changed or self.recent[s].outcomes_changed
                 or s > self.published_through]
        out: list[SlotScores] = []
        if not dirty:
            return out
        first = dirty[0]
        state = self.online
        if state is not None and self.recent[first].before is not None:
            state = self.recent[first].before.copy()  # go back to the state before the earliest change
        for slot in (s for s in due if s >= first):
            recent = self.recent[slot]
            shift = 0.0
            if state is not None:
                recent.before = state.copy()
                shift = state.advance(slot, *(recent.outcomes[1] if recent.outcomes else NO_OUTCOMES))
                forecasts = [piece.forecasts() for piece in recent.pieces.values()]
                state.remember(slot, *(np.concatenate(column) for column in zip(*forecasts)))
            again = set(recent.pieces) if shift != recent.shift else recent.changed
            numbers = sorted(again)
            out.extend(each(lambda n: recent.pieces[n].publish(ranking, model_version, clock, shift,
                                                               recent.revisions.get(n, 0)), numbers))
            for number in numbers:
                recent.revisions[number] = recent.revisions.get(number, 0) + 1
            recent.shift, recent.changed, recent.outcomes_changed = shift, set(), False
        self.online = state
        self.published_through = max(self.published_through, due[-1])
        for old in [s for s in self.recent if s < self.published_through - keep_slots]:
            del self.recent[old]
        return out
