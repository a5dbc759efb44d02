"""bench/trust_targets.py against hand-computed figures of small made-up reports."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.trust_targets import read_report, setting, target_rows
from model.voc import THETAS


def _figure(mean: float) -> dict:
    return {"mean": mean, "std": 0.0}


def _voc(at_07: float) -> dict:
    return {"mean": [at_07 if theta == 0.7 else 0.0 for theta in THETAS], "std": [0.0] * len(THETAS)}


def _simulated(rmse: float, voc: float | None = None, success: float | None = None, expected: float | None = None,
               **classes: float) -> dict:
    return {"rmse_truth": _figure(rmse), **({"voc": _voc(voc)} if voc is not None else {}),
            **({"voc_success": _voc(success)} if success is not None else {}),
            **({"expected_voc": _voc(expected)} if expected is not None else {}),
            "rmse_truth_by_behaviour": {label: _figure(v) for label, v in classes.items()}}


def _logged(rmse: float, mae: float, ece: float) -> dict:
    return {"rmse": _figure(rmse), "mae": _figure(mae), "ece": _figure(ece)}


def _report(seed: int, telemetry: bool = False, log: bool = False, runs: int = 1, **methods: dict) -> dict:
    setup = {"attack": None, "seed": seed, "runs_done": runs, "telemetry": telemetry,
             "simulation": None if log else {"devices": 500}}
    return {"setup": setup, **methods, "paired": {"metric": "rmse_truth"}}


def test_the_paper_setting_is_judged_against_the_best_rule_every_other_encoder_and_the_oracle() -> None:
    report = _report(200, runs=2,
                     bm=_simulated(0.0700, 0.73, 0.76, 0.72), lstm=_simulated(0.0710), gnn=_simulated(0.0690),
                     channel_beta=_simulated(0.0730, 0.70, 0.80), mean=_simulated(0.1800, 0.30, 0.9),  # channel_beta:
                     #                                                                        the best rule by error
                     oracle=_simulated(0.0, 0.80, expected=0.78))
    row, pooled = target_rows([report])
    assert row["setting"] == "paper" and row["seeds"] == "200-201" and row["best rule"] == "channel_beta"
    assert row["÷ rule"] == pytest.approx(0.07 / 0.073) and row["rule target"] == "met"  # 0.959 <= 0.97
    assert row["÷ encoders"] == pytest.approx(0.07 / 0.069) and row["encoders target"] == "not met"  # gnn is below
    assert row["voc ÷ oracle"] == pytest.approx(0.9125) and row["voc target"] == "met"  # 0.73 / 0.80 >= 0.9
    assert row["expected voc ÷ oracle"] == pytest.approx(0.72 / 0.78)  # scored by expectation: shown, not judged
    assert row["success voc ÷ rule"] == pytest.approx(0.95) and "success voc target" not in row  # no target: 0.76 / 0.8
    assert "periodic target" not in row  # no telemetry: no class carries a trace
    assert pooled["seeds"] == "1 report" and pooled["÷ rule"] == pytest.approx(row["÷ rule"])
    assert math.isnan(pooled["÷ rule s.e."])


def test_with_telemetry_each_traced_class_meets_its_mark_by_the_rule_or_within_reach_of_the_ceiling() -> None:
    classes = {"degrading": (0.030, 0.060, 0.020), "recovering": (0.040, 0.050, 0.035),  # bm, the rule, the filter
               "periodic": (0.070, 0.080, 0.050)}
    report = _report(300, telemetry=True,
                     **{m: _simulated(rmse, **{label: v[k] for label, v in classes.items()})
                        for k, (m, rmse) in enumerate((("bm", 0.060), ("channel_beta", 0.075), ("bayes", 0.050)))})
    row = target_rows([report])[0]
    assert row["setting"] == "telemetry" and row["÷ rule"] == pytest.approx(0.8) and row["rule target"] == "met"
    assert row["degrading ÷ rule"] == pytest.approx(0.5) and row["degrading target"] == "met"  # 0.5 <= 0.7
    assert row["recovering ÷ rule"] == pytest.approx(0.8) and row["recovering ÷ bayes"] == pytest.approx(0.04 / 0.035)
    assert row["recovering target"] == "not met"  # 0.8 > 0.7 and 1.14 > 1.1 the ceiling
    assert row["periodic ÷ rule"] == pytest.approx(0.875) and row["periodic target"] == "not met"
    assert row["voc target"] == "" and math.isnan(row["÷ encoders"])  # no oracle, no other encoder: blank
    assert math.isnan(row["success voc ÷ rule"]) and math.isnan(row["expected voc ÷ oracle"])  # neither in the report
    close = _report(301, telemetry=True, bm=_simulated(0.06, periodic=0.054),
                    channel_beta=_simulated(0.07, periodic=0.06), bayes=_simulated(0.05, periodic=0.05))
    assert target_rows([close])[0]["periodic target"] == "met"  # 0.9 the rule's, but 1.08 <= 1.1 the ceiling's


def test_reports_of_a_setting_pool_into_means_and_the_spread_between_seeds() -> None:
    reports = [_report(seed, telemetry=True, bm=_simulated(own), channel_beta=_simulated(0.1))
               for seed, own in ((400, 0.080), (401, 0.090), (402, 0.082))]
    rows = target_rows(reports + [_report(200, bm=_simulated(0.07), beta=_simulated(0.07))])
    assert [row["setting"] for row in rows] == ["telemetry"] * 3 + ["paper", "telemetry", "paper"]
    assert [row["÷ rule"] for row in rows[:3]] == pytest.approx([0.8, 0.9, 0.82])
    assert [row["rule target"] for row in rows[:3]] == ["met", "not met", "met"]
    pooled = rows[4]
    assert pooled["seeds"] == "3 reports" and pooled["÷ rule"] == pytest.approx(0.84) and pooled["rule target"] == "met"
    assert pooled["÷ rule s.e."] == pytest.approx(math.sqrt(0.0028) / math.sqrt(3))  # deviations -0.04, 0.06, -0.02
    assert rows[5]["÷ rule"] == pytest.approx(1.0) and rows[5]["rule target"] == "not met"  # the paper setting's own


def test_a_log_is_judged_against_its_mean_and_every_rule() -> None:
    report = _report(0, log=True, runs=3, bm=_logged(0.140, 0.080, 0.015), mean=_logged(0.150, 0.078, 0.004),
                     channel_beta=_logged(0.145, 0.085, 0.012), lstm=_logged(0.138, 0.081, 0.02))
    row = target_rows([report])[0]
    assert row["setting"] == "log" and row["best rule"] == "channel_beta"
    assert row["÷ rule"] == pytest.approx(0.140 / 0.145) and row["rule target"] == "met"
    assert row["÷ mean"] == pytest.approx(0.140 / 0.150) and row["best ÷ mean"] == pytest.approx(0.138 / 0.150)
    assert row["mean gain target"] == "met"  # 6.7 % below the mean's
    assert row["mae ÷ mean's"] == pytest.approx(0.080 / 0.078) and row["mae target"] == "not met"
    assert row["ece"] == pytest.approx(0.015) and row["ece target"] == "met"
    flat = _report(0, log=True, bm=_logged(0.149, 0.07, 0.01), mean=_logged(0.150, 0.078, 0.004),
                   lstm=_logged(0.145, 0.081, 0.02))  # lstm 3.3 % below the mean, BM 0.7 %: the gain is owed
    assert target_rows([flat])[0]["mean gain target"] == "not met" and setting(flat["setup"]) == "log"


def test_reports_with_attackers_or_without_rules_are_refused_by_name(tmp_path: Path) -> None:
    attacked = _report(600, bm=_simulated(0.07), channel_beta=_simulated(0.08))
    attacked["setup"]["attack"] = "sybil=0.2"
    (tmp_path / "report.json").write_text(json.dumps(attacked))
    with pytest.raises(ValueError, match="setup.attack='sybil=0.2'"):
        read_report(tmp_path)
    with pytest.raises(ValueError, match="seed 200: no rule method with 'rmse_truth'"):
        target_rows([_report(200, bm=_simulated(0.07), lstm=_simulated(0.07))])
