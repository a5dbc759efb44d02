"""The targets of trust on data it has not seen, read off ``trustbeam evaluate`` reports: a row per report, and one
per setting pooling its reports (the mean of each figure over them, the standard error of BM's ratio to the rule).

Each report is one setting (:func:`setting`): the simulated paper setting, the simulated setting with telemetry
(``--telemetry``), or a recorded log (``--events``). BM's error is against the hidden truth where simulated
(``rmse_truth``), against the next slot's T_col on a log (``rmse``); the best rule is the report's rule method
(:data:`model.baselines.RULES`) with the lowest such error. Targets:

* paper setting: at most :data:`PAPER_VS_RULE` × the best rule's error, and at most every other encoder's
  (:data:`ENCODERS`, those the report has);
* with telemetry: at most :data:`TELEMETRY_VS_RULE` × the best rule's; on each class whose load carries its
  behaviour (:data:`TRACED`) at most :data:`TRACED_VS_RULE` × the rule's there, or, where the report has the Bayes
  filter (``bayes``, the ceiling), within :data:`CEILING_SLACK` × the filter's;
* simulated, both: VoC at θ = 0.7 (the paper's rule) at least :data:`VOC_VS_ORACLE` × the oracle's; beside it, no
  target, the VoC by the success rule (P(success) x T_res x VoC, :func:`model.trust.select`) against the best rule's
  (``success voc ÷ rule``);
* a log: at most every rule's error (the training period's mean is one); :data:`MEAN_GAIN` below the mean's wherever
  any method of the report is; MAE at most the mean's; ECE at most :data:`MAX_ECE`.

A target a report cannot judge (no oracle, no Bayes filter, no other encoder) is left blank.

Run: ``python -m bench.trust_targets out/seed-2131 out/seed-2132 ... [--method bm_online]`` (instant: it reads the
reports).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from bench.report import emit
from bench.verdicts import (best_rule, figure, grouped, load_report, means, ratio, seeds, standard_error, verdict,
                             voc_at)

PAPER_VS_RULE = 0.97
TELEMETRY_VS_RULE = 0.85
TRACED_VS_RULE = 0.7
CEILING_SLACK = 1.1
VOC_VS_ORACLE = 0.9
THETA = 0.7
MEAN_GAIN = 0.02
MAX_ECE = 0.02
TRACED = ("degrading", "recovering", "periodic")  # the classes whose reported load carries their behaviour
ENCODERS = ("lstm", "transformer", "gnn", "gnn_pool", "bm_paper")  # the other encoders (and the paper's literal head)
RATIOS = ("÷ rule", "÷ encoders", "voc ÷ oracle", "expected voc ÷ oracle", "success voc ÷ rule", "÷ mean",
          "best ÷ mean", "mae ÷ mean's", "ece", *(f"{label} ÷ {of}" for label in TRACED for of in ("rule", "bayes")))


def read_report(path: Path) -> dict[str, Any]:
    """A report.json (``path`` or the directory holding it); refuses, by name, one with attackers (those are
    :mod:`bench.attack_targets`'s)."""
    report = load_report(path)
    attack = report.get("setup", {}).get("attack")
    if attack:
        raise ValueError(f"{path}: setup.attack={attack!r}: a run with attackers (see bench.attack_targets)")
    return report


def setting(setup: dict[str, Any]) -> str:
    """"log" (a recorded log: no simulation), "telemetry" or "paper"."""
    return "log" if setup.get("simulation") is None else "telemetry" if setup.get("telemetry") else "paper"


def report_figures(report: dict[str, Any], method: str = "bm") -> dict[str, Any]:
    """One report's figures: its setting and seeds, the best rule, and ``method``'s ratios (:data:`RATIOS`, those the
    setting has)."""
    setup = report["setup"]
    kind = setting(setup)
    error = "rmse" if kind == "log" else "rmse_truth"
    rule = best_rule(report, error)
    own = figure(report, method, error)
    row: dict[str, Any] = {"setting": kind, "seeds": seeds(setup),
                           "best rule": rule, "error": own, "÷ rule": ratio(own, figure(report, rule, error))}
    if kind == "log":
        errors = [figure(report, m, error) for m in report if isinstance(report[m], dict) and error in report[m]]
        mean = figure(report, "mean", error)
        row["÷ mean"], row["best ÷ mean"] = ratio(own, mean), ratio(min(errors), mean)
        row["mae ÷ mean's"] = ratio(figure(report, method, "mae"), figure(report, "mean", "mae"))
        row["ece"] = figure(report, method, "ece")
        return row
    encoders = [ratio(own, figure(report, m, error)) for m in ENCODERS if m != method and m in report]
    row["÷ encoders"] = max(encoders) if encoders else math.nan
    row["voc ÷ oracle"] = ratio(voc_at(report, method, THETA), voc_at(report, "oracle", THETA))
    # the same choices scored by expectation, free of the outcome draws' noise (reports since stop 85; else NaN)
    row["expected voc ÷ oracle"] = ratio(*(voc_at(report, m, THETA, "expected_voc") for m in (method, "oracle")))
    row["success voc ÷ rule"] = ratio(*(voc_at(report, m, THETA, "voc_success") for m in (method, rule)))
    if kind == "telemetry":
        by_class = {m: report.get(m, {}).get("rmse_truth_by_behaviour", {}) for m in (method, rule, "bayes")}
        for label in TRACED:
            own_class, rule_class, ceiling = (by_class[m].get(label, {}).get("mean", math.nan)
                                              for m in (method, rule, "bayes"))
            row[f"{label} ÷ rule"], row[f"{label} ÷ bayes"] = ratio(own_class, rule_class), ratio(own_class, ceiling)
    return row


def verdicts(row: dict[str, Any]) -> dict[str, str]:
    """Each target's verdict on a row of figures (a report's or a setting's pooled)."""
    if row["setting"] == "log":
        gain = row["÷ mean"] <= 1 - MEAN_GAIN or row["best ÷ mean"] > 1 - MEAN_GAIN
        return {"rule target": verdict(row["÷ rule"], row["÷ rule"] <= 1),
                "mean gain target": verdict(row["÷ mean"], gain),
                "mae target": verdict(row["mae ÷ mean's"], row["mae ÷ mean's"] <= 1),
                "ece target": verdict(row["ece"], row["ece"] <= MAX_ECE)}
    paper = row["setting"] == "paper"
    out = {"rule target": verdict(row["÷ rule"], row["÷ rule"] <= (PAPER_VS_RULE if paper else TELEMETRY_VS_RULE))}
    if paper:
        out["encoders target"] = verdict(row["÷ encoders"], row["÷ encoders"] <= 1)
    out["voc target"] = verdict(row["voc ÷ oracle"], row["voc ÷ oracle"] >= VOC_VS_ORACLE)
    for label in TRACED if not paper else ():
        by_rule, by_ceiling = row[f"{label} ÷ rule"], row[f"{label} ÷ bayes"]
        out[f"{label} target"] = verdict(by_rule, by_rule <= TRACED_VS_RULE or by_ceiling <= CEILING_SLACK)
    return out


def pooled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setting, a row of each ratio's mean over its reports (NaNs left out) and the standard error of
    ``÷ rule`` over them (reports of one seed each make it the spread between seeds)."""
    out = []
    for kind, group in grouped(rows, "setting").items():
        row: dict[str, Any] = {"setting": kind, "seeds": f"{len(group)} report" + "s" * (len(group) > 1),
                               "best rule": "", **means(group, ("error", *RATIOS))}
        row["÷ rule s.e."] = standard_error(r["÷ rule"] for r in group)
        out.append(row)
    return out


def target_rows(reports: list[dict[str, Any]], method: str = "bm") -> list[dict[str, Any]]:
    """A row per report, then a pooled row per setting, each with its verdicts."""
    rows = [report_figures(report, method) for report in reports]
    return [{**row, **verdicts(row)} for row in rows + pooled(rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="report.json files or the directories holding them")
    parser.add_argument("--method", default="bm", help="the method judged (default bm; on a log, bm_online is what "
                                                       "the job publishes)")
    args = parser.parse_args()
    rows = target_rows([read_report(path) for path in args.reports], args.method)
    emit("trust_targets", rows, {"method": args.method, "reports": [str(p) for p in args.reports]})


if __name__ == "__main__":
    main()
