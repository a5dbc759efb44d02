"""Real logs: the Bitcoin-OTC copy imports into valid events with two-week slots; bad rows are counted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from model.config import SlotClock
from model.logs import LogMapping, import_log
from schemas import CollaborationEvent, from_arrow
from trustbeam.cli import main

BITCOIN = Path(__file__).resolve().parents[1] / "data" / "bitcoin-otc" / "soc-sign-bitcoinotc.csv"


def test_bitcoin_otc_imports_completely(tmp_path, capsys) -> None:
    assert main(["import-log", "--csv", str(BITCOIN), "--no-header", "--owner-col", "0", "--collaborator-col", "1",
                 "--outcome-col", "2", "--time-col", "3", "--outcome-range", "-10", "10", "--slot-days", "14",
                 "--out", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["events"] + sum(report["left_out"].values()) == 35_592
    assert report["events"] == 35_592 and report["devices"] == 5_881
    events = pq.read_table(tmp_path / "events.parquet")
    clock = SlotClock.from_metadata(events.schema.metadata)
    assert clock.slot_ms == 14 * 86_400_000 and clock.origin_ms % 86_400_000 == 0
    assert (clock.slot_of(events["event_time_ms"].to_numpy()) == events["slot"].to_numpy()).all()
    assert 130 <= report["slots"] <= 140  # Nov 2010 - Jan 2016 in two-week slots
    reliability = events["reliability"].to_numpy()
    assert reliability.min() == 0.0 and reliability.max() == 1.0
    first = from_arrow(CollaborationEvent, events.slice(0, 100).drop(["slot"]))
    assert first[0].owner == "6" and first[0].collaborator == "2" and first[0].reliability == pytest.approx(0.7)


def test_bad_rows_are_counted_by_reason(tmp_path) -> None:
    log = tmp_path / "log.csv"
    log.write_text("rater,ratee,score,when\n"
                   "a,b,5,100\n"      # kept
                   "a,a,5,100\n"      # self-rating
                   "a,c,11,100\n"     # outside range
                   "a,,3,100\n"       # missing
                   "b,c,0,-5\n"       # negative time
                   "b,c,10,200\n")    # kept
    mapping = LogMapping("rater", "ratee", "when", "score", (0, 10))
    events, dropped = import_log(log, mapping, slot_days=1)
    assert events.num_rows == 2 and events["reliability"].to_pylist() == [0.5, 1.0]
    assert dropped == {"missing value": 1, "owner == collaborator": 1, "outcome outside range": 1, "negative time": 1}
    with pytest.raises(ValueError, match="--owner-col: no column 'who'"):
        import_log(log, LogMapping("who", "ratee", "when", "score", (0, 10)), 1)
    with pytest.raises(ValueError, match="--outcome-range"):
        LogMapping("rater", "ratee", "when", "score", (1, 1))
