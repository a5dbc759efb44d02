"""Training BM on a log: next-slot T_col supervision, a time split, blocked CV and early stopping.

* Targets: the edges of slot t (their T_col), predicted from histories up to t - 1.
* Split by time: target slots in the first ``1 - test_fraction`` of the timeline
  train, the rest test; never shuffled across that line.
* Model selection: blocked (contiguous) folds of the training period; each
  setting of the grid is fitted on the other folds with early stopping on its
  validation fold, and scored by the mean validation RMSE. The best setting is
  refitted on the training period with early stopping on its last fold.
* node2vec sees only edges of the training period.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from model.bm import BM, BMConfig, Readout
from model.history import History
from model.metrics import mae, rmse
from model.node2vec import Graph, node2vec_embeddings

PAPER_GRID = {"lr": (1e-1, 1e-2, 1e-3, 1e-4), "weight_decay": (1e-5, 1e-4), "dropout": (0.0, 0.1, 0.3, 0.5, 0.8)}


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 1e-3
    weight_decay: float = 1e-5  # L2
    dropout: float = 0.0
    epochs: int = 40
    patience: int = 5
    test_fraction: float = 0.2
    folds: int = 5
    chunk_slots: int = 8  # target slots per optimisation step
    seed: int = 0
    grid: dict[str, tuple[float, ...]] = field(default_factory=dict)  # empty: no search, use the fields above
    workers: int = 1  # processes scoring grid settings in parallel (each with cores // workers threads)


@dataclass
class FitResult:
    best_epoch: int
    best_rmse: float
    train_losses: list[float]
    val_rmse: list[float]


def time_split(history: History, test_fraction: float) -> tuple[list[int], list[int]]:
    """Target slots (relative, >= 1, with edges) before and after the time line."""
    line = math.ceil(history.slots * (1 - test_fraction))
    targets = [t for t in range(1, history.slots) if history.graphs[t] is not None]
    return [t for t in targets if t < line], [t for t in targets if t >= line]


def blocked_folds(slots: Sequence[int], folds: int) -> list[list[int]]:
    """Contiguous blocks of roughly equal size, in time order."""
    return [list(block) for block in np.array_split(np.asarray(slots), folds) if len(block)]


def targets(history: History, slots: Iterable[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, end slot, T_col) of every edge of the target slots, in slot order; end = slot - 1."""
    graphs = [(t, history.graphs[t]) for t in sorted(set(slots)) if history.graphs[t] is not None]
    if not graphs:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty, np.zeros(0)
    src = np.concatenate([g.src for _, g in graphs])
    dst = np.concatenate([g.dst for _, g in graphs])
    end = np.concatenate([np.full(len(g.src), t - 1) for t, g in graphs])
    return src, dst, end, np.concatenate([g.t_col for _, g in graphs])


def predict(model: BM, history: History, slots: Iterable[int], readout: Readout | None = None,
            chunk_slots: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(T_beh predictions, T_col targets) for every edge of the target slots, ``chunk_slots`` slots at a time."""
    ordered = sorted(set(slots))
    parts = [ordered[k:k + chunk_slots] for k in range(0, len(ordered), chunk_slots)]
    t_beh, t_col = [np.zeros(0)], [np.zeros(0)]
    model.eval()
    with torch.no_grad():
        for part in parts:
            src, dst, end, observed = targets(history, part)
            if len(src):
                t_beh.append(model.t_beh(model.pair_logits(history, src, dst, end), readout).numpy())
                t_col.append(observed)
    return np.concatenate(t_beh), np.concatenate(t_col)


def fit(model: BM, history: History, fit_slots: Sequence[int], val_slots: Sequence[int], config: TrainConfig,
        progress: bool = False) -> FitResult:
    """Adam with L2, chunks of target slots in shuffled order, early stopping on validation RMSE."""
    generator = np.random.default_rng(config.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    chunks = [list(c) for c in np.array_split(np.asarray(fit_slots), max(1, len(fit_slots) // config.chunk_slots))]
    best = FitResult(-1, math.inf, [], [])
    best_state = copy.deepcopy(model.state_dict())
    for epoch in tqdm(range(config.epochs), desc="train", unit="epoch", disable=not progress, leave=False):
        model.train()
        losses = []
        for index in generator.permutation(len(chunks)):
            src, dst, end, t_col = targets(history, chunks[index])
            if not len(src):
                continue
            loss = model.loss(model.pair_logits(history, src, dst, end), torch.from_numpy(t_col).float())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        score = rmse(*predict(model, history, val_slots))
        best.train_losses.append(float(np.mean(losses)) if losses else float("nan"))
        best.val_rmse.append(score)
        if score < best.best_rmse:
            best.best_epoch, best.best_rmse = epoch, score
            best_state = copy.deepcopy(model.state_dict())
        elif epoch - best.best_epoch >= config.patience:
            break
    model.load_state_dict(best_state)
    return best


def node2vec_table(history: History, slots: Iterable[int], config: BMConfig, seed: int) -> np.ndarray:
    """node2vec over the undirected task-weighted graph of the given slots only."""
    graphs = [history.graphs[s] for s in slots if history.graphs[s] is not None]
    src = np.concatenate([g.src for g in graphs]) if graphs else np.zeros(0, dtype=np.int64)
    dst = np.concatenate([g.dst for g in graphs]) if graphs else np.zeros(0, dtype=np.int64)
    graph = Graph.from_edges(len(history.index), src, dst, np.ones(len(src)))
    return node2vec_embeddings(graph, config.node2vec, seed=seed)


def build(config: BMConfig, features: np.ndarray, train: TrainConfig) -> BM:
    torch.manual_seed(train.seed)
    return BM(replace(config, dropout=train.dropout, gnn=replace(config.gnn, dropout=train.dropout)), features)


def settings(train: TrainConfig) -> list[TrainConfig]:
    if not train.grid:
        return [train]
    names = sorted(train.grid)
    return [replace(train, **dict(zip(names, values))) for values in itertools.product(*(train.grid[n] for n in names))]


def cv_score(history: History, config: BMConfig, features: np.ndarray, setting: TrainConfig,
             folds: list[list[int]]) -> float:
    """Mean validation RMSE of ``setting`` over the blocked folds, each fitted on the other folds."""
    scores = []
    for k, val in enumerate(folds):
        fit_slots = [s for j, f in enumerate(folds) if j != k for s in f]
        scores.append(fit(build(config, features, setting), history, fit_slots, val, setting).best_rmse)
    return float(np.mean(scores))


def _grid_worker(threads: int) -> None:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def cv_scores(history: History, config: BMConfig, features: np.ndarray, candidates: list[TrainConfig],
              folds: list[list[int]], workers: int, progress: bool) -> list[float]:
    """:func:`cv_score` of every candidate; in ``workers`` spawned processes when more than one."""
    bar = functools.partial(tqdm, desc="grid", total=len(candidates), disable=not progress)
    if workers <= 1:
        return [cv_score(history, config, features, c, folds) for c in bar(candidates)]
    threads = max(1, (os.cpu_count() or 1) // workers)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_grid_worker,
                             initargs=(threads,)) as pool:
        return list(bar(pool.map(functools.partial(cv_score, history, config, features, folds=folds), candidates)))


@dataclass
class TrainReport:
    setting: dict[str, float]
    search: list[dict[str, Any]]
    fit: FitResult
    train_slots: list[int]
    test_slots: list[int]
    test_rmse: float
    test_mae: float


@contextlib.contextmanager
def deterministic() -> Iterator[None]:
    """torch's deterministic algorithms for the duration (scatter reductions otherwise vary in the last bit)."""
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous)


def train_bm(history: History, config: BMConfig, train: TrainConfig, progress: bool = False,
             features: np.ndarray | None = None) -> tuple[BM, np.ndarray, TrainReport]:
    """Select a setting by blocked CV on the training period, refit it, and score the test period once.

    ``features``: a node2vec table already computed by :func:`training_features` for the same history,
    config and seed (the learned methods of one evaluation run share it). Runs are deterministic on
    the CPU for a given seed (a test checks bit-identical predictions).
    """
    with deterministic():
        return _train_bm(history, config, train, progress, features)


def split_for_training(history: History, train: TrainConfig) -> tuple[list[int], list[int]]:
    """:func:`time_split`, refusing a log too short to train on."""
    train_slots, test_slots = time_split(history, train.test_fraction)
    if len(train_slots) < 2:
        raise ValueError(f"events: need at least 2 training slots with edges (got {len(train_slots)})")
    return train_slots, test_slots


def training_features(history: History, config: BMConfig, train: TrainConfig) -> np.ndarray:
    """The node2vec table over the training period's edges (what :func:`train_bm` computes when not given one).

    Under torch's deterministic algorithms, like training: the skip-gram's scatter reductions otherwise
    differ in the last bit between calls.
    """
    train_slots, _ = split_for_training(history, train)
    with deterministic():
        return node2vec_table(history, range(train_slots[-1] + 1), config, train.seed)


def _train_bm(history: History, config: BMConfig, train: TrainConfig, progress: bool,
              features: np.ndarray | None) -> tuple[BM, np.ndarray, TrainReport]:
    train_slots, test_slots = split_for_training(history, train)
    features = training_features(history, config, train) if features is None else features
    folds = blocked_folds(train_slots, min(train.folds, len(train_slots)))
    search = []
    candidates = settings(train)
    if len(candidates) > 1:
        cv = cv_scores(history, config, features, candidates, folds, train.workers, progress)
        search = [{"lr": c.lr, "weight_decay": c.weight_decay, "dropout": c.dropout, "cv_rmse": score}
                  for c, score in zip(candidates, cv)]
        chosen = candidates[int(np.argmin(cv))]
    else:
        chosen = candidates[0]
    model = build(config, features, chosen)
    refit_slots = [s for f in folds[:-1] for s in f]
    result = fit(model, history, refit_slots, folds[-1], chosen, progress)
    t_beh, t_col = predict(model, history, test_slots)
    report = TrainReport({"lr": chosen.lr, "weight_decay": chosen.weight_decay, "dropout": chosen.dropout},
                         search, result, train_slots, test_slots, rmse(t_beh, t_col), mae(t_beh, t_col))
    return model, features, report
