"""bench/attack_targets.py against hand-computed figures of small made-up reports."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.attack_targets import best_rule, read_report, setting, target_row, target_rows
from model.voc import THETAS


def _figure(mean: float) -> dict:
    return {"mean": mean, "std": 0.0}


def _voc(at_07: float) -> dict:
    return {"mean": [at_07 if theta == 0.7 else 0.0 for theta in THETAS], "std": [0.0] * len(THETAS)}


def _method(won_ev: float, won_paper: float, rmse: float, voc: float, **more: float) -> dict:
    return {"attack_tasks_won_expected": _figure(won_ev), "attack_tasks_won": _figure(won_paper),
            "rmse_truth_honest": _figure(rmse), "voc": _voc(voc), **{k: _figure(v) for k, v in more.items()}}


def _succeeding(method: dict, won: float) -> dict:
    """``method`` with the share of tasks the success rule hands attackers."""
    return {**method, "attack_tasks_won_success": _figure(won)}


def _report(attack: str | None, seed: int = 700, options: dict | None = None, **methods: dict) -> dict:
    return {"setup": {"attack": attack, "seed": seed, "runs_done": 2, **(options or {})}, **methods}


def test_bm_is_judged_against_the_rule_with_the_lowest_error_and_the_oracle() -> None:
    report = _report("sybil=0.2",
                     bm=_succeeding(_method(0.01, 0.15, 0.07, 0.68, honest_trust_shift=-0.02), 0.03),
                     channel_beta=_succeeding(_method(0.04, 0.16, 0.08, 0.66), 0.05),  # the lower error: the best rule
                     mean=_succeeding(_method(0.002, 0.10, 0.18, 0.30), 0.001),  # hands attackers least, forecasts worst
                     oracle=_method(0.0, 0.12, 0.0, 0.80),
                     bayes=_succeeding(_method(0.03, 0.13, 0.06, 0.72), 0.02))
    assert best_rule(report) == "channel_beta"
    row = target_row(report)
    assert row["attack"] == "sybil=0.2" and row["seeds"] == "700-701" and row["best rule"] == "channel_beta"
    assert row["÷ rule"] == pytest.approx(0.25) and row["ev target"] == "met"  # 0.01 / 0.04 <= 0.5
    assert row["÷ oracle"] == pytest.approx(1.25) and row["paper target"] == "met"  # 0.15 / 0.12 <= 1.5
    assert row["voc ÷ oracle"] == pytest.approx(0.85) and row["voc target"] == "met"  # 0.68 / 0.80 >= 0.85
    assert row["bayes ÷ rule (ev)"] == pytest.approx(0.75) and row["÷ bayes (ev)"] == pytest.approx(1 / 3)
    assert row["won (success)"] == pytest.approx(0.03) and row["÷ rule (success)"] == pytest.approx(0.6)
    assert row["success target"] == "not met" and row["bayes ÷ rule (success)"] == pytest.approx(0.4)  # 0.03 / 0.05
    assert row["honest shift"] == pytest.approx(-0.02) and "whitewash target" not in row


def test_targets_missed_and_whitewashers_judged_by_their_share_before_leaving() -> None:
    report = _report("whitewashing=0.2",
                     bm=_method(0.03, 0.20, 0.07, 0.60, whitewash_share_before=0.0010, whitewash_share_after=0.0015),
                     channel_beta=_method(0.05, 0.18, 0.08, 0.66),
                     oracle=_method(0.0, 0.12, 0.0, 0.80))
    row = target_row(report)
    assert row["÷ rule"] == pytest.approx(0.6) and row["ev target"] == "not met"
    assert row["÷ oracle"] == pytest.approx(5 / 3) and row["paper target"] == "not met"
    assert row["voc ÷ oracle"] == pytest.approx(0.75) and row["voc target"] == "not met"
    assert row["new id ÷ before"] == pytest.approx(1.5) and row["whitewash target"] == "not met"
    assert "bayes ÷ rule (ev)" not in row
    assert math.isnan(row["÷ rule (success)"]) and row["success target"] == ""  # a report from before the success rule


def test_a_report_without_an_oracle_leaves_its_targets_blank() -> None:
    row = target_row(_report("on-off=0.2", bm=_method(0.05, 0.06, 0.08, 0.7), beta=_method(0.05, 0.05, 0.09, 0.6)))
    assert row["best rule"] == "beta" and row["ev target"] == "not met"
    assert math.isnan(row["÷ oracle"]) and row["paper target"] == "" and row["voc target"] == ""


def test_reports_without_attackers_or_rules_are_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "report.json").write_text(json.dumps(_report(None, bm=_method(0.0, 0.0, 0.07, 0.7))))
    with pytest.raises(ValueError, match="setup.attack=None"):
        read_report(tmp_path)
    with pytest.raises(ValueError, match="no rule method"):
        best_rule(_report("sybil=0.2", bm=_method(0.0, 0.0, 0.07, 0.7)))


def test_a_setting_names_the_world_options_its_runs_set_away_from_their_defaults() -> None:
    assert setting({"attack": "whitewashing=0.2", "id_spread_m": 50.0, "rejoin_after": 8, "churn": 0.0,
                    "owner_reports": 0.0, "task_size_spread": 1.0, "seed": 5}) == \
        "whitewashing=0.2, id_spread_m=50.0, rejoin_after=8"
    # a false-report attack has owners report by default, an opportunistic one tasks of differing sizes
    assert setting({"attack": "ballot-stuffing=0.2", "owner_reports": 1.0}) == "ballot-stuffing=0.2"
    assert setting({"attack": "ballot-stuffing=0.2", "owner_reports": 0.5}) == "ballot-stuffing=0.2, owner_reports=0.5"
    assert setting({"attack": "opportunistic=0.2", "task_size_spread": 4.0}) == "opportunistic=0.2"


def _whitewashed(won: float, rule: float, before: float, after: float, before_ev: float = 0.0,
                 after_ev: float = 0.0) -> dict:
    shares = {"whitewash_share_before": before, "whitewash_share_after": after,
              "whitewash_share_before_expected": before_ev, "whitewash_share_after_expected": after_ev}
    return {"bm": _method(won, 0.1, 0.07, 0.7, **shares),
            "channel_beta": _method(rule, 0.1, 0.08, 0.7), "oracle": _method(0.0, 0.1, 0.0, 0.8)}


def test_reports_of_one_setting_are_pooled_by_their_means_and_the_spread_between_them() -> None:
    away = {"rejoin_after": 8}
    reports = [_report("whitewashing=0.2", 700, away, **_whitewashed(0.02, 0.05, 0.0010, 0.0012, 0.0, 0.0002)),
               _report("whitewashing=0.2", 701, away, **_whitewashed(0.03, 0.02, 0.0020, 0.0016, 0.0004, 0.0)),
               _report("whitewashing=0.2", 702, **_whitewashed(0.01, 0.05, 0.0010, 0.0010))]  # another setting
    rows = target_rows(reports)
    # the setting of one report alone gets no pooled row
    assert [row["seeds"] for row in rows] == ["700-701", "701-702", "702-703", "2 reports"]
    pooled = rows[-1]
    assert pooled["attack"] == "whitewashing=0.2, rejoin_after=8"
    assert pooled["÷ rule"] == pytest.approx((0.4 + 1.5) / 2) and pooled["ev target"] == "not met"  # 0.95 > 0.5
    assert pooled["÷ rule s.e."] == pytest.approx(0.55)  # ratios 0.4 and 1.5: stdev 0.778, / sqrt(2)
    assert pooled["÷ rule, shares pooled"] == pytest.approx(0.025 / 0.035)
    assert pooled["won − rule's (ev)"] == pytest.approx(-0.01)  # -0.03 and +0.01
    assert pooled["won − rule's s.e."] == pytest.approx(0.02)
    # under a new id 0.0014 on the mean against 0.0015 before: met, though one report alone is not
    assert pooled["new id ÷ before"] == pytest.approx(0.0014 / 0.0015) and pooled["whitewash target"] == "met"
    assert rows[0]["whitewash target"] == "not met" and rows[1]["whitewash target"] == "met"
    # by the expected-value rule: a share where there was none before is not met (no ratio to read), the pool is
    assert rows[0]["whitewash target (ev)"] == "not met" and math.isnan(rows[0]["new id ÷ before (ev)"])
    assert pooled["new id ÷ before (ev)"] == pytest.approx(0.5) and pooled["whitewash target (ev)"] == "met"
    assert rows[2]["whitewash target (ev)"] == "met"  # none before, none after
    assert pooled["voc ÷ oracle"] == pytest.approx(0.875) and pooled["voc target"] == "met"
