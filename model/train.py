"""Training BM on a log: next-slot T_col supervision, a time split, blocked CV and early stopping.

* Targets (:mod:`model.targets`): the edges of slot t (their T_col and outcome counts), predicted from histories up
  to t - 1 for the tasks' own profile.
* Split by time: target slots in the first ``1 - test_fraction`` of the timeline
  train, the rest test; never shuffled across that line.
* Model selection: blocked (contiguous) folds of the training period; each
  setting of the grid is fitted on the other folds with early stopping on its
  validation fold, and scored by the mean validation loss (the head's per-task
  likelihood). The best setting is refitted on the training period with early
  stopping on its last fold.
* node2vec sees only edges of the training period; devices without an edge there read the cold row.
* The context head's P_tr curve starts from its maximum-likelihood fit to the training period's
  transmissions (:mod:`model.channel`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import itertools
import math
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from model.baselines import RuleChoice, SizeChoice, rule_choice, size_choice, size_split
from model.bm import BM, BMConfig, Readout
from model.channel import OnTimeCurve, OutageCurve
from model.evidence import memories, typical_speed_gap
from model.experts import fit_rate_prior, fit_stack
from model.head import PairSides, PairTargets
from model.history import History
from model.metrics import mae, rmse
from model.node2vec import Graph, node2vec_embeddings
from model.stages import resolve_device
from model.targets import Targets, fit_outage, targets

T = TypeVar("T")

PAPER_GRID = {"lr": (1e-1, 1e-2, 1e-3, 1e-4), "weight_decay": (1e-5, 1e-4), "dropout": (0.0, 0.1, 0.3, 0.5, 0.8)}


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 1e-3
    weight_decay: float = 1e-5  # L2
    dropout: float = 0.0
    epochs: int = 40
    patience: int = 5
    head_epochs: int = 300  # the context head's warm-up on its own inputs (no encoder runs): most epochs
    head_patience: int = 30
    head_lr: float = 3e-3
    head_batches: int = 8  # minibatches per warm-up epoch
    test_fraction: float = 0.2
    folds: int = 5
    chunk_slots: int = 8  # target slots per optimisation step
    seed: int = 0
    grid: dict[str, tuple[float, ...]] = field(default_factory=dict)  # empty: no search, use the fields above
    workers: int = 1  # processes scoring grid settings in parallel (each with cores // workers threads)
    device: str = "cpu"  # where the model trains: auto|cpu|cuda (model.stages.resolve_device)


@dataclass
class FitResult:
    """What :func:`fit` saw: the kept epoch (-1: the starting state, before any end-to-end step), its
    validation loss, the per-epoch training and validation losses, and the starting state's validation loss."""

    best_epoch: int
    best_loss: float
    train_losses: list[float]
    val_losses: list[float]
    start_loss: float

    @property
    def end_to_end_gain(self) -> float:
        """The share of the starting state's (the warmed-up head's) validation loss that the best end-to-end epoch
        took off: above 0 where an epoch was kept, at most 0 where every epoch did worse (NaN: none ran)."""
        finite = [loss for loss in self.val_losses if math.isfinite(loss)]
        return 1.0 - min(finite) / self.start_loss if finite else math.nan


def time_split(history: History, test_fraction: float) -> tuple[list[int], list[int]]:
    """Target slots (relative, >= 1, with edges) before and after the time line."""
    line = math.ceil(history.slots * (1 - test_fraction))
    targets = [t for t in range(1, history.slots) if history.graphs[t] is not None]
    return [t for t in targets if t < line], [t for t in targets if t >= line]


def blocked_folds(slots: Sequence[int], folds: int) -> list[list[int]]:
    """Contiguous blocks of roughly equal size, in time order."""
    return [list(block) for block in np.array_split(np.asarray(slots), folds) if len(block)]


def target_tensors(batch: Targets, device: torch.device = torch.device("cpu")) -> PairTargets:
    """The outcomes of ``batch`` as the head's training targets (float32 on ``device``)."""
    return PairTargets(*(torch.from_numpy(np.asarray(v, np.float32)).to(device)
                         for v in (batch.t_col, batch.tasks, batch.flagged, batch.tr, batch.com)))


def predict(model: BM, history: History, slots: Iterable[int], readout: Readout | None = None,
            chunk_slots: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(T_beh predictions, T_col targets) for every edge of the target slots, ``chunk_slots`` slots at a time."""
    ordered = sorted(set(slots))
    parts = [ordered[k:k + chunk_slots] for k in range(0, len(ordered), chunk_slots)]
    t_beh, t_col = [np.zeros(0)], [np.zeros(0)]
    model.eval()
    with torch.no_grad():
        for part in parts:
            batch = targets(history, part)
            if len(batch):
                t_beh.append(model.t_beh(model.pair_outputs(history, batch.query), readout).double().cpu().numpy())
                t_col.append(batch.t_col)
    return np.concatenate(t_beh), np.concatenate(t_col)


def validation_loss(model: BM, history: History, slots: Iterable[int], chunk_slots: int = 32,
                    judged_at: int | None = None) -> float:
    """The model's training loss (the head's per-task likelihood) over every edge of the target slots, in
    eval mode: a proper score of the predicted outcome probabilities, finer than the RMSE against one
    slot's noisy T_col (reports weighed as :func:`targets` weighs them, as of ``judged_at``)."""
    ordered = sorted(set(slots))
    total, weight = 0.0, 0.0
    model.eval()
    with torch.no_grad():
        for k in range(0, len(ordered), chunk_slots):
            batch = targets(history, ordered[k:k + chunk_slots], model.config.evidence, judged_at)
            if len(batch):
                wanted = target_tensors(batch, model.device)
                share = model.loss_units(wanted)
                total += model.loss(model.pair_outputs(history, batch.query), wanted).item() * share
                weight += share
    return total / weight if weight else math.inf


@dataclass
class WarmedUp:
    """One warm-up's result: each member's state after it and the epochs it chose, and after the refit, once run."""

    states: list[dict[str, torch.Tensor]]
    chosen: list[int]
    refitted: list[dict[str, torch.Tensor]] | None = None


class WarmUps:
    """The head warm-ups fitted so far, by a digest of everything a warm-up reads (:func:`warm_up_digest`).

    BM, the LSTM, the Transformer and GNN-only warm their heads up on the same inputs from the same starts
    (:func:`model.bm.head_seed`), and a warm-up runs no encoder: the learned methods of one evaluation run share
    one, and the others take the first one's members, the same bit for bit as fitting them again. ``hits``
    counts the warm-ups (and refits) taken rather than fitted."""

    def __init__(self) -> None:
        self.done: dict[bytes, WarmedUp] = {}
        self.hits = 0


def warm_up_digest(model: BM, inputs: dict[str, tuple[torch.Tensor, torch.Tensor, PairTargets]],
                   config: TrainConfig) -> bytes:
    """What a warm-up's result depends on: the head's whole state (the members' starts among it) and structure,
    the fit and validation pairs' physics, evidence and targets, the model's config bar its sequence encoder,
    and the warm-up's settings."""
    digest = hashlib.blake2b(digest_size=32)
    settings = (repr(replace(model.config, sequence="bimamba")), repr(model.head), model.head.lams, str(model.device),
                config.seed, config.head_lr, config.weight_decay, config.head_epochs, config.head_patience,
                config.head_batches)
    digest.update(repr(settings).encode())
    physics_evidence_targets = [(f"{name}.{k}", t) for name in ("fit", "val")
                                for k, t in enumerate([*inputs[name][:2], *(getattr(inputs[name][2], f.name)
                                                                             for f in fields(PairTargets))])]
    for name, tensor in [*physics_evidence_targets, *model.head.state_dict().items()]:
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.digest()


def warm_up_head(model: BM, history: History, fit_slots: Sequence[int], val_slots: Sequence[int],
                 config: TrainConfig, warm_ups: WarmUps | None = None, judged_at: int | None = None
                 ) -> Callable[[], None]:
    """Fit the context head's members one by one (each from its own start, in its own order of minibatches) on
    the pairs' physics and evidence alone (Y = 0) on the fit slots, for the epochs that early stopping on the
    validation loss chooses. Returns ``refit``, which fits each member again from its start on the fit and
    validation slots together for that many epochs (the validation slots are the most recent ones): call it
    only once the validation slots have judged what they judge. Costs no encoder run: the inputs are
    computed once. ``warm_ups``: where a warm-up of the same inputs from the same starts was fitted already
    (and its refit, once run), its members are taken from there; none is kept where a member draws from
    PyTorch's random stream (dropout), whose state differs between models. ``judged_at``: as :func:`targets`."""
    credible = model.config.evidence
    batches = {name: targets(history, slots, credible, judged_at) for name, slots in (("fit", fit_slots),
                                                                                      ("val", val_slots))}
    if not len(batches["fit"]) or not len(batches["val"]):
        return lambda: None
    inputs = {name: (*model.pair_inputs(history, batch.query), target_tensors(batch, model.device))
              for name, batch in batches.items()}
    both = tuple(torch.cat([a, b]) for a, b in zip(inputs["fit"][:2], inputs["val"][:2]))
    inputs["all"] = (*both, PairTargets(*(torch.cat([getattr(inputs["fit"][2], f.name), getattr(inputs["val"][2], f.name)])
                                          for f in fields(PairTargets))))
    head = model.head
    d = model.config.gnn.out_dim
    with torch.no_grad():  # what the members read (the rules' rates, the physics' columns) is fixed: once
        read = {name: head.member_inputs(PairSides.of_pairs(*(torch.zeros(len(physics), d, device=model.device),) * 2,
                                                            physics, evidence, head.lams))
                for name, (physics, evidence, _) in inputs.items()}

    def outputs(name: str, rows: np.ndarray, member: int) -> torch.Tensor:
        return head.own(read[name].take(torch.as_tensor(rows, device=model.device)), member)

    def train(member: int, name: str, epochs: int, validate: bool, start: dict) -> int:
        net = head.members[member]
        net.load_state_dict(start)
        optimizer = torch.optim.Adam(net.parameters(), lr=config.head_lr, weight_decay=config.weight_decay,
                                     foreach=True)  # one call per step for all tensors (the same updates)
        generator = np.random.default_rng([config.seed, 1, member])
        wanted = inputs[name][2]
        best, best_epoch, kept = math.inf, 0, start
        for epoch in range(epochs):
            net.train()
            for rows in np.array_split(generator.permutation(len(wanted.t_col)), config.head_batches):
                part = PairTargets(*(getattr(wanted, f.name)[rows] for f in fields(PairTargets)))
                loss = head.loss(outputs(name, rows, member), part)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if validate:
                net.eval()
                with torch.no_grad():
                    score = head.loss(head.own(read["val"], member), inputs["val"][2]).item()
                if score < best:
                    best, best_epoch, kept = score, epoch + 1, copy.deepcopy(net.state_dict())
                elif epoch + 1 - best_epoch >= config.head_patience:
                    break
        if validate and best_epoch:
            net.load_state_dict(kept)
        net.eval()
        return best_epoch

    starts = [copy.deepcopy(net.state_dict()) for net in head.members]
    each = parallel_members(head, torch.get_num_threads())
    key = warm_up_digest(model, inputs, config) if warm_ups is not None and not draws_randomly(head) else None
    if key is not None and key in warm_ups.done:
        result = warm_ups.done[key]
        warm_ups.hits += 1
        load_members(head, result.states)
    else:
        chosen = each(lambda k: train(k, "fit", config.head_epochs, True, starts[k]))
        result = WarmedUp([copy.deepcopy(net.state_dict()) for net in head.members], chosen)
        if key is not None:
            warm_ups.done[key] = result

    def refit() -> None:
        if result.refitted is not None:
            warm_ups.hits += 1
            load_members(head, result.refitted)
            return
        each(lambda k: train(k, "all", result.chosen[k], False, starts[k]))
        if key is not None:
            result.refitted = [copy.deepcopy(net.state_dict()) for net in head.members]

    return refit


def load_members(head: nn.Module, states: list[dict[str, torch.Tensor]]) -> None:
    """Each member of ``head`` set to its state in ``states`` (copied, so the stored states stay as they are)."""
    for net, state in zip(head.members, states):
        net.load_state_dict(state)
        net.eval()


def draws_randomly(head: nn.Module) -> bool:
    """Whether a forward pass of ``head`` in training draws from PyTorch's shared random stream (dropout)."""
    return any(isinstance(m, nn.Dropout) and m.p > 0 for m in head.modules())


def parallel_members(head: nn.Module, threads: int) -> Callable[[Callable[[int], T]], list[T]]:
    """Run a function of each member index over the head's members, on up to ``threads`` threads, each with one
    intra-op thread (PyTorch lets go of the interpreter in its operators). Members are independent (their own
    parameters, optimizer and minibatch order), so the results are those of a loop over them: threads only where
    no member draws from PyTorch's shared random stream (dropout)."""
    members = len(head.members)
    workers = 1 if draws_randomly(head) else max(1, min(members, threads))
    if workers == 1:
        return lambda job: [job(k) for k in range(members)]

    def each(job: Callable[[int], T]) -> list[T]:
        def one(k: int) -> T:
            torch.set_num_threads(1)  # members side by side, not each operator split across the cores
            return job(k)
        try:
            with ThreadPoolExecutor(workers) as pool:
                return list(pool.map(one, range(members)))
        finally:
            torch.set_num_threads(threads)  # the library-wide setting (BLAS) back as it was
    return each


def fit(model: BM, history: History, fit_slots: Sequence[int], val_slots: Sequence[int], config: TrainConfig,
        progress: bool = False, warm_ups: WarmUps | None = None) -> FitResult:
    """Adam with L2, chunks of target slots in shuffled order, early stopping on the validation loss.

    The context head is warmed up first on its own inputs (fit slots only). The warmed-up state competes
    with every end-to-end epoch on the validation loss: an epoch is kept only if what the long-term
    embeddings add helps on slots it never trained on. When none is kept (``best_epoch == -1``) the
    warmed-up head is refitted on the fit and validation slots together, so that the most recent slots
    are learned from too. ``warm_ups``: the head's warm-ups shared with other models (:class:`WarmUps`). Owners'
    reports weigh by their credibility as of the last slot the fit sees (:func:`targets`)."""
    judged = max([*fit_slots, *val_slots])
    refit = (warm_up_head(model, history, fit_slots, val_slots, config, warm_ups, judged)
             if model.config.uses_context else None)
    generator = np.random.default_rng(config.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, foreach=True)
    chunks = [list(c) for c in np.array_split(np.asarray(fit_slots), max(1, len(fit_slots) // config.chunk_slots))]
    start = validation_loss(model, history, val_slots, judged_at=judged)
    best = FitResult(-1, start, [], [], start)
    best_state = copy.deepcopy(model.state_dict())
    for epoch in tqdm(range(config.epochs), desc="train", unit="epoch", disable=not progress, leave=False):
        model.train()
        losses = []
        for index in generator.permutation(len(chunks)):
            batch = targets(history, chunks[index], model.config.evidence, judged)
            if not len(batch):
                continue
            loss = model.loss(model.pair_outputs(history, batch.query), target_tensors(batch, model.device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        score = validation_loss(model, history, val_slots, judged_at=judged)
        best.train_losses.append(float(np.mean(losses)) if losses else float("nan"))
        best.val_losses.append(score)
        if score < best.best_loss:
            best.best_epoch, best.best_loss = epoch, score
            best_state = copy.deepcopy(model.state_dict())
        elif epoch - best.best_epoch >= config.patience:
            break
    model.load_state_dict(best_state)
    stack = fit_expert_stack(model, history, val_slots, judged) if model.config.uses_context else None
    if best.best_epoch == -1 and refit is not None:
        refit()
    if stack is not None:
        model.head.stack.copy_(torch.as_tensor(stack, dtype=torch.float32))
    model.eval()
    return best


def fit_expert_stack(model: BM, history: History, slots: Sequence[int], judged_at: int | None = None
                     ) -> np.ndarray | None:
    """The published mixture's weights (:func:`model.experts.fit_stack`): the head's own forecast and its rule
    experts on the target slots' edges, against T_col weighted by tasks (reports weighed as of ``judged_at``, as
    :func:`targets` weighs them). None without edges. The head's forecast and the rule's are averaged unless the
    head reads what the rule does not: devices' loads (``EvidenceConfig.shifts``) or what owners reported and were
    not believed (``discredited``)."""
    batch = targets(history, slots, model.config.evidence, judged_at)
    if not len(batch):
        return None
    model.eval()
    with torch.no_grad():
        forecasts = model.head.expert_forecasts(model.pair_outputs(history, batch.query)).double().cpu().numpy()
    evidence = model.config.evidence
    return fit_stack(forecasts, batch.t_col, batch.tasks, average=not (evidence.shifts or evidence.discredited))


def _edges(history: History, slots: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
    graphs = [history.graphs[s] for s in slots if history.graphs[s] is not None]
    src = np.concatenate([g.src for g in graphs]) if graphs else np.zeros(0, dtype=np.int64)
    dst = np.concatenate([g.dst for g in graphs]) if graphs else np.zeros(0, dtype=np.int64)
    return src.astype(np.int64), dst.astype(np.int64)


def node2vec_table(history: History, slots: Iterable[int], config: BMConfig, seed: int) -> np.ndarray:
    """node2vec over the undirected task-weighted graph of the given slots only."""
    src, dst = _edges(history, slots)
    graph = Graph.from_edges(len(history.index), src, dst, np.ones(len(src)))
    return node2vec_embeddings(graph, config.node2vec, seed=seed)


def known_devices(history: History, slots: Iterable[int]) -> np.ndarray:
    """(devices,) whether each device has an edge in the given slots (the rest are cold-start devices)."""
    known = np.zeros(len(history.index), dtype=bool)
    for rows in _edges(history, slots):
        known[rows] = True
    return known


@dataclass(frozen=True)
class Prepared:
    """What every fit of one run shares, all from the training period: the node2vec table, which devices it
    knows, the starting P_tr curve, the on-time factor over the tasks' reported times (the evidence) and over
    the pairs' physics (the rule experts), and the population's prior over collaborators' rates."""

    features: np.ndarray
    known: np.ndarray
    outage: OutageCurve
    on_time: OnTimeCurve
    physics_on_time: OnTimeCurve
    rate_prior: np.ndarray
    tr_rate: float  # the share of flagged tasks transmitted (P(tr) where a pair's distance is unknown)
    lams: tuple[float, ...]  # the evidence's memories: where devices report their loads, the config's and a long one
    #                          (model.evidence.memories)
    rule: RuleChoice  # the rule the head carries as an expert (model.baselines.rule_choice)
    sizing: SizeChoice | None = None  # the head's size correction, where the training period says size matters
    discredited: bool = False  # whether owners reported tasks of the training period (the head then reads what
    #                            was reported and not believed: model.evidence.discredited_block)
    size_split: float | None = None  # the training period's typical task size (None: one size), which parts the size
    #                                  evidence's large tasks from small ones (model.baselines.size_split)
    speed_gap: float | None = None  # the training period's typical log of shown speed over claimed CPU (None: no
    #                                 times; model.evidence.typical_speed_gap)
    shifts: bool = False  # whether devices reported their loads in the training period (the head then reads what a
    #                       device showed since its load last shifted, model.shift, and its usage cycle,
    #                       model.usage_cycle)

    def configure(self, config: BMConfig) -> BMConfig:
        """The config whose evidence keeps these memories, counts transmissions against this on-time factor, reads
        what was reported and not believed (where owners report), parts tasks by size at the training period's
        typical size, judges claimed CPUs against the typical gap to the speeds shown and, where loads are
        reported, watches them for shifts and fits their cycles."""
        return replace(config, evidence=replace(config.evidence, lams=self.lams,
                                                on_time=self.on_time.factor, discredited=self.discredited,
                                                size_split_bits=self.size_split, speed_gap=self.speed_gap,
                                                shifts=self.shifts, cycles=self.shifts, fall_credit=self.shifts))


def build(config: BMConfig, prepared: Prepared, train: TrainConfig) -> BM:
    torch.manual_seed(train.seed)
    config = prepared.configure(replace(config, dropout=train.dropout, gnn=replace(config.gnn, dropout=train.dropout)))
    model = BM(config, prepared.features, prepared.known, prepared.outage, prepared.rate_prior,
               prepared.physics_on_time, prepared.tr_rate)
    if config.uses_context:
        rule = prepared.rule
        model.head.experts.adopt_rule(config.evidence.lams.index(rule.lam), rule.strength, rule.prior_mean)
        if prepared.sizing is not None:
            choice = prepared.sizing
            model.head.sizing.adopt(config.evidence.lams.index(choice.lam), choice.strength, choice.prior_mean,
                                    choice.ridge)
    return model.to(resolve_device(train.device))


def settings(train: TrainConfig) -> list[TrainConfig]:
    if not train.grid:
        return [train]
    names = sorted(train.grid)
    return [replace(train, **dict(zip(names, values))) for values in itertools.product(*(train.grid[n] for n in names))]


def cv_score(history: History, config: BMConfig, prepared: Prepared, setting: TrainConfig,
             folds: list[list[int]]) -> float:
    """Mean validation loss of ``setting`` over the blocked folds, each fitted on the other folds."""
    scores = []
    for k, val in enumerate(folds):
        fit_slots = [s for j, f in enumerate(folds) if j != k for s in f]
        scores.append(fit(build(config, prepared, setting), history, fit_slots, val, setting).best_loss)
    return float(np.mean(scores))


def _grid_worker(threads: int) -> None:
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)


def cv_scores(history: History, config: BMConfig, prepared: Prepared, candidates: list[TrainConfig],
              folds: list[list[int]], workers: int, progress: bool) -> list[float]:
    """:func:`cv_score` of every candidate; in ``workers`` spawned processes when more than one."""
    bar = functools.partial(tqdm, desc="grid", total=len(candidates), disable=not progress)
    if workers <= 1:
        return [cv_score(history, config, prepared, c, folds) for c in bar(candidates)]
    threads = max(1, (os.cpu_count() or 1) // workers)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_grid_worker,
                             initargs=(threads,)) as pool:
        return list(bar(pool.map(functools.partial(cv_score, history, config, prepared, folds=folds), candidates)))


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
def deterministic(device: torch.device = torch.device("cpu")) -> Iterator[None]:
    """torch's deterministic algorithms for the duration (scatter reductions otherwise vary in the last bit).
    On a GPU, operations without a deterministic CUDA kernel warn instead of failing."""
    previous = torch.are_deterministic_algorithms_enabled()
    warned = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=device.type != "cpu")
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous, warn_only=warned)


def train_bm(history: History, config: BMConfig, train: TrainConfig, progress: bool = False,
             prepared: Prepared | None = None, warm_ups: WarmUps | None = None) -> tuple[BM, Prepared, TrainReport]:
    """Select a setting by blocked CV on the training period, refit it, and score the test period once.

    ``prepared``: what :func:`prepare` computes for the same history, config and seed (the learned
    methods of one evaluation run share it, and ``warm_ups``, their heads' warm-up: :class:`WarmUps`). The
    outcomes the head models follow the log (``config.outcomes`` is set from it). The model trains and stays on
    ``train.device``. Runs are deterministic on the CPU for a given seed (a test checks bit-identical predictions).
    """
    device = resolve_device(train.device)  # a missing GPU is refused before any work
    if train.workers > 1 and device.type != "cpu":
        raise ValueError(f"--workers {train.workers}: parallel grid workers run on the CPU only; use --workers 1 "
                         f"with --device {train.device}")
    with deterministic(device):
        return _train_bm(history, replace(config, outcomes="flags" if history.has_flags else "graded"), train,
                         progress, prepared, warm_ups)


def split_for_training(history: History, train: TrainConfig) -> tuple[list[int], list[int]]:
    """:func:`time_split`, refusing a log too short to train on."""
    train_slots, test_slots = time_split(history, train.test_fraction)
    if len(train_slots) < 2:
        raise ValueError(f"events: need at least 2 training slots with edges (got {len(train_slots)})")
    return train_slots, test_slots


def prepare(history: History, config: BMConfig, train: TrainConfig) -> Prepared:
    """The node2vec table, the known devices and the P_tr curve of the training period (what
    :func:`train_bm` computes when not given them).

    Under torch's deterministic algorithms, like training: the skip-gram's scatter reductions otherwise
    differ in the last bit between calls.
    """
    train_slots, _ = split_for_training(history, train)
    seen = range(train_slots[-1] + 1)
    with deterministic():
        features = node2vec_table(history, seen, config, train.seed)
    loads = history.loads_reported(train_slots[-1])
    lams = memories(config.evidence.lams, loads)
    config = replace(config, evidence=replace(config.evidence, lams=lams))
    batch = targets(history, train_slots, config.evidence, train_slots[-1])
    on_time = OnTimeCurve.fit(batch.time_ratio, batch.tr, batch.com)
    q = batch.query
    devices = np.arange(len(history.index))
    gap = typical_speed_gap(history.collaborator_sums(devices, np.full(len(devices), train_slots[-1]),
                                                      config.evidence)[0])
    claims = replace(config.evidence, speed_gap=gap)
    physics_ratio = history.pair_physics(q.src, q.dst, q.end + 1, q.profile, config.system,
                                         claims)[:, 3].astype(np.float64)
    return Prepared(features, known_devices(history, seen), fit_outage(history, train_slots, config.system,
                                                                       config.evidence), on_time,
                    OnTimeCurve.fit(physics_ratio, batch.tr, batch.com),
                    rate_prior(batch, len(history.index), history.has_flags, on_time),
                    float((batch.tr.sum() + 1) / (batch.flagged.sum() + 2)), lams,
                    rule_choice(history, train_slots, lams), size_choice(history, train_slots, lams),
                    owners_report(history, train_slots),
                    size_split(history, train_slots), gap, loads)


def owners_report(history: History, slots: Iterable[int]) -> bool:
    """Whether an owner reported (the event's ``reporter``) any task of the given slots."""
    return any(bool(history.graphs[s].reported_share.any()) for s in slots if history.graphs[s] is not None)


def rate_prior(batch: Targets, devices: int, flags: bool, on_time: OnTimeCurve) -> np.ndarray:
    """The prior over collaborators' rates that their whole training-period record supports
    (:func:`model.experts.fit_rate_prior`): computations per on-time-weighted transmission (flags) or mean T_col
    (graded), what the head's rules estimate per device."""
    dst = batch.query.dst
    if flags:
        hits, trials = batch.com, batch.tr * on_time(batch.time_ratio)
    else:
        hits, trials = batch.t_col * batch.tasks, batch.tasks
    return fit_rate_prior(np.bincount(dst, hits, devices), np.bincount(dst, trials, devices))


def _train_bm(history: History, config: BMConfig, train: TrainConfig, progress: bool,
              prepared: Prepared | None, warm_ups: WarmUps | None) -> tuple[BM, Prepared, TrainReport]:
    train_slots, test_slots = split_for_training(history, train)
    prepared = prepare(history, config, train) if prepared is None else prepared
    folds = blocked_folds(train_slots, min(train.folds, len(train_slots)))
    search = []
    candidates = settings(train)
    if len(candidates) > 1:
        cv = cv_scores(history, config, prepared, candidates, folds, train.workers, progress)
        search = [{"lr": c.lr, "weight_decay": c.weight_decay, "dropout": c.dropout, "cv_loss": score}
                  for c, score in zip(candidates, cv)]
        chosen = candidates[int(np.argmin(cv))]
    else:
        chosen = candidates[0]
    model = build(config, prepared, chosen)
    refit_slots = [s for f in folds[:-1] for s in f]
    result = fit(model, history, refit_slots, folds[-1], chosen, progress, warm_ups)
    t_beh, t_col = predict(model, history, test_slots)
    report = TrainReport({"lr": chosen.lr, "weight_decay": chosen.weight_decay, "dropout": chosen.dropout},
                         search, result, train_slots, test_slots, rmse(t_beh, t_col), mae(t_beh, t_col))
    return model, prepared, report
