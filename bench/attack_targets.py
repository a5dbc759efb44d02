"""The manipulation targets, read off ``trustbeam evaluate --attack`` reports: one row per report (one attack kind).

For each report (its ``report.json``), BM's figures against:

* the best rule: of the report's rule methods (:data:`model.baselines.RULES`), the one with the lowest error against
  the truth on honest owners' test edges (``rmse_truth_honest``, else ``rmse_truth``);
* the oracle (the hidden truth selecting) and, where the report has it, the Bayes filter (what the outcomes allow).

Targets (per kind, 20 % attackers): under the expected-value rule BM hands attackers at most ``EV_VS_RULE`` × what
the best rule does (``attack_tasks_won_expected``); under the paper's rule at most ``PAPER_VS_ORACLE`` × the
oracle's share (``attack_tasks_won``); VoC at θ = 0.7 (paper's rule) at least ``VOC_VS_ORACLE`` × the oracle's;
whitewashers' share in their first slots under a new id at most their share before leaving. The success rule
(the highest P(success) · T_res × VoC among T ≥ θ, ``attack_tasks_won_success``) is held to the expected-value
rule's mark against the best rule's share by the same rule. Each row also gives
honest devices' T_beh − truth (``honest_trust_shift``; under bad-mouthing it should stay within 0.05 of a run
without the attack). A target a report cannot judge (no oracle, no whitewashers) is left blank.

Run: ``python -m bench.attack_targets out/eval-onoff out/eval-sybil ...`` (instant: it reads the reports).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from bench import verdicts
from bench.report import emit
from bench.verdicts import figure, load_report, ratio, seeds, verdict, voc_at
from model.baselines import RULES

EV_VS_RULE = 0.5
PAPER_VS_ORACLE = 1.5
VOC_VS_ORACLE = 0.85
THETA = 0.7


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


def target_row(report: dict[str, Any], method: str = "bm") -> dict[str, Any]:
    """One report's row: the attack, the best rule, and each target's figures and verdict."""
    setup, rule = report["setup"], best_rule(report)
    ev, ev_rule = (figure(report, m, "attack_tasks_won_expected") for m in (method, rule))
    paper, paper_oracle = (figure(report, m, "attack_tasks_won") for m in (method, "oracle"))
    voc = [voc_at(report, m, THETA) for m in (method, "oracle")]
    row = {"attack": setup["attack"], "seeds": seeds(setup),
           "best rule": rule, "won (ev)": ev, "rule's (ev)": ev_rule, "÷ rule": ratio(ev, ev_rule),
           "won (paper)": paper, "÷ oracle": ratio(paper, paper_oracle), "voc ÷ oracle": ratio(*voc)}
    row["ev target"] = verdict(row["÷ rule"], row["÷ rule"] <= EV_VS_RULE)
    success, success_rule = (figure(report, m, "attack_tasks_won_success") for m in (method, rule))
    row["won (success)"], row["÷ rule (success)"] = success, ratio(success, success_rule)
    row["success target"] = verdict(row["÷ rule (success)"], row["÷ rule (success)"] <= EV_VS_RULE)
    row["paper target"] = verdict(row["÷ oracle"], row["÷ oracle"] <= PAPER_VS_ORACLE)
    row["voc target"] = verdict(row["voc ÷ oracle"], row["voc ÷ oracle"] >= VOC_VS_ORACLE)
    if "bayes" in report:  # what the outcomes allow: the filter against the rule, BM against the filter
        bayes = figure(report, "bayes", "attack_tasks_won_expected")
        row["bayes ÷ rule (ev)"], row["÷ bayes (ev)"] = ratio(bayes, ev_rule), ratio(ev, bayes)
        row["bayes ÷ rule (success)"] = ratio(figure(report, "bayes", "attack_tasks_won_success"), success_rule)
    before, after = (figure(report, method, f"whitewash_share_{when}") for when in ("before", "after"))
    if not math.isnan(before):
        row["new id ÷ before"] = ratio(after, before)
        row["whitewash target"] = verdict(after, after <= before)
    row["honest shift"] = figure(report, method, "honest_trust_shift")
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="report.json files or the directories holding them")
    parser.add_argument("--method", default="bm", help="the method judged (default bm)")
    args = parser.parse_args()
    rows = [target_row(read_report(path), args.method) for path in args.reports]
    emit("attack_targets", rows, {"method": args.method, "reports": [str(p) for p in args.reports]})


if __name__ == "__main__":
    main()
