"""Parquet sink: partitioned by slot date, read back equal, updates replace, writes are atomic."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from exporters import parquet as sink
from exporters.parquet import ParquetResults, read_results, slot_date
from model.published import SlotScores
from schemas import CollaboratorRanking, Columns, Nested, RankedCandidate, TrustScore, from_arrow, from_json
from tests.pipeline_fixtures import run_tables, write_checkpoint
from trustbeam.cli import main

DAY_MS = 86_400_000
START = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def result(slot: int, start_ms: int, t_beh: float = 0.5, is_update: bool = False) -> SlotScores:
    common = dict(slot=slot, slot_start_ms=start_ms, slot_end_ms=start_ms + 60_000, model_version="bm-test",
                  is_update=is_update)
    scores = Columns.of(TrustScore, 2, owner="a", collaborator=["b", "c"], t_beh=t_beh, t_res=0.8, trust=t_beh * 0.8,
                        **common)
    candidates = Columns.of(RankedCandidate, 1, collaborator="b", trust=t_beh * 0.8, voc=0.7)
    ranking = Columns.of(CollaboratorRanking, 1, owner="a", threshold=0.3, candidates=Nested.of(candidates, [1]),
                         **common)
    return SlotScores(slot, scores, ranking)


def test_slots_land_in_their_date_partition_and_read_back_equal(tmp_path) -> None:
    results = ParquetResults(str(tmp_path))
    written = results.write(result(3, START)) + results.write(result(1443, START + DAY_MS + 3000))
    assert sorted(p.split(str(tmp_path))[1] for p in written) == [
        "/collaborator_rankings/date=2026-01-01/slot-00000003-0000.parquet",
        "/collaborator_rankings/date=2026-01-02/slot-00001443-0000.parquet",
        "/trust_scores/date=2026-01-01/slot-00000003-0000.parquet",
        "/trust_scores/date=2026-01-02/slot-00001443-0000.parquet"]
    scores = read_results(str(tmp_path), "trust_scores")
    assert sorted(scores["date"].to_pylist()) == ["2026-01-01"] * 2 + ["2026-01-02"] * 2
    assert sorted(from_arrow(TrustScore, scores), key=lambda r: (r.slot, r.collaborator)) == \
        [*result(3, START).scores, *result(1443, START + DAY_MS + 3000).scores]
    rankings = from_arrow(CollaboratorRanking, read_results(str(tmp_path), "collaborator_rankings"))
    assert sorted(rankings, key=lambda r: r.slot)[0] == result(3, START).rankings[0]  # nested candidates intact
    assert slot_date(START - 1) == "2025-12-31"


def test_an_update_replaces_the_slot_file(tmp_path) -> None:
    results = ParquetResults(str(tmp_path))
    results.write(result(7, START, t_beh=0.5))
    results.write(result(7, START, t_beh=0.9, is_update=True))
    scores = from_arrow(TrustScore, read_results(str(tmp_path), "trust_scores"))
    assert len(scores) == 2 and {(s.t_beh, s.is_update) for s in scores} == {(0.9, True)}


def test_a_failed_write_leaves_nothing_visible(tmp_path, monkeypatch) -> None:
    results = ParquetResults(str(tmp_path))
    results.write(result(7, START, t_beh=0.5))

    def broken(table, where, **kwargs):
        where.write(b"PAR1 half a file")
        raise OSError("disk full")

    monkeypatch.setattr(sink.pq, "write_table", broken)
    with pytest.raises(OSError, match="disk full"):
        results.write(result(7, START, t_beh=0.9, is_update=True))
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert files == ["slot-00000007-0000.parquet"] * 2  # the old version, no temporary files
    assert {s.t_beh for s in from_arrow(TrustScore, read_results(str(tmp_path), "trust_scores"))} == {0.5}


def test_trustbeam_score_writes_the_same_records_to_parquet(tmp_path, capsys) -> None:
    checkpoint = write_checkpoint(tmp_path / "model")
    events, status = run_tables()
    pq.write_table(events, tmp_path / "events.parquet")
    pq.write_table(status, tmp_path / "status.parquet")
    assert main(["score", "--events", str(tmp_path / "events.parquet"), "--status", str(tmp_path / "status.parquet"),
                 "--out", str(tmp_path / "out"), "--checkpoint", str(checkpoint),
                 "--parquet_out", str(tmp_path / "lake")]) == 0
    assert json.loads(capsys.readouterr().out)["parquet_out"] == str(tmp_path / "lake")
    jsonl = [from_json(TrustScore, line) for line in (tmp_path / "out" / "trust-scores.jsonl").read_bytes().splitlines()]
    lake = from_arrow(TrustScore, read_results(str(tmp_path / "lake"), "trust_scores"))
    key = (lambda r: (r.slot, r.owner, r.collaborator))
    assert sorted(lake, key=key) == sorted(jsonl, key=key) and len(lake) > 0
