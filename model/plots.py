"""The report's figures as PNG: achieved VoC versus theta (the paper's Fig. 3b), RMSE per slot (Fig. 3a)
and the reliability diagram (mean target per bin of predicted T_beh)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def rolling_mean(values: np.ndarray, width: int) -> np.ndarray:
    """Mean over the ``width`` points ending at each point (fewer at the start), NaN points skipped."""
    valid = ~np.isnan(values)
    total = np.concatenate([[0.0], np.cumsum(np.where(valid, values, 0.0))])
    count = np.concatenate([[0], np.cumsum(valid)])
    end = np.arange(1, len(values) + 1)
    start = np.maximum(end - width, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total[end] - total[start]) / (count[end] - count[start])


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
LINESTYLES = ("-", "--", "-.", ":")


def method_styles(methods: list[str]) -> dict[str, dict]:
    """A distinct look per method (matplotlib keywords): tab20's twenty colours in order, each with its own
    marker, and after twenty another line style, so no two methods of one plot look alike."""
    palette = matplotlib.colormaps["tab20"].colors
    return {method: {"color": palette[k % len(palette)], "marker": MARKERS[k % len(MARKERS)],
                     "linestyle": LINESTYLES[(k // len(palette)) % len(LINESTYLES)]}
            for k, method in enumerate(methods)}


def plot_curves(path: Path, x: list[float], curves: dict[str, dict[str, list[float]]], xlabel: str, ylabel: str,
                title: str, smooth: int = 1) -> Path:
    """One line per method with a +-1 std band; ``curves[method] = {"mean": [...], "std": [...]}``.

    ``smooth`` > 1 draws the rolling mean over that many points (for long, noisy per-slot curves).
    """
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    styles = method_styles(list(curves))
    for method, curve in curves.items():
        mean, std = np.asarray(curve["mean"], dtype=float), np.asarray(curve["std"], dtype=float)
        if smooth > 1:
            mean, std = rolling_mean(mean, smooth), rolling_mean(std, smooth)
        style = styles[method] if smooth == 1 else {**styles[method], "marker": None}
        axes.plot(x, mean, markersize=3, label=method, **style)
        axes.fill_between(x, mean - std, mean + std, alpha=0.1, color=style["color"])
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path


def plot_reliability(path: Path, edges: np.ndarray, bins: dict[str, dict[str, list[float]]], target: str) -> Path:
    """Mean target against the bin's centre for each method (empty bins left out); the diagonal is calibrated.
    ``bins[method] = {"mean_target": [...], "share": [...]}`` per bin of ``edges``; marker area ~ share."""
    centres = (np.asarray(edges[:-1]) + np.asarray(edges[1:])) / 2
    figure, axes = plt.subplots(figsize=(6, 5.4), dpi=120)
    axes.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=1, label="calibrated")
    styles = method_styles(list(bins))
    for method, row in bins.items():
        mean, share = np.asarray(row["mean_target"], dtype=float), np.asarray(row["share"], dtype=float)
        shown = (share > 0) & ~np.isnan(mean)
        style = styles[method]
        axes.plot(centres[shown], mean[shown], linewidth=1, label=method, color=style["color"],
                  linestyle=style["linestyle"])
        axes.scatter(centres[shown], mean[shown], s=8 + 400 * share[shown], color=style["color"],
                     marker=style["marker"], alpha=0.6)
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.set_xlabel("predicted T_beh (bin centre)")
    axes.set_ylabel(f"mean {target}")
    axes.set_title("Reliability diagram (marker area: share of predictions)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
