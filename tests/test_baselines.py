"""Rule baselines against hand-computed values on a tiny history."""

from __future__ import annotations

import numpy as np
import pytest

from model.baselines import BetaParams, QSParams, RunningMean, beta_reputation, predict_edges, qs_trust
from model.graphs import DeviceIndex, SlotGraph
from model.history import History
from model.targets import targets


def tiny() -> History:
    # devices a=0, b=1, c=2. slot 0: a->c 1.0, b->c 0.0. slot 1: nothing. slot 2: a->c 0.5. slot 3: a->c, b->c, a->b
    def g(t, src, dst, t_col):
        return SlotGraph(t, np.array(src), np.array(dst), np.array(t_col, dtype=float), np.zeros(len(src)))

    graphs = (g(0, [0, 1], [2, 2], [1.0, 0.0]), None, g(2, [0], [2], [0.5]), g(3, [0, 1, 0], [2, 2, 1], [0.2, 0.4, 0.9]))
    return History(DeviceIndex(("a", "b", "c")), 0, graphs)


def test_beta_reputation_by_hand() -> None:
    p = BetaParams(lam=0.5, w=0.1)
    out = beta_reputation(tiny(), [2, 3], p)
    # before slot 2 (after two decays... slot 0 evidence decayed once by the empty slot 1):
    # a->c: r = 1*0.5, s = 0; c overall: R = 0.5, S = 0.5
    e_2 = (0.5 + 0.1 * 0.5 + 1) / (0.5 + 0 + 0.1 * 1.0 + 2)
    # before slot 3: decay then add slot 2: r_ac = 0.25 + 0.5, s_ac = 0.5; R_c = 0.25 + 0.5, S_c = 0.25 + 0.5;
    # r_bc = 0, s_bc = 0.25; a->b unseen, R_b = S_b = 0
    e_ac = (0.75 + 0.1 * 0.75 + 1) / (0.75 + 0.5 + 0.1 * 1.5 + 2)
    e_bc = (0 + 0.1 * 0.75 + 1) / (0 + 0.25 + 0.1 * 1.5 + 2)
    assert out.tolist() == pytest.approx([e_2, e_ac, e_bc, 0.5])


def test_qs_trust_by_hand() -> None:
    out = qs_trust(tiny(), [2, 3], QSParams(beta=0.5, k=2.0))
    # slot 2, a->c: direct 1.0 (1 obs), recommendation from b: 0.0 (1 obs); own weight 1/3
    t_2 = (1 / 3) * 1.0 + (2 / 3) * 0.0
    # slot 3: a->c direct = 0.5*1.0 + 0.5*0.5 = 0.75 (2 obs), rec from b = 0.0 -> 0.5*0.75 + 0.5*0
    # b->c: direct 0.0 (1 obs), rec from a = 0.75 -> (1/3)*0 + (2/3)*0.75; a->b: nothing known -> 0.5
    assert out.tolist() == pytest.approx([t_2, 0.375, 0.5, 0.5])


def test_running_mean_by_hand() -> None:
    out = predict_edges(RunningMean(3), tiny(), [0, 2, 3])
    # slot 0: nothing read yet -> 0.5; slot 2: mean of 1.0, 0.0; slot 3: mean of 1.0, 0.0, 0.5 for every pair
    assert out.tolist() == pytest.approx([0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    scorer = RunningMean(3)
    for graph in tiny().graphs:
        scorer.advance(graph)
    assert scorer.score(np.array([0]), np.array([1])).tolist() == pytest.approx([(1.0 + 0.0 + 0.5 + 0.2 + 0.4 + 0.9) / 6])


def test_rules_track_a_degrading_collaborator() -> None:
    graphs = tuple(SlotGraph(t, np.array([0]), np.array([1]), np.array([1.0 if t < 10 else 0.0]), np.zeros(1))
                   for t in range(20))
    history = History(DeviceIndex(("a", "b")), 0, graphs)
    for predict in (beta_reputation, qs_trust):
        out = predict(history, range(1, 20))
        assert out[8] > 0.8 and out[-1] < out[8] - 0.5


def flagged(t, src, dst, tr, com) -> SlotGraph:
    tr, com = np.array(tr, dtype=float), np.array(com, dtype=float)
    return SlotGraph(t, np.array(src), np.array(dst), 0.6 * tr + 0.4 * com, np.zeros(len(src)),
                     tasks=np.ones(len(src)), flagged=np.ones(len(src)), tr=tr, com=com)


def test_channel_beta_by_hand() -> None:
    from model.baselines import ChannelBeta, ChannelBetaParams
    from model.channel import OutageCurve
    from model.status import StatusLog

    # slot 0: a->c transmitted and computed, b->c transmitted only; slot 1: nothing
    graphs = (flagged(0, [0, 1], [2, 2], [1, 1], [1, 0]), None)
    positions = np.zeros((3, 9))
    positions[:, 3] = [0.0, 0.0, 100.0]  # x: c lies 100 m from a and b
    status = StatusLog(np.arange(3), np.zeros(3, np.int64), positions)
    history = History(DeviceIndex(("a", "b", "c")), 0, graphs, status)
    outage = OutageCurve(log_c=np.log(0.5), alpha=2.0)  # P_tr(100 m) = exp(-0.5)
    rule = ChannelBeta(history, outage, None, None, prior_mean=0.5, params=ChannelBetaParams(lam=0.5, strength=2.0))
    rule.advance(graphs[0])
    rule.advance(graphs[1])
    # c: 1 computation of 2 transmissions, decayed once by the empty slot: (0.5 + 2 * 0.5) / (1 + 2)
    behaviour = (0.5 + 1.0) / (1.0 + 2.0)
    got = rule.score(np.array([0, 0]), np.array([2, 1]))
    assert got[0] == pytest.approx(np.exp(-0.5) * (0.6 + 0.4 * behaviour))
    assert got[1] == pytest.approx(np.exp(-0.5 * 0.01 ** 2) * (0.6 + 0.4 * 0.5))  # b: 0 m, floored at 1; no evidence


def test_channel_beta_is_fitted_on_the_training_period_only() -> None:
    from model.baselines import channel_beta

    graphs = tuple(flagged(t, [0, 1], [2, 2], [1, 1], [1 if t < 20 else 0, 1]) for t in range(30))
    history = History(DeviceIndex(("a", "b", "c")), 0, graphs)
    early = channel_beta(history, list(range(1, 20)))
    assert early.prior_mean == pytest.approx((38 + 1) / (38 + 2))  # the later failures are not seen
    scores = predict_edges(early, history, range(1, 30))
    assert scores[0] > scores[-2]  # ... but the online evidence follows them


def sized(t, src, dst, tr, com, size_bits) -> SlotGraph:
    graph = flagged(t, src, dst, tr, com)
    profile = np.stack([np.array(size_bits, dtype=float), np.full(len(src), 1000.0)], axis=1)
    return SlotGraph(graph.slot, graph.src, graph.dst, graph.t_col, graph.offset, graph.tasks, graph.flagged,
                     graph.tr, graph.com, profile)


def test_the_sized_rule_by_hand() -> None:
    from model.baselines import SizedChannelBeta, SizedParams
    from model.channel import OutageCurve

    # c computes a's 1-Mbit task and fails b's 4-Mbit one (both transmitted); split at 2 Mbit: x = -1, +1
    graphs = (sized(0, [0, 1], [2, 2], [1, 1], [1, 0], [1e6, 4e6]),)
    history = History(DeviceIndex(("a", "b", "c")), 0, graphs)
    outage = OutageCurve(log_c=np.log(0.5), alpha=2.0)
    rule = SizedChannelBeta(history, outage, None, None, prior_mean=0.5,
                            params=SizedParams(lam=1.0, strength=2.0, ridge=1.0), split_bits=2e6)
    rule.advance(graphs[0])
    rate = (1 + 2 * 0.5) / (2 + 2)  # the beta estimate, as channel_beta's
    slope = (-1 - 1 * 0) / (2 - 0 + 1.0 * 2)  # (HX - H mean_x) / (WXX - WX mean_x + ridge W): x = -1 succeeded
    p_tr = rule.tr_rate  # no statuses: the distance is unknown, so P_tr is the transmission rate (1 here)
    profile = np.array([[8e6, 1000.0], [0.5e6, 1000.0], [np.nan, np.nan]])
    got = rule.score(np.array([0, 0, 0]), np.array([2, 2, 2]), profile)
    assert got.tolist() == pytest.approx([p_tr * (0.6 + 0.4 * (rate + slope * 1)),  # an 8-Mbit task: large, x = 1
                                          p_tr * (0.6 + 0.4 * (rate + slope * -1)),  # 0.5 Mbit: small, x = -1
                                          p_tr * (0.6 + 0.4 * rate)])  # size unknown: j's mean size
    assert got[1] > got[2] > got[0]


def test_the_sized_rule_is_channel_beta_where_every_task_has_one_size() -> None:
    from model.baselines import channel_beta, channel_beta_sized

    rng = np.random.default_rng(0)
    graphs = tuple(sized(t, [0, 1], [2, 2], rng.random(2) < 0.9, rng.random(2) < 0.6, [5e6, 5e6]) for t in range(30))
    history = History(DeviceIndex(("a", "b", "c")), 0, graphs)
    plain, sized_rule = channel_beta(history, list(range(20))), channel_beta_sized(history, list(range(20)))
    assert (sized_rule.params.lam, sized_rule.params.strength) == (plain.params.lam, plain.params.strength)
    np.testing.assert_allclose(predict_edges(sized_rule, history, range(20, 30)),
                               predict_edges(plain, history, range(20, 30)), rtol=0, atol=1e-12)


def test_the_sized_rule_tells_an_opportunistic_collaborator_by_the_task_size() -> None:
    from model.baselines import channel_beta, channel_beta_sized

    # c computes every small task and fails every large one; d is as reliable on both (the same overall rate)
    rng = np.random.default_rng(1)
    graphs = []
    for t in range(60):
        size = rng.choice([1e6, 4e6], 2)
        com = [size[0] < 2e6, rng.random() < 0.5]
        graphs.append(sized(t, [0, 1], [2, 3], [1, 1], com, size))
    history = History(DeviceIndex(("a", "b", "c", "d")), 0, tuple(graphs))
    plain, rule = channel_beta(history, list(range(40))), channel_beta_sized(history, list(range(40)))
    for t in range(60):
        rule.advance(history.graphs[t])
        plain.advance(history.graphs[t])
    small, large = np.array([[1e6, 1000.0]] * 2), np.array([[4e6, 1000.0]] * 2)
    pairs = np.array([0, 1]), np.array([2, 3])
    c_small, d_small = rule.score(*pairs, small)
    c_large, d_large = rule.score(*pairs, large)
    assert c_small - c_large > 0.2 and abs(d_small - d_large) < 0.1
    assert abs(plain.score(*pairs, small)[0] - plain.score(*pairs, large)[0]) < 1e-12  # the plain rule cannot


def test_the_size_is_read_only_where_the_training_period_shows_it_helps() -> None:
    from model.baselines import size_matters

    rng = np.random.default_rng(2)

    def log(opportunistic: bool) -> History:  # 8 collaborators, sizes 1 or 4 Mbit; half of them fail large tasks
        graphs = []
        for t in range(60):
            size = rng.choice([1e6, 4e6], 8)
            fails_large = opportunistic & (np.arange(8) % 2 == 0) & (size > 2e6)
            com = ~fails_large & (rng.random(8) < 0.8)
            graphs.append(sized(t, [8] * 8, list(range(8)), [1] * 8, com, size))
        return History(DeviceIndex(tuple(f"d{k}" for k in range(9))), 0, tuple(graphs))

    assert size_matters(log(opportunistic=True), list(range(50)))
    assert not size_matters(log(opportunistic=False), list(range(50)))


def test_bms_size_correction_is_the_sized_rules() -> None:
    """The head's size correction (model.experts.SizeCorrection, read from the evidence's size sums) moves each test
    edge's forecast by what the sized rule's size_shift says, slot by slot, with the same parameters."""
    from dataclasses import replace

    import torch

    from model.baselines import SizedParams, channel_beta_sized
    from model.bm import BM
    from tests.test_bm import SMALL

    rng = np.random.default_rng(3)
    graphs = []
    for t in range(30):  # 8 collaborators of one owner, sizes 1-8 Mbit; the even ones fail tasks over 2 Mbit
        size = 2 ** rng.uniform(20, 23, 8)
        com = ~((np.arange(8) % 2 == 0) & (size > 2e6)) & (rng.random(8) < 0.9)
        graphs.append(sized(t, [8] * 8, list(range(8)), rng.random(8) < 0.9, com, size))
    history = History(DeviceIndex(tuple(f"d{k}" for k in range(9))), 0, tuple(graphs))
    params = SizedParams(lam=0.9, strength=2.0, ridge=1.0)
    rule = channel_beta_sized(history, list(range(20)), grid=(params,))
    config = replace(SMALL, evidence=replace(SMALL.evidence, colocation_m=None, size_split_bits=rule.split_bits))
    model = BM(config, np.zeros((9, 8), np.float32), outage=rule.outage, tr_rate=rule.tr_rate).eval()
    model.head.sizing.adopt(config.evidence.lams.index(0.9), params.strength, rule.prior_mean, params.ridge)
    slots = list(range(20, 30))
    with torch.no_grad():
        got = model.pair_outputs(history, targets(history, slots).query)[:, -1].double().numpy()
    want = []
    for t, graph in enumerate(graphs):
        if t in slots:
            want.append(rule.size_shift(graph.src, graph.dst, graph.profile))
        rule.advance(graph)
    want = np.concatenate(want)
    assert np.abs(want).max() > 0.05  # sizes that matter
    np.testing.assert_allclose(got, want, atol=2e-5)


def test_fairness_and_goodness_by_hand() -> None:
    from model.baselines import FairnessGoodness

    # a and b rate c +1 and -1: goodness(c) = 0, both fairness 1 - 1/2
    scorer = FairnessGoodness(4)
    scorer.advance(SlotGraph(0, np.array([0, 1]), np.array([2, 2]), np.array([1.0, 0.0]), np.zeros(2)))
    assert scorer.score(np.array([0, 3]), np.array([2, 3])).tolist() == pytest.approx([0.5, 0.5])
    assert scorer.fairness[:2].tolist() == pytest.approx([0.5, 0.5]) and scorer.goodness[2] == pytest.approx(0.0)
    # a richer log: the solution satisfies both of the method's equations
    scorer.advance(SlotGraph(1, np.array([0, 3, 0]), np.array([1, 2, 3]), np.array([0.0, 1.0, 0.9]), np.zeros(3)))
    scorer.score(np.array([0]), np.array([1]))
    f, g = scorer.fairness, scorer.goodness
    pairs = {(0, 2): 1.0, (1, 2): -1.0, (0, 1): -1.0, (3, 2): 1.0, (0, 3): 0.8}
    for v in (1, 2, 3):
        incoming = [(u, w) for (u, x), w in pairs.items() if x == v]
        assert g[v] == pytest.approx(sum(f[u] * w for u, w in incoming) / len(incoming), abs=1e-5)
    for u in (0, 1, 3):
        outgoing = [(x, w) for (y, x), w in pairs.items() if y == u]
        assert f[u] == pytest.approx(1 - sum(abs(w - g[x]) for x, w in outgoing) / (2 * len(outgoing)), abs=1e-5)
