"""TrustGuard's single-timeslot protocol: AUC and MCC by hand, thresholds from the last training snapshot, and
the protocol end to end on a small graded log where distrust follows the trustee (the learned rule too)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from model.snapshots import auc, best_threshold, blend_weight, mcc, percentiles
from trustbeam.cli import main


def test_auc_by_hand_with_ties() -> None:
    label = np.array([True, False, True, False])
    # positives 0.9 and 0.5, negatives 0.5 and 0.1: pairs (0.9 > 0.5), (0.9 > 0.1), (0.5 = 0.5: half), (0.5 > 0.1)
    assert auc(np.array([0.9, 0.5, 0.5, 0.1]), label) == pytest.approx(3.5 / 4)
    assert auc(np.array([0.1, 0.9, 0.2, 0.8]), label) == 0.0
    assert np.isnan(auc(np.array([0.3, 0.4]), np.array([True, True])))


def test_mcc_and_threshold_by_hand() -> None:
    label = np.array([True, True, False, False, False])
    predicted = np.array([True, False, True, False, False])  # tp 1, fn 1, fp 1, tn 2
    assert mcc(predicted, label) == pytest.approx((1 * 2 - 1 * 1) / np.sqrt(2 * 2 * 3 * 3))
    assert mcc(np.zeros(5, bool), label) == 0.0  # undefined: a constant prediction
    score = np.array([0.9, 0.7, 0.6, 0.2, 0.1])
    assert best_threshold(score, label) == 0.7  # distrust at >= 0.7 separates them exactly (MCC 1)


def test_percentiles_and_the_blend_weight_by_hand() -> None:
    # ranks 1, 2.5, 2.5, 4 of 4 -> mid-rank shares (rank - 0.5) / 4
    np.testing.assert_allclose(percentiles(np.array([0.1, 0.5, 0.5, 9.0])), [0.125, 0.5, 0.5, 0.875])
    label = np.array([True, True, False, False])
    separates, reversed_ = np.array([0.9, 0.8, 0.2, 0.1]), np.array([0.1, 0.2, 0.8, 0.9])
    # BM's shares 7/8, 5/8 | 3/8, 1/8 against the rule's reverse: the mix separates from w = 0.6 on (w = 0.5 is flat)
    assert blend_weight(separates, reversed_, label) == pytest.approx(0.6)
    assert blend_weight(reversed_, separates, label) == 0.0  # the rule alone has AUC 1
    assert blend_weight(separates, separates, label) == 0.0  # ties go to the rule
    assert blend_weight(separates, reversed_, np.array([True] * 4)) == 0.0  # AUC undefined: the rule


def write_log(path, seed: int = 0) -> None:
    """Ratings among 40 accounts over time: 8 scammers are mostly rated -5, the rest +5."""
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(3000):
        rater, ratee = rng.choice(40, size=2, replace=False)
        scam = ratee < 8
        rating = -5 if (scam and rng.random() < 0.8) or (not scam and rng.random() < 0.05) else 5
        rows.append(f"{rater},{ratee},{rating},{1_300_000_000 + k * 3600}")
    path.write_text("\n".join(rows) + "\n")


def test_the_protocol_end_to_end(tmp_path, capsys) -> None:
    write_log(tmp_path / "log.csv")
    assert main(["import-log", "--csv", str(tmp_path / "log.csv"), "--no-header", "--owner-col", "0",
                 "--collaborator-col", "1", "--outcome-col", "2", "--time-col", "3", "--outcome-range", "-10", "10",
                 "--slot-days", "7", "--out", str(tmp_path / "log")]) == 0
    capsys.readouterr()
    out = tmp_path / "report"
    assert main(["evaluate", "--quick", "--epochs", "1", "--quiet", "--protocol", "snapshots", "--snapshots", "5",
                 "--events", str(tmp_path / "log" / "events.parquet"), "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    for method in ("bm", "distrust_share", "distrust_logit"):
        rounds = report[method]["rounds"]
        assert [r["k"] for r in rounds] == [3, 4, 5]  # train on 1..k, predict k + 1
        assert all(r["ratings"] > 100 for r in rounds)
        assert report[method]["auc"] == pytest.approx(np.mean([r["auc"] for r in rounds]))
        assert report[method]["auc"] > 0.8 and report[method]["mcc"] > 0.5  # distrust follows the trustee
    blend, rule = report["bm_blend"]["rounds"], report["distrust_logit"]["rounds"]
    assert blend[0] == {**rule[0], "weight": 0.0}  # no out-of-sample evidence for BM yet: the learned rule alone
    assert [r["k"] for r in blend] == [3, 4, 5] and all(0.0 <= r["weight"] <= 1.0 for r in blend)
    assert report["bm_blend"]["auc"] > 0.8
    assert "| bm |" in (out / "report.md").read_text() and "| bm_blend |" in (out / "report.md").read_text()
    assert main(["evaluate", "--quick", "--quiet", "--protocol", "snapshots", "--out", str(out)]) == 2
    assert "needs --events" in capsys.readouterr().err


def test_the_learned_rule_reads_only_the_snapshots_before_and_ages_them() -> None:
    import pyarrow as pa

    from model.snapshots import rating_log

    events = pa.table({"owner": ["a", "b", "c", "d"], "collaborator": ["b", "c", "d", "a"],
                       "reliability": [0.1, 0.9, 0.8, 0.2]})
    snapshot = np.array([0, 1, 1, 2])
    log = rating_log(events, snapshot, 2)  # the forecast of snapshot 2 reads snapshots 0 and 1
    assert log.owner.tolist() == ["a", "b", "c"] and log.grade.tolist() == [0.1, 0.9, 0.8]
    assert log.age.tolist() == [1.0, 0.0, 0.0]  # snapshot 1 is the last one before: age 0
    assert len(rating_log(events, snapshot, 0).owner) == 0
