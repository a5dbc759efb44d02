"""SlotPublisher (model.publisher): slots published in order with the online shift, and an update of a published
slot recomputing the later shifts so that each slot's last publication equals an in-order run's."""

import numpy as np
import pytest

from model.config import RankingConfig, SlotClock
from model.published import PairScores
from model.publisher import SlotPublisher
from model.recalibration import OnlineShift, RecalibrationConfig

CLOCK = SlotClock(origin_ms=0, slot_ms=1000)
RANKING = RankingConfig(top_k=3, scores_per_owner=3)
KEYS = np.arange(10, dtype=np.int64)  # device keys 0..9: owners 0-1, candidates 2-9


def piece(slot: int, version: int, level: float) -> PairScores:
    """Owners 0 and 1, each with candidates 2..9, T_beh around ``level``."""
    src, dst = np.repeat([0, 1], 8), np.tile(np.arange(2, 10), 2)
    t_beh = np.clip(level + 0.03 * np.arange(16) % 0.2, 0, 1)
    return PairScores(slot, 0, version, KEYS, np.array([f"d{k}" for k in KEYS], object), np.array([0, 1]),
                      np.full(10, 0.3), src, dst, t_beh, np.full(16, 0.9), np.linspace(0.2, 0.8, 16))


def outcomes(p: PairScores, level: float) -> tuple:
    keys, _, _ = p.forecasts()
    return keys, np.full(len(keys), level), np.full(len(keys), 2.0)


def in_order(slots: list[tuple[PairScores, tuple]]) -> list:
    publisher = SlotPublisher(OnlineShift.start(RecalibrationConfig(guard=0.0)))
    out = []
    for p, seen in slots:
        publisher.add_outcomes(p.slot, 0, seen)
        publisher.add_pieces([p])
        out += publisher.publish(p.slot, RANKING, "v", CLOCK, keep_slots=0)
    return out


def test_an_update_recomputes_the_later_slots_like_an_in_order_run() -> None:
    first = [piece(s, 0, 0.4) for s in range(3)]
    observed = [outcomes(first[0], 0.5), outcomes(first[0], 0.7), outcomes(first[0], 0.6)]
    publisher = SlotPublisher(OnlineShift.start(RecalibrationConfig(guard=0.0)))
    before = []
    for p, seen in zip(first, observed):
        publisher.add_outcomes(p.slot, 0, seen)
        publisher.add_pieces([p])
        before += publisher.publish(p.slot, RANKING, "v", CLOCK, keep_slots=4)
    updated, late_outcomes = piece(1, 1, 0.45), outcomes(first[0], 0.9)  # late events for slot 1
    publisher.add_outcomes(1, 1, late_outcomes)
    publisher.add_pieces([updated, piece(2, 1, 0.4)])  # the shards send the slots after it again
    again = publisher.publish(1, RANKING, "v", CLOCK, keep_slots=4)  # fired at slot 1's end: 2 is redone too
    want = in_order([(first[0], observed[0]), (updated, late_outcomes), (piece(2, 1, 0.4), observed[2])])
    assert [r.slot for r in again] == [1, 2]
    for got, expected in zip(again, want[1:]):
        assert all(s.revision == 1 and s.is_update for s in got.scores)
        assert [s.t_beh for s in got.scores] == pytest.approx([s.t_beh for s in expected.scores])
        assert [r.candidates for r in got.rankings] == [r.candidates for r in expected.rankings]
    # slot 2's own inputs did not change, but the late outcomes of slot 1 moved its shift
    assert again[1].scores[0].t_beh > before[2].scores[0].t_beh + 0.01


def test_a_slot_whose_inputs_and_shift_did_not_change_is_not_published_again() -> None:
    publisher = SlotPublisher(OnlineShift.start(RecalibrationConfig(guard=0.0)))
    p = piece(0, 0, 0.4)
    publisher.add_pieces([p])
    assert len(publisher.publish(0, RANKING, "v", CLOCK, keep_slots=2)) == 1
    publisher.add_pieces([p])  # the same version again: nothing new
    assert publisher.publish(0, RANKING, "v", CLOCK, keep_slots=2) == []
    assert SlotPublisher(None).publish(0, RANKING, "v", CLOCK, keep_slots=2) == []  # nothing scored yet
