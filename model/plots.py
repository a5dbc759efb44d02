"""The report's figures as PNG: achieved VoC versus theta (the paper's Fig. 3b) and RMSE per slot (Fig. 3a)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def plot_curves(path: Path, x: list[float], curves: dict[str, dict[str, list[float]]], xlabel: str, ylabel: str,
                title: str) -> Path:
    """One line per method with a +-1 std band; ``curves[method] = {"mean": [...], "std": [...]}``."""
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    for method, curve in curves.items():
        mean, std = np.asarray(curve["mean"], dtype=float), np.asarray(curve["std"], dtype=float)
        axes.plot(x, mean, marker="o", markersize=3, label=method)
        axes.fill_between(x, mean - std, mean + std, alpha=0.15)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
    return path
