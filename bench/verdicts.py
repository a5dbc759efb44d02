"""What the target benchmarks share: a report's figures, ratios and verdicts, and its best rule.

A report is ``trustbeam evaluate``'s ``report.json``: per method, each figure as ``{"mean": ..., "std": ...}``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import fmean, stdev
from typing import Any, Iterable

from model.baselines import RULES
from model.voc import THETAS


def load_report(path: Path) -> dict[str, Any]:
    """A report.json: ``path`` or the directory holding it."""
    return json.loads((path / "report.json" if path.is_dir() else path).read_text())


def figure(report: dict[str, Any], method: str, measure: str) -> float:
    """The report's mean of ``measure`` for ``method`` (NaN where it has none)."""
    value = report.get(method, {}).get(measure, {}).get("mean", math.nan)
    return math.nan if value is None else value


def seeds(setup: dict[str, Any]) -> str:
    """The seeds a report's runs drew: "700" for one, "700-701" for two."""
    first, last = setup["seed"], setup["seed"] + setup["runs_done"] - 1
    return f"{first}" if last == first else f"{first}-{last}"


def ratio(a: float, b: float) -> float:
    """a / b, NaN where b is not positive."""
    return a / b if b > 0 else math.nan


def mean_of(values: Iterable[float]) -> float:
    """The mean of ``values``, NaNs left out (NaN where every one is, or none is given)."""
    known = [v for v in values if not math.isnan(v)]
    return fmean(known) if known else math.nan


def grouped(rows: list[dict[str, Any]], key: str) -> dict[Any, list[dict[str, Any]]]:
    """``rows`` by their value of ``key``, the groups in order of first appearance."""
    out: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row[key], []).append(row)
    return out


def means(group: list[dict[str, Any]], keys: Iterable[str]) -> dict[str, float]:
    """Each of ``keys`` that a row of ``group`` has: its mean over the rows that have it (NaNs left out)."""
    return {key: mean_of(row[key] for row in group if key in row) for key in keys if any(key in row for row in group)}


def standard_error(values: Iterable[float]) -> float:
    """The standard error of the mean of ``values``, NaNs left out (NaN with fewer than two)."""
    known = [v for v in values if not math.isnan(v)]
    return stdev(known) / math.sqrt(len(known)) if len(known) > 1 else math.nan


def verdict(value: float, ok: bool) -> str:
    """"met" or "not met"; blank where the figure is NaN (the report cannot judge it)."""
    return "" if math.isnan(value) else "met" if ok else "not met"


def best_rule(report: dict[str, Any], error: str, needs: str | None = None) -> str:
    """Of the report's rule methods (:data:`model.baselines.RULES`) that have ``needs`` (default: ``error``), the one
    with the lowest ``error``; refuses, by name, a report with none."""
    rules = [m for m in report if m in RULES and (needs or error) in report[m]]
    if not rules:
        raise ValueError(f"report of seed {report['setup'].get('seed')}: no rule method with {needs or error!r} "
                         f"(one of {sorted(RULES)})")
    return min(rules, key=lambda m: figure(report, m, error))


def voc_at(report: dict[str, Any], method: str, theta: float, curve_of: str = "voc") -> float:
    """The report's mean VoC per task at the trust threshold ``theta`` selecting by the paper's rule (``curve_of``
    another report curve: ``voc_expected``, ``voc_success``), NaN where the method has no such curve."""
    curve = report.get(method, {}).get(curve_of, {}).get("mean")
    return math.nan if curve is None else curve[THETAS.index(theta)]
