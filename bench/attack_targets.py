"""The manipulation targets, read off ``trustbeam evaluate --attack`` reports: one row per report (one attack kind).

For each report (its ``report.json``), BM's figures against:

* the best rule: of the report's rule methods (:data:`model.baselines.RULES`), the one with the lowest error against
  the truth on honest owners' test edges (``rmse_truth_honest``, else ``rmse_truth``);
* the oracle (the hidden truth selecting) and, where the report has it, the Bayes filter (what the outcomes allow).

Targets (per kind, 20 % attackers): under the expected-value rule BM hands attackers at most ``EV_VS_RULE`` × what
the best rule does (``attack_tasks_won_expected``); under the paper's rule at most ``PAPER_VS_ORACLE`` × the
oracle's share (``attack_tasks_won``); VoC at θ = 0.7 (paper's rule) at least ``VOC_VS_ORACLE`` × the oracle's;
whitewashers' share in their first slots under a new id at most their share before leaving, by the paper's rule
(which follows VoC: in some worlds the oracle's own whitewashers fail it) and by the expected-value rule (``(ev)``).
The success rule (the highest P(success) · T_res × VoC among T ≥ θ, ``attack_tasks_won_success``) is held to the
expected-value rule's mark against the best rule's share by the same rule. Each row also gives
honest devices' T_beh − truth (``honest_trust_shift``; under bad-mouthing it should stay within 0.05 of a run
without the attack). A target a report cannot judge (no oracle, no whitewashers) is left blank.

Reports of one setting (:func:`setting`: the attack and the world options its runs set, such as ``--id-spread-m`` or
``--rejoin-after``), two or more of them (one seed each, say), are pooled in a further row: each figure's and ratio's
mean over them, the standard error of ``÷ rule`` between them, and the paired difference of BM's share and the best
rule's (``won − rule's (ev)``, mean and standard error): a share of a few dozen tasks moves between worlds as much as
the methods differ, so a claim over worlds is read from this row. Its verdicts are those of the mean ratios (and of
whitewashers' mean share under a new id against their mean share before leaving).

Run: ``python -m bench.attack_targets out/eval-onoff out/eval-sybil ...`` (instant: it reads the reports).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from bench import verdicts
from bench.report import emit
from bench.verdicts import (figure, grouped, load_report, mean_of, means, ratio, seeds, standard_error, verdict,
                             voc_at)
from model.baselines import RULES
from simulator.config import attack_setting, parse_attack

EV_VS_RULE = 0.5
PAPER_VS_ORACLE = 1.5
VOC_VS_ORACLE = 0.85
THETA = 0.7
WORLD_OPTIONS = {"telemetry": False, "quick": False, "mix": None, "id_spread_m": 0.0, "rejoin_after": 1,
                 "whitewash_from": 0, "churn": 0.0, "leave": 0.0, "overclaimer_cpu_hz": None, "fake_load": None,
                 "fake_burn": False}  # the options of a report's setup that make another world, and their defaults
POOLED = ("won (ev)", "rule's (ev)", "÷ rule", "won (paper)", "÷ oracle", "voc ÷ oracle", "won (success)",
          "÷ rule (success)", "bayes ÷ rule (ev)", "÷ bayes (ev)", "bayes ÷ rule (success)", "share before",
          "share after", "share before (ev)", "share after (ev)", "honest shift")  # the figures a pooled row averages
WHITEWASH_RULES = (("", ""), ("_expected", " (ev)"))  # a whitewasher's shares by the paper's and the expected-value
#                                                      rule: the report's suffix, the row's label


def read_report(path: Path) -> dict[str, Any]:
    """A report.json (``path`` or the directory holding it); refuses, by name, one without an attack."""
    report = load_report(path)
    if not report.get("setup", {}).get("attack"):
        raise ValueError(f"{path}: setup.attack={report.get('setup', {}).get('attack')!r}: not a run with attackers")
    return report


def best_rule(report: dict[str, Any]) -> str:
    """The report's rule with the lowest error against the truth on honest owners' edges."""
    rules = [m for m in report if m in RULES and "attack_tasks_won_expected" in report[m]]
    error = "rmse_truth_honest" if rules and all("rmse_truth_honest" in report[m] for m in rules) else "rmse_truth"
    return verdicts.best_rule(report, error, needs="attack_tasks_won_expected")


def setting(setup: dict[str, Any]) -> str:
    """The attack of a report's runs and each world option they set away from its default (:data:`WORLD_OPTIONS`,
    and the outcomes' reporters and task sizes the attack asks for, :func:`simulator.config.attack_setting`), e.g.
    ``"whitewashing=0.2, id_spread_m=50.0, rejoin_after=8"``."""
    defaults = {**WORLD_OPTIONS, **attack_setting(parse_attack(setup["attack"]))}
    options = [f"{key}={setup[key]}" for key, default in defaults.items()
               if key != "attack" and key in setup and setup[key] != default]
    return ", ".join([setup["attack"], *options])


def target_row(report: dict[str, Any], method: str = "bm") -> dict[str, Any]:
    """One report's row: the attack, the best rule, and each target's figures and verdict."""
    setup, rule = report["setup"], best_rule(report)
    ev, ev_rule = (figure(report, m, "attack_tasks_won_expected") for m in (method, rule))
    paper, paper_oracle = (figure(report, m, "attack_tasks_won") for m in (method, "oracle"))
    voc = [voc_at(report, m, THETA) for m in (method, "oracle")]
    row = {"attack": setting(setup), "seeds": seeds(setup),
           "best rule": rule, "won (ev)": ev, "rule's (ev)": ev_rule, "÷ rule": ratio(ev, ev_rule),
           "won (paper)": paper, "÷ oracle": ratio(paper, paper_oracle), "voc ÷ oracle": ratio(*voc)}
    success, success_rule = (figure(report, m, "attack_tasks_won_success") for m in (method, rule))
    row["won (success)"], row["÷ rule (success)"] = success, ratio(success, success_rule)
    if "bayes" in report:  # what the outcomes allow: the filter against the rule, BM against the filter
        bayes = figure(report, "bayes", "attack_tasks_won_expected")
        row["bayes ÷ rule (ev)"], row["÷ bayes (ev)"] = ratio(bayes, ev_rule), ratio(ev, bayes)
        row["bayes ÷ rule (success)"] = ratio(figure(report, "bayes", "attack_tasks_won_success"), success_rule)
    for suffix, label in WHITEWASH_RULES:
        before, after = (figure(report, method, f"whitewash_share_{when}{suffix}") for when in ("before", "after"))
        if not math.isnan(before):
            row[f"share before{label}"], row[f"share after{label}"] = before, after
            row[f"new id ÷ before{label}"] = ratio(after, before)
    row["honest shift"] = figure(report, method, "honest_trust_shift")
    return {**row, **target_verdicts(row)}


def target_verdicts(row: dict[str, Any]) -> dict[str, str]:
    """Each target's verdict on a row of figures (a report's, or the means of a pooled row)."""
    out = {"ev target": verdict(row["÷ rule"], row["÷ rule"] <= EV_VS_RULE),
           "success target": verdict(row["÷ rule (success)"], row["÷ rule (success)"] <= EV_VS_RULE),
           "paper target": verdict(row["÷ oracle"], row["÷ oracle"] <= PAPER_VS_ORACLE),
           "voc target": verdict(row["voc ÷ oracle"], row["voc ÷ oracle"] >= VOC_VS_ORACLE)}
    for _, label in WHITEWASH_RULES:  # a whitewasher's share under a new id at most its share before leaving
        if f"share before{label}" in row:
            after, before = row[f"share after{label}"], row[f"share before{label}"]
            out[f"whitewash target{label}"] = verdict(after, after <= before)
    return out


def pooled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per setting of two or more of ``rows`` (reports' rows), a row of each figure's mean over them (NaNs left out),
    the standard error of ``÷ rule`` between them, the ratio of the mean shares, the paired difference of the shares
    handed to attackers by the method and by each report's best rule (mean and standard error), and the verdicts of
    the means (a whitewasher's share under a new id: the mean after ÷ the mean before)."""
    out = []
    for attack, group in grouped(rows, "attack").items():
        if len(group) < 2:
            continue
        row: dict[str, Any] = {"attack": attack, "seeds": f"{len(group)} reports", "best rule": "",
                               **means(group, POOLED)}
        row["÷ rule s.e."] = standard_error(r["÷ rule"] for r in group)
        row["÷ rule, shares pooled"] = ratio(row["won (ev)"], row["rule's (ev)"])  # no world's low share weighs more
        for _, label in WHITEWASH_RULES:  # whitewashers: their mean share under a new id ÷ their mean share before
            if f"share before{label}" in row:
                row[f"new id ÷ before{label}"] = ratio(row[f"share after{label}"], row[f"share before{label}"])
        differences = [r["won (ev)"] - r["rule's (ev)"] for r in group]
        row["won − rule's (ev)"], row["won − rule's s.e."] = mean_of(differences), standard_error(differences)
        out.append({**row, **target_verdicts(row)})
    return out


def target_rows(reports: list[dict[str, Any]], method: str = "bm") -> list[dict[str, Any]]:
    """A row per report, then a pooled row per setting of two or more reports."""
    rows = [target_row(report, method) for report in reports]
    return rows + pooled(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="report.json files or the directories holding them")
    parser.add_argument("--method", default="bm", help="the method judged (default bm)")
    args = parser.parse_args()
    rows = target_rows([read_report(path) for path in args.reports], args.method)
    emit("attack_targets", rows, {"method": args.method, "reports": [str(p) for p in args.reports]})


if __name__ == "__main__":
    main()
