"""BM: history windows, soft labels, readouts, the context head, training on a simulated log, checkpoints."""

from __future__ import annotations

import json
import math
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch

from model.baselines import RunningMean, channel_beta, channel_beta_grid, predict_edges
from model.bimamba import MambaConfig
from model.bm import BM, BMConfig
from model.checkpoint import CheckpointError, load, save
from model.config import SlotClock
from model.evaluate import truth_for
from model.evidence import LONG_MEMORY, N
from simulator.experiment import simulated_run
from model.gnn import GNNConfig
from model.head import PairSides, mlp, pair_mlp, soft_labels
from model.history import History
from model.node2vec import Node2VecConfig
from model.scan import cpu_extension, fused_inference
from model.targets import PairQuery, targets
from model.train import (FitResult, TrainConfig, WarmUps, blocked_folds, build, fit, parallel_members, predict,
                         prepare, split_for_training, time_split, train_bm, validation_loss)
from simulator.config import Attack, AttackKind, Behaviour, SimConfig

SMALL = BMConfig(gnn=GNNConfig(node_dim=8, psi_dim=4, time_dim=4, widths=(8, 16, 8)),
                 mamba=MambaConfig(d_model=8, d_state=4, n_layers=1),
                 node2vec=Node2VecConfig(dim=8, walk_length=6, walks_per_node=2, epochs=1),
                 window=6, levels=5, head_hidden=8, head_members=2)  # an ensemble still, at test cost
PAPER = replace(SMALL, head="paper")


def simulated_history(config: SimConfig) -> tuple[History, object]:
    events, truth, status = simulated_run(config)
    return History.from_events(events, config.clock, SMALL.weights, status=status), truth


@pytest.fixture(scope="module")
def history() -> History:
    return simulated_history(SimConfig(devices=40, tasks=1200, slots=24, seed=4))[0]


def test_windows_cover_the_last_slots_and_are_right_padded_only_at_the_start(history: History) -> None:
    slots, lengths = history.windows(np.array([0, 1, 2, 0]), np.array([10, 7, 0, 2]), window=4)
    assert lengths.tolist() == [4, 4, 1, 3]
    assert slots.tolist() == [[7, 8, 9, 10], [4, 5, 6, 7], [0, 0, 0, 0], [0, 1, 2, 2]]


def test_soft_labels_have_the_target_as_mean() -> None:
    values = torch.tensor([0.0, 0.37, 0.5, 1.0])
    labels = soft_labels(values, 5)
    assert torch.allclose(labels.sum(-1), torch.ones(4))
    assert torch.allclose(labels @ torch.linspace(0, 1, 5), values)


def outcome(t_col: float, tasks: float = 1.0, flagged: float = 0.0, tr: float = 0.0, com: float = 0.0):
    from model.head import PairTargets

    return PairTargets(*(torch.tensor([v]) for v in (t_col, tasks, flagged, tr, com)))


def test_paper_head_readouts_and_loss() -> None:
    model = BM(PAPER, np.zeros((3, 8), dtype=np.float32))
    logits = torch.tensor([[0.0, 0.0, 5.0, 0.0, 0.0]])
    assert model.t_beh(logits).item() == pytest.approx(0.5)
    literal = BM(replace(PAPER, readout="max"), np.zeros((3, 8), dtype=np.float32))
    assert literal.t_beh(torch.tensor([[0.0, 0.0, 0.0, 3.0, 2.9]])).item() == pytest.approx(0.75)
    assert model.loss(torch.tensor([[0.0, 0.0, 50.0, 0.0, 0.0]]), outcome(0.5)).item() < 1e-6
    assert model.t_beh(torch.tensor([[0.0, 0.0, 0.0, 3.0, 2.9]]), readout="max").item() == pytest.approx(0.75)
    # P = (0.4, 0, 0, 0.2, 0.4) over levels 0, .25, .5, .75, 1: mean 0.55, mass reaches 1/2 at 0.75
    logits = torch.log(torch.tensor([[0.4, 1e-9, 1e-9, 0.2, 0.4]]))
    assert model.t_beh(logits).item() == pytest.approx(0.55, abs=1e-6)
    assert model.t_beh(logits, readout="median").item() == pytest.approx(0.75)


def test_context_head_composes_the_system_model_by_hand() -> None:
    model = BM(SMALL, np.zeros((3, 8), dtype=np.float32))
    k = model.head.experts.forecast_count
    experts = torch.linspace(0.1, 0.9, k)[None, :]
    # q_tr 0.5; q_com 0.75; the rules; no size shift
    raw = torch.cat([torch.tensor([[0.0, np.log(3.0)]]), experts, torch.zeros(1, 1)], dim=1)
    own = 0.5 * (0.6 + 0.4 * 0.75)
    assert model.t_beh(raw).item() == pytest.approx(own)  # the stack starts at the head's own forecast
    shifted = torch.cat([raw[:, :-1], torch.tensor([[-0.1]])], dim=1)  # the task's size moves what is published
    assert model.t_beh(shifted).item() == pytest.approx(own - 0.1)
    assert model.t_beh(shifted, readout="own").item() == pytest.approx(own)  # not what the members are fitted by
    # 2 flagged tasks, 1 transmitted, it computed: -[log .5 + log .5 + log .75] per flagged task
    want = -(2 * np.log(0.5) + np.log(0.75)) / 2
    assert model.loss(raw, outcome(0.5, tasks=2, flagged=2, tr=1, com=1)).item() == pytest.approx(want, rel=1e-5)
    model.head.stack.copy_(torch.tensor([0.5, 0.0, 0.5] + [0.0] * (k - 2)))  # half own, half the second rule
    assert model.t_beh(raw).item() == pytest.approx(0.5 * own + 0.5 * experts[0, 1].item())
    assert model.t_beh(raw, readout="own").item() == pytest.approx(own)
    assert model.t_beh(raw, readout="median").item() == pytest.approx(own)  # flags: the median is the own mean
    graded = BM(replace(SMALL, outcomes="graded"), np.zeros((3, 8), dtype=np.float32))
    graded_raw = torch.cat([torch.tensor([[np.log(3.0), np.log(0.9 / 0.1)]]), experts, torch.zeros(1, 1)], dim=1)
    assert graded.t_beh(graded_raw).item() == pytest.approx(0.75)  # graded logs read the mean forecast alone
    assert graded.t_beh(graded_raw, readout="median").item() == pytest.approx(0.9)
    # cross-entropy of the mean forecast plus the median forecast's absolute error |0.9 - 0.6|
    want = -(0.6 * np.log(0.75) + 0.4 * np.log(0.25)) + 0.3
    assert graded.loss(graded_raw, outcome(0.6)).item() == pytest.approx(want, rel=1e-5)
    with torch.no_grad():
        inputs = (torch.zeros(2, 8), torch.zeros(2, 8), torch.full((2, 5), float("nan")),
                  torch.zeros(2, SMALL.evidence.features))
        assert graded.head(*inputs).shape == (2, 3 + k) and model.head(*inputs).shape == (2, 3 + k)


def test_the_members_are_averaged_in_probability() -> None:
    model = BM(replace(SMALL, head_members=3), np.zeros((3, 8), dtype=np.float32)).eval()
    y = torch.zeros(4, 8)
    physics = torch.tensor([[50.0, 2e9, 4e9, 0.5, 1e6], [150.0, 2e9, 6e9, 1.5, 2e6], [250.0, 4e9, 2e9, 0.8, 1e6],
                            [90.0, 6e9, 4e9, 0.3, 5e5]])
    evidence = torch.rand(4, SMALL.evidence.features, generator=torch.Generator().manual_seed(0)) * 5
    with torch.no_grad():
        for net in model.head.members:  # members that disagree
            for parameter in net.parameters():
                parameter.add_(torch.randn_like(parameter) * 0.5)
        members = [torch.sigmoid(model.head(y, y, physics, evidence, member=m)[:, :2]) for m in range(3)]
        mean = torch.sigmoid(model.head(y, y, physics, evidence)[:, :2])
        # the warm-up's path: what the members read computed once for every pair, then the rows of a minibatch
        read, rows = model.head.member_inputs(PairSides.of_pairs(y, y, physics, evidence, model.head.lams)), [3, 1]
        for m in range(3):
            assert torch.equal(model.head.own(read.take(torch.tensor(rows)), m),
                               model.head(y[rows], y[rows], physics[rows], evidence[rows], member=m)[:, :2])
    torch.testing.assert_close(mean, torch.stack(members).mean(0), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="src and dst None"):  # rows of pairs that read shared rows are not pairs'
        PairSides(y, y, y, evidence, physics, physics, torch.tensor([0]), torch.tensor([0])).take(torch.tensor([0]))


PAIR_MLP_TOLERANCE = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=1e-4, atol=1e-4)}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("widths", [(32, 32, 1), (16, 1), (7, 5, 3), (32, 16, 2), (16,)], ids=str)
@pytest.mark.parametrize("pairs", [1, 9, 1000])  # 9: a block of 8 and a tail; 1000: the threads' shares
def test_the_fused_pair_network_matches_pytorchs_layers(dtype, widths, pairs) -> None:
    """Outside autograd on the CPU the head's networks run one C++ pass over the pairs: the same network by
    PyTorch's layers gives the same outputs, for hidden widths kept in registers (32, 16), any other width, an
    output logit or several, and first layers fed by inputs alone or by gathered rows (shared, or one per pair)."""
    g = torch.Generator().manual_seed(pairs + len(widths))
    net = mlp((11, *widths)).to(dtype).eval()
    with torch.no_grad():
        for parameter in net.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=g, dtype=dtype))
    first = widths[0]
    x = torch.randn(pairs, 11, generator=g, dtype=dtype)
    inputs = [(x[:, :4], net[0].weight[:, :4]), (x[:, 4:].contiguous(), net[0].weight[:, 4:])]
    for gathered in [(), ((torch.randn(5, first, generator=g, dtype=dtype), torch.randint(0, 5, (pairs,), generator=g)),
                          (torch.randn(pairs, first, generator=g, dtype=dtype), None))]:
        with torch.no_grad():
            assert fused_inference(x, "auto")
            got = pair_mlp(net, inputs, gathered)
        with torch.enable_grad():  # PyTorch's layers
            assert not fused_inference(x.requires_grad_(), "auto")
            want = pair_mlp(net, inputs, gathered).detach()
            if not gathered:  # the first layer by blocks is the network's own
                torch.testing.assert_close(want, net(x).detach(), **PAIR_MLP_TOLERANCE[dtype])
        x = x.detach()
        assert got.shape == (pairs, widths[-1]) and got.dtype == dtype
        torch.testing.assert_close(got, want, **PAIR_MLP_TOLERANCE[dtype])


def test_the_fused_pair_network_checks_its_inputs() -> None:
    extension, w = cpu_extension(), torch.zeros(4, 3)
    none = torch.empty(0, dtype=torch.int64)
    with pytest.raises(RuntimeError, match=r"indices\[0\]: every row must lie in \[0, 2\)"):
        extension.pair_mlp([torch.zeros(5, 3)], [w], [torch.zeros(2, 4)], [torch.tensor([0, 1, 2, 0, 1])], [],
                           [torch.zeros(4)])
    with pytest.raises(RuntimeError, match=r"indices\[0\]: \(pairs,\) int64, or empty"):
        extension.pair_mlp([torch.zeros(5, 3)], [w], [torch.zeros(4, 4)], [none], [], [torch.zeros(4)])
    with pytest.raises(RuntimeError, match=r"input_weights\[0\]: \(first width, its input width\)"):
        extension.pair_mlp([torch.zeros(5, 2)], [w], [], [], [], [torch.zeros(4)])


def test_the_scorers_head_pass_equals_the_trained_networks_layers() -> None:
    """What the scorer reads (every device's part once, the networks fused) equals the head's training pass, layer by
    layer in PyTorch, for pairs that share owners and collaborators."""
    model = BM(replace(SMALL, head_members=3, head_hidden=32), np.zeros((3, 8), dtype=np.float32)).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in model.head.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=g) * 0.3)
    devices, pairs, lams = 6, 40, model.head.lams
    rows = torch.rand(devices, SMALL.evidence.features, generator=g) * 5
    src, dst = torch.randint(0, devices, (pairs,), generator=g), torch.randint(0, devices, (pairs,), generator=g)
    physics = torch.stack([torch.rand(pairs, generator=g) * 300, torch.full((pairs,), 2e9), torch.full((pairs,), 4e9),
                           torch.rand(pairs, generator=g) * 2, torch.full((pairs,), 1e6)], dim=1)
    evidence = torch.cat([rows[dst, : 9 * lams], rows[src, 9 * lams: 11 * lams],
                          torch.rand(pairs, 4 * lams, generator=g), rows[dst, 15 * lams:]], dim=1)
    y = torch.zeros(devices, 8)
    split = PairSides.of_pairs(y, y, physics, rows, lams)
    sides = PairSides(y, split.owner, y, split.collaborator, evidence[:, 11 * lams: 15 * lams], physics, src, dst)
    with torch.no_grad():
        scored = model.head.read(sides)
    with torch.enable_grad():
        trained = model.head(y[src], y[dst], physics, evidence)
    torch.testing.assert_close(scored, trained.detach(), rtol=1e-4, atol=1e-5)


def test_context_head_reads_distance_and_knows_when_it_is_unknown() -> None:
    model = BM(SMALL, np.zeros((3, 8), dtype=np.float32)).eval()
    y = torch.zeros(3, 8)
    evidence = torch.zeros(3, SMALL.evidence.features)
    physics = torch.tensor([[50.0, 2e9, 4e9, 0.5, 1e6], [350.0, 2e9, 4e9, 0.5, 1e6], [float("nan")] * 5])
    with torch.no_grad():
        t_beh = model.t_beh(model.head(y, y, physics, evidence))
    assert t_beh[0] > t_beh[1] + 0.3  # the paper's curve: far pairs lose their transmissions
    assert torch.isfinite(t_beh).all()  # unknown physics reads the learned default, never NaN


def test_end_to_end_epochs_that_hurt_the_validation_loss_are_not_kept(history: History) -> None:
    """At a learning rate that wrecks every step, fit keeps the warmed-up head (epoch -1) and refits it on the
    fit and validation slots; Y, whose weights start at zero, then adds nothing."""
    train_slots, _ = time_split(history, 0.25)
    folds = blocked_folds(train_slots, 5)
    fit_slots = [s for f in folds[:-1] for s in f]
    setting = TrainConfig(epochs=3, patience=2, lr=10.0, chunk_slots=4)
    model = build(SMALL, prepare(history, SMALL, setting), setting)
    result = fit(model, history, fit_slots, folds[-1], setting)
    assert result.best_epoch == -1 and len(result.val_losses) == setting.patience  # stopped by patience
    assert not any(loss <= result.best_loss for loss in result.val_losses)  # worse, or NaN
    assert result.start_loss == result.best_loss and not result.end_to_end_gain > 0
    d = SMALL.gnn.out_dim
    assert all(torch.count_nonzero(net.behaviour[0].weight[:, : 2 * d]) == 0 for net in model.head.members)
    assert not model.uses_encoder  # so scoring, the ONNX export and the streaming job skip the encoder
    assert validation_loss(model, history, folds[-1]) < result.best_loss + 0.05  # the refitted head, not a wreck


def test_end_to_end_gain_is_the_share_of_the_warmed_up_loss_the_best_epoch_took_off() -> None:
    assert FitResult(-1, 0.8, [0.9, 0.9], [0.82, 0.81], 0.8).end_to_end_gain == pytest.approx(1 - 0.81 / 0.8)  # < 0
    assert FitResult(1, 0.78, [0.9] * 3, [0.79, 0.78, math.nan], 0.8).end_to_end_gain == pytest.approx(0.025)
    assert math.isnan(FitResult(-1, 0.8, [], [], 0.8).end_to_end_gain)  # no epoch ran


def test_time_split_never_mixes_and_folds_are_contiguous(history: History) -> None:
    train, test = time_split(history, 0.25)
    assert max(train) < min(test) and min(train) >= 1
    folds = blocked_folds(train, 5)
    assert [s for f in folds for s in f] == train and all(np.diff(f).max(initial=1) >= 1 for f in folds)


def test_training_beats_the_constant_and_checkpoints_round_trip(history: History, tmp_path) -> None:
    model, _, report = train_bm(history, SMALL, TrainConfig(epochs=6, patience=3, lr=1e-2, chunk_slots=4))
    train_targets = np.concatenate([history.graphs[t].t_col for t in report.train_slots])
    test_targets = np.concatenate([history.graphs[t].t_col for t in report.test_slots])
    constant = float(np.sqrt(np.mean((test_targets - train_targets.mean()) ** 2)))
    assert report.test_rmse < constant - 0.01  # knows more than the level; the full comparison is in evaluate
    assert -1 <= report.fit.best_epoch < 6  # -1: no end-to-end epoch beat the warmed-up head

    content = save(model, history.index, tmp_path / "ckpt", {"note": "test"})
    loaded, index, manifest = load(tmp_path / "ckpt", expect={"clock": SMALL.clock})
    assert index == history.index and manifest["model_version"] == f"bm-{content[:12]}"
    before, _ = predict(model, history, report.test_slots)
    after, _ = predict(loaded, history, report.test_slots)
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-7)
    assert loaded.config.evidence.on_time == model.config.evidence.on_time != ()  # the fitted factor travels

    with pytest.raises(CheckpointError, match="config.clock"):
        load(tmp_path / "ckpt", expect={"clock": SlotClock(slot_ms=1)})
    manifest_path = tmp_path / "ckpt" / "config.json"
    tampered = json.loads(manifest_path.read_text())
    tampered["config"]["window"] = 99
    manifest_path.write_text(json.dumps(tampered))
    with pytest.raises(CheckpointError, match="content hash"):
        load(tmp_path / "ckpt")
    save(model, history.index, tmp_path / "ckpt2")
    with open(tmp_path / "ckpt2" / "weights.pt", "ab") as handle:
        handle.write(b"\0")
    with pytest.raises(CheckpointError, match="file hashes"):
        load(tmp_path / "ckpt2")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        load(tmp_path / "nothing")


@pytest.mark.parametrize("kind", ["lstm", "transformer", "last", "pool"])
def test_learned_baselines_share_the_pipeline_and_ignore_padding(kind, history: History) -> None:
    from model.sequence import sequence_encoder

    encoder = sequence_encoder(kind, SMALL.mamba, SMALL.window).eval()
    x = torch.randn(2, 6, 8)
    junk = x.clone()
    junk[0, 3:] = 99.0
    lengths = torch.tensor([3, 6])
    with torch.no_grad():
        torch.testing.assert_close(encoder(x, lengths), encoder(junk, lengths))
        if kind == "pool":  # the window's max by hand: no parameters, nothing but the pool
            torch.testing.assert_close(encoder(junk, lengths), torch.stack([x[0, :3].amax(0), x[1].amax(0)]))
            assert not list(encoder.parameters())
    model = BM(replace(SMALL, sequence=kind), np.zeros((len(history.index), 8), dtype=np.float32))
    graph = history.graphs[5]
    raw = model.pair_outputs(history, PairQuery(graph.src, graph.dst, 4, graph.profile))
    assert raw.shape == (len(graph.src), 3 + model.head.experts.forecast_count)


def test_cli_train_writes_a_loadable_checkpoint(tmp_path, capsys) -> None:
    from trustbeam.cli import main

    assert main(["simulate", "--devices", "30", "--tasks", "600", "--slots", "12", "--out", str(tmp_path / "sim")]) == 0
    capsys.readouterr()
    events = str(tmp_path / "sim" / "events.parquet")
    assert main(["train", "--events", events, "--out", str(tmp_path / "ckpt"), "--epochs", "2", "--window", "4",
                 "--head-epochs", "20", "--memories", "0.9", "0.7"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model_version"].startswith("bm-") and len(report["val_loss"]) <= 2
    model, index, manifest = load(tmp_path / "ckpt")
    assert (model.config.evidence.lams, model.config.evidence.level_memory) == ((0.7, 0.9), 0.9)
    assert len(index) == report["devices"] and manifest["metadata"]["test_rmse"] == report["test_rmse"]
    assert report["size_corrected"] is False and not model.head.sizing.adopted  # one task size: nothing to read
    assert main(["train", "--events", events, "--out", str(tmp_path / "none"), "--head-epochs", "0"]) == 2
    assert "--head-epochs: expected at least 1 (got 0)" in capsys.readouterr().err
    assert main(["train", "--events", events, "--out", str(tmp_path / "none"), "--memories", "0.7", "1.5"]) == 2
    assert "--memories: distinct forgetting factors in (0, 1] (got 0.7 1.5)" in capsys.readouterr().err


def test_the_head_carries_channel_beta_as_its_rule_expert(history: History) -> None:
    """The stack's last expert is the rule itself: channel_beta fitted with lambda among the evidence's memories,
    forecasting the test edges as the rule does; the stack publishes it averaged with the head's own forecast
    unless the validation slots show a mixture clearly better."""
    train = TrainConfig(epochs=1, patience=1, chunk_slots=4, head_epochs=20)
    model, prepared, report = train_bm(history, SMALL, train)
    train_slots, _ = split_for_training(history, train)
    rule = channel_beta(history, train_slots, channel_beta_grid(prepared.lams))
    assert (prepared.rule.lam, prepared.rule.strength) == (rule.params.lam, rule.params.strength)
    want = predict_edges(rule, history, report.test_slots)
    with torch.no_grad():
        raw = model.pair_outputs(history, targets(history, report.test_slots, model.config.evidence).query)
        got = model.head.expert_forecasts(raw)[:, -1].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    stack = model.head.stack.numpy()
    assert stack.sum() == pytest.approx(1.0) and (stack >= 0).all()


def test_training_is_deterministic_for_a_seed(history: History) -> None:
    train = TrainConfig(epochs=2, patience=2, lr=1e-2, chunk_slots=4, seed=3, head_epochs=20)
    first, prepared, report = train_bm(history, SMALL, train)
    again = prepare(history, SMALL, train)
    np.testing.assert_array_equal(prepared.features, again.features)
    assert (prepared.outage, prepared.on_time) == (again.outage, again.on_time)
    second, _, _ = train_bm(history, SMALL, train, prepared=prepared)  # a run's learned methods share it
    np.testing.assert_array_equal(predict(first, history, report.test_slots)[0],
                                  predict(second, history, report.test_slots)[0])


def test_the_members_warm_up_side_by_side_as_one_after_another(history: History) -> None:
    """With two intra-op threads the warm-up fits two members at once, one thread each: the same model as one
    member after another on one thread, and the thread setting is left as it was."""
    train, before, predicted = TrainConfig(epochs=1, patience=1, chunk_slots=4, seed=3, head_epochs=6), \
        torch.get_num_threads(), []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            model, _, report = train_bm(history, SMALL, train)
            assert torch.get_num_threads() == threads
            predicted.append(predict(model, history, report.test_slots)[0])
    finally:
        torch.set_num_threads(before)
    np.testing.assert_array_equal(*predicted)


def test_every_encoder_starts_its_head_alike_for_a_seed() -> None:
    """The head's start is a draw of its own: the same for BM, the LSTM, the Transformer and GNN-only built with
    one seed, though their encoders draw different numbers before it; another seed, another start."""
    def head_state(kind: str, seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return BM(replace(SMALL, sequence=kind), np.zeros((3, 8), dtype=np.float32)).head.state_dict()

    bimamba = head_state("bimamba", 5)
    for kind in ("lstm", "transformer", "last", "pool"):
        other = head_state(kind, 5)
        assert other.keys() == bimamba.keys() and all(torch.equal(other[k], bimamba[k]) for k in bimamba)
    assert not torch.equal(head_state("bimamba", 6)["members.0.tr_adjust.0.weight"],
                           bimamba["members.0.tr_adjust.0.weight"])
    assert torch.initial_seed() == 6  # the head's own seed leaves the process's as it was


@pytest.mark.parametrize("epochs", [0, 1])  # 0: no end-to-end epoch, so the warmed-up head is refitted
def test_encoders_share_one_warm_up_and_get_what_fitting_it_again_gives(epochs: int, history: History) -> None:
    """Trained one after another with one :class:`WarmUps`, the LSTM and GNN-only take BM's warm-up (and its
    refit) instead of fitting them: the same model, bit for bit, as the LSTM trained alone. A head with dropout
    draws from PyTorch's stream, so nothing is shared there."""
    train = TrainConfig(epochs=epochs, patience=1, chunk_slots=4, seed=3, head_epochs=6)
    warm_ups = WarmUps()
    shared = {kind: train_bm(history, replace(SMALL, sequence=kind), train, warm_ups=warm_ups)
              for kind in ("bimamba", "lstm", "last")}
    alone = train_bm(history, replace(SMALL, sequence="lstm"), train)
    refits = sum(report.fit.best_epoch == -1 for _, _, report in shared.values())
    assert len(warm_ups.done) == 1 and warm_ups.hits == 2 + max(refits - 1, 0)  # taken: 2 warm-ups, later refits
    if epochs == 0:
        assert refits == 3
    kept = shared["lstm"][0].state_dict()
    assert kept.keys() == alone[0].state_dict().keys()
    for name, value in alone[0].state_dict().items():  # the members, and what the end-to-end epochs made of them
        assert torch.equal(kept[name], value), name
    test_slots = alone[2].test_slots
    np.testing.assert_array_equal(predict(shared["lstm"][0], history, test_slots)[0],
                                  predict(alone[0], history, test_slots)[0])
    if epochs == 0:
        dropping = WarmUps()
        for kind in ("bimamba", "lstm"):
            train_bm(history, replace(SMALL, sequence=kind), replace(train, dropout=0.1), warm_ups=dropping)
        assert not dropping.done and dropping.hits == 0


def test_members_run_on_threads_unless_they_draw_random_numbers() -> None:
    together = threading.Barrier(2, timeout=30)  # passes only if both members run at once
    head = BM(SMALL, np.zeros((3, 8), dtype=np.float32)).head
    assert parallel_members(head, 2)(lambda k: (together.wait(), k)[1]) == [0, 1]
    callers = parallel_members(BM(replace(SMALL, dropout=0.1), np.zeros((3, 8), dtype=np.float32)).head, 2)(
        lambda k: threading.get_ident())
    assert callers == [threading.get_ident()] * 2  # dropout draws from PyTorch's one stream: in order, here
    assert parallel_members(head, 1)(lambda k: threading.get_ident()) == [threading.get_ident()] * 2


def test_grid_search_picks_the_best_cv_setting_in_any_number_of_processes(history: History) -> None:
    grid = TrainConfig(epochs=2, patience=1, chunk_slots=4, folds=2, grid={"lr": (1e-1, 1e-3), "dropout": (0.0,)},
                       head_epochs=4)
    _, _, serial = train_bm(history, SMALL, grid)
    assert [(row["lr"], row["dropout"]) for row in serial.search] == [(1e-1, 0.0), (1e-3, 0.0)]
    best = min(serial.search, key=lambda row: row["cv_loss"])
    assert serial.setting == {"lr": best["lr"], "weight_decay": grid.weight_decay, "dropout": 0.0}
    _, _, parallel = train_bm(history, SMALL, replace(grid, workers=2))
    assert [row["cv_loss"] for row in parallel.search] == pytest.approx([row["cv_loss"] for row in serial.search],
                                                                       rel=1e-4)
    assert parallel.setting == serial.setting


def test_prediction_by_chunks_equals_one_pass(history: History) -> None:
    model = BM(PAPER, np.random.default_rng(0).normal(size=(len(history.index), 8)).astype(np.float32))
    slots = list(range(3, history.slots))
    whole, whole_targets = predict(model, history, slots, chunk_slots=len(slots))
    parts, part_targets = predict(model, history, slots, chunk_slots=2)
    np.testing.assert_allclose(parts, whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(part_targets, whole_targets)
    assert len(whole) == sum(len(history.graphs[t].src) for t in slots if history.graphs[t] is not None)
    literal, _ = predict(model, history, slots, readout="max", chunk_slots=5)
    assert set(np.round(literal * (SMALL.levels - 1), 6)) <= set(range(SMALL.levels))  # levels only


def test_the_distance_alone_is_learned() -> None:
    """Every device behaves alike and only the pair's distance matters; the simulator's outage threshold
    (6 dB) is not the model's prior (0 dB), so the curve must come from the outcomes."""
    config = SimConfig(devices=60, tasks=3000, slots=20, seed=2, mix={Behaviour.STABLE_RELIABLE: 1.0},
                       cpu_choices_hz=(4e9,), outage_snr_db=6.0)
    history, truth = simulated_history(config)
    model, prepared, report = train_bm(history, SMALL, TrainConfig(epochs=1, patience=1, chunk_slots=4))
    hidden = truth_for(history, report.test_slots, truth)
    learned = predict(model, history, report.test_slots)[0]
    level = predict_edges(RunningMean(len(history.index)), history, report.test_slots)
    rmse = lambda prediction: float(np.sqrt(np.mean((prediction - hidden) ** 2)))  # noqa: E731
    assert rmse(learned) < 0.5 * rmse(level)
    assert prepared.outage.log_c > -4.0  # the paper's 0 dB curve has log c = -4.6; 6 dB moves it up by log 4


def test_a_new_device_reads_the_cold_row_and_its_own_evidence(history: History) -> None:
    train = TrainConfig(epochs=1, patience=1, chunk_slots=4, head_epochs=30)
    prepared = prepare(history, SMALL, train)
    known = prepared.known.copy()
    assert known.all()  # every device of this log served or owned in the training period
    model, _, _ = train_bm(history, SMALL, train, prepared=replace(prepared, known=np.r_[False, known[1:]]))
    model.eval()
    with torch.no_grad():
        features = model.device_features()
    torch.testing.assert_close(features[0], model.cold)  # device 0 is new: the learned cold row
    torch.testing.assert_close(features[1:], model.features[1:])
    batch = targets(history, [history.slots - 1])
    with torch.no_grad():
        assert torch.isfinite(model.t_beh(model.pair_outputs(history, batch.query))).all()


def test_the_head_reads_what_was_not_believed_only_where_owners_report(history: History) -> None:
    """Where owners report their tasks (and may lie), training gives the head what was reported and not believed
    (model.evidence.discredited_block); where monitors see every task there is none, and the head stays as it was."""
    train = TrainConfig(epochs=1, patience=1, chunk_slots=4, head_epochs=5)
    assert not prepare(history, SMALL, train).discredited
    stuffed, _ = simulated_history(SimConfig(devices=40, tasks=1200, slots=24, seed=4, owner_reports=1.0,
                                             attack=Attack(AttackKind.BALLOT_STUFFING, 0.2)))
    model, _, _ = train_bm(stuffed, SMALL, train)
    evidence = model.config.evidence
    assert evidence.discredited and evidence.normalized == replace(evidence, discredited=False).normalized + 16
    assert all(member.inputs == evidence.normalized + model.head.experts.count for member in model.head.members)
    batch = targets(stuffed, [stuffed.slots - 1])
    evidence_in = stuffed.pair_evidence(batch.query.src, batch.query.dst, batch.query.end, evidence)
    block = slice(evidence.normalized - 4 * len(evidence.lams), evidence.normalized)  # the collaborator's last
    assert evidence_in.shape[1] == evidence.features and evidence_in[:, block].any()
    assert torch.isfinite(model.t_beh(model.pair_outputs(stuffed, batch.query))).all()


def test_the_evidence_keeps_a_long_memory_only_where_devices_report_their_loads(history: History) -> None:
    """Where statuses carry the load, training keeps a long memory beside the others (the load's trace tells the head
    when a device's long record still holds) and watches the loads for shifts; without loads the memories stay as
    configured and nothing is watched."""
    train = TrainConfig(epochs=1, patience=1, chunk_slots=4, head_epochs=5)
    plain = prepare(history, SMALL, train)
    assert plain.lams == SMALL.evidence.lams and plain.configure(SMALL).evidence.lams == SMALL.evidence.lams
    assert not plain.shifts and not plain.configure(SMALL).evidence.shifts
    loaded, _ = simulated_history(SimConfig(devices=40, tasks=1200, slots=24, seed=4, telemetry=True))
    model, prepared, _ = train_bm(loaded, SMALL, train)
    evidence = model.config.evidence
    assert prepared.lams == evidence.lams == (*SMALL.evidence.lams, LONG_MEMORY)
    assert prepared.shifts and evidence.shifts  # and the head reads what each device showed since its load shifted
    assert evidence.features == replace(evidence, shifts=False).features + 2 * len(evidence.lams) + 2
    assert model.head.lams == len(SMALL.evidence.lams) + 1 and model.head.experts.count == 2 * model.head.lams
    batch = targets(loaded, [loaded.slots - 1])
    sums = loaded.collaborator_sums(batch.query.dst, batch.query.end, evidence)[0]  # (P, L, C)
    tasks = [sum(float(g.tasks[g.dst == j].sum()) * LONG_MEMORY ** (end - g.slot)
                 for g in loaded.graphs[: end + 1] if g is not None) for j, end in zip(batch.query.dst, batch.query.end)]
    np.testing.assert_allclose(sums[:, -1, N], tasks)  # every task the collaborator served, faded by its age
    assert torch.isfinite(model.t_beh(model.pair_outputs(loaded, batch.query))).all()
