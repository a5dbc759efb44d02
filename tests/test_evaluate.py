"""Evaluation: metrics against hand-computed values, truth alignment, and the quick report end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from model.evaluate import (CALIBRATION_BINS, by_label, calibration, paired_differences, per_slot_rmse, scores,
                            shifted_scorer, summarize, truth_for)
from model.metrics import expected_calibration_error, mean_error
from model.graphs import DeviceIndex, SlotGraph
from model.history import History
from model.recalibration import RecalibrationConfig, replayed_shifts
from trustbeam.cli import main


def test_scores_by_hand() -> None:
    s = scores(np.array([0.5, 1.0, 0.0]), np.array([1.0, 1.0, 0.5]))
    assert s.rmse == pytest.approx(math.sqrt((0.25 + 0 + 0.25) / 3))
    assert s.mae == pytest.approx(1 / 3)
    s = scores(np.array([0.5, 1.0, 0.0]), np.array([1.0, 1.0, 0.5]), median=np.array([1.0, 1.0, 0.0]))
    assert s.rmse == pytest.approx(math.sqrt((0.25 + 0 + 0.25) / 3))  # RMSE stays the mean forecast's
    assert s.mae == pytest.approx(0.5 / 3)  # MAE is the median forecast's


def test_expected_calibration_error_by_hand() -> None:
    prediction = np.array([0.05, 0.15, 0.12, 0.95, 1.0, 0.5])
    target = np.array([0.0, 0.2, 0.4, 1.0, 0.8, 0.6])
    # bins: [0, .1): 0.05 vs 0.0; [.1, .2): (0.15 + 0.12) vs (0.2 + 0.4); [.5, .6): 0.5 vs 0.6; [.9, 1]: 1.95 vs 1.8
    want = (abs(0.05 - 0.0) + abs(0.27 - 0.6) + abs(0.5 - 0.6) + abs(1.95 - 1.8)) / 6
    assert expected_calibration_error(prediction, target, CALIBRATION_BINS) == pytest.approx(want)
    assert expected_calibration_error(target, target, CALIBRATION_BINS) == 0.0
    # a constant prediction at the mean is calibrated in its one bin, however poor it is at ranking
    assert expected_calibration_error(np.full(4, 0.5), np.array([0.0, 1.0, 0.2, 0.8]), CALIBRATION_BINS) == \
        pytest.approx(0.0, abs=1e-12)
    assert math.isnan(expected_calibration_error(np.zeros(0), np.zeros(0), CALIBRATION_BINS))


def test_per_slot_rmse_by_hand() -> None:
    prediction, target = np.array([0.5, 0.5, 1.0, 0.0]), np.array([1.0, 0.0, 1.0, 1.0])
    got = per_slot_rmse(prediction, target, np.array([3, 3, 5, 5]), [3, 4, 5])
    assert got[0] == pytest.approx(0.5) and math.isnan(got[1]) and got[2] == pytest.approx(math.sqrt(0.5))


def test_calibration_by_hand() -> None:
    prediction = np.array([0.05, 0.15, 0.12, 0.95, 1.0, 0.5])
    target = np.array([0.0, 0.2, 0.4, 1.0, 0.8, 0.6])
    got = calibration(prediction, target)
    assert got["share"] == pytest.approx([1 / 6, 2 / 6, 0, 0, 0, 1 / 6, 0, 0, 0, 2 / 6])
    mean = got["mean_target"]
    assert mean[0] == 0.0 and mean[1] == pytest.approx(0.3) and mean[5] == pytest.approx(0.6)
    assert mean[9] == pytest.approx(0.9)  # 1.0 falls in the last bin, not past it
    assert all(math.isnan(mean[k]) for k in (2, 3, 4, 6, 7, 8))


def test_summary_skips_empty_points_but_keeps_all_empty_ones() -> None:
    runs = [{"bm": {"curve": [0.2, float("nan")]}}, {"bm": {"curve": [0.4, float("nan")]}},
            {"bm": {"curve": [float("nan"), float("nan")]}}]
    curve = summarize(runs)["bm"]["curve"]
    assert curve["mean"][0] == pytest.approx(0.3) and math.isnan(curve["mean"][1])


def test_rolling_mean_by_hand() -> None:
    from model.plots import rolling_mean

    got = rolling_mean(np.array([1.0, 3.0, float("nan"), 5.0, 7.0]), 2)
    assert got[:2].tolist() == [1.0, 2.0] and got[2] == 3.0 and got[3] == 5.0 and got[4] == 6.0
    assert math.isnan(rolling_mean(np.array([float("nan")]), 3)[0])


def test_summary_mean_and_std() -> None:
    runs = [{"bm": {"rmse": 0.2, "mae": 0.1}}, {"bm": {"rmse": 0.4, "mae": 0.3}}]
    assert summarize(runs) == {"bm": {"rmse": {"mean": pytest.approx(0.3), "std": pytest.approx(0.1)},
                                      "mae": {"mean": pytest.approx(0.2), "std": pytest.approx(0.1)}}}


def test_rmse_by_label_by_hand() -> None:
    got = by_label(np.array([0.5, 0.5, 1.0]), np.array([1.0, 0.0, 1.0]), np.array(["b", "b", "a"]))
    assert got == {"a": 0.0, "b": pytest.approx(0.5)} and list(got) == ["a", "b"]


def test_mean_error_by_label_by_hand() -> None:
    # label b: (0.5 - 1.0 + 0.5 - 0.0) / 2 = 0 (errors cancel, as the RMSE's 0.5 does not); a: 0.8 - 1.0
    got = by_label(np.array([0.5, 0.5, 0.8]), np.array([1.0, 0.0, 1.0]), np.array(["b", "b", "a"]), mean_error)
    assert got == {"a": pytest.approx(-0.2), "b": 0.0} and list(got) == ["a", "b"]
    assert np.isnan(mean_error(np.zeros(0), np.zeros(0)))


def test_summary_of_per_label_figures_counts_only_the_runs_that_have_the_label() -> None:
    runs = [{"bm": {"by": {"a": 0.2, "b": 0.4}}}, {"bm": {"by": {"a": 0.4}}}]
    assert summarize(runs)["bm"]["by"] == {"a": {"mean": pytest.approx(0.3), "std": pytest.approx(0.1)},
                                           "b": {"mean": pytest.approx(0.4), "std": 0.0}}


def test_paired_differences_by_hand() -> None:
    runs = [{"bm": {"e": 0.10}, "lstm": {"e": 0.12}, "rule": {"e": 0.11}, "oracle": {"e": 0.0}},
            {"bm": {"e": 0.20}, "lstm": {"e": 0.18}, "rule": {"e": 0.23}, "oracle": {"e": 0.0}},
            {"bm": {"e": 0.30}, "lstm": {"e": 0.31}, "rule": {"e": 0.32}, "oracle": {"e": 0.0}}]
    paired = paired_differences(runs, "e")
    lstm = paired["differences"]["lstm"]
    d = np.array([-0.02, 0.02, -0.01])
    assert lstm["mean"] == pytest.approx(d.mean()) and lstm["runs"] == 3
    assert lstm["se"] == pytest.approx(d.std(ddof=1) / math.sqrt(3))
    # the oracle is compared but is never the best other method: it knows the truth
    assert paired["best_other"] == "lstm" and paired["differences"]["oracle"]["mean"] == pytest.approx(0.2)
    assert math.isnan(paired_differences(runs[:1], "e")["differences"]["rule"]["se"])  # one run: no error bar
    assert paired_differences(runs, "missing") is None


def test_every_method_of_a_plot_looks_different() -> None:
    from model.evaluate import METHODS
    from model.plots import method_styles

    names = [*METHODS, "bm_paper_max", "random", *(f"extra{k}" for k in range(12))]
    styles = method_styles(names)
    looks = {(style["color"], style["marker"], style["linestyle"]) for style in styles.values()}
    assert len(looks) == len(names)
    assert len({styles[m]["color"] for m in names[:20]}) == 20  # the first twenty differ by colour alone


@pytest.mark.parametrize("args, message", [(["--seed", "-1"], "--seed: must be >= 0 (got -1)"),
                                           (["--mix", "stable_reliable=1,sneaky=1"], "unknown behaviour 'sneaky'"),
                                           (["--sim-devices", "1"], "--sim-devices: need at least 2 devices (got 1)"),
                                           (["--sim-devices", "2000", "--events", "x.parquet"],
                                            "--sim-slots, --sim-devices: simulated runs only"),
                                           (["--overclaimer-cpu-hz", "4e9"], "--overclaimer-cpu-hz: only with --attack"),
                                           (["--attack", "overclaiming=0.2", "--overclaimer-cpu-hz", "7e9"],
                                            "--overclaimer-cpu-hz: an overclaimer claims the fastest CPU")])
def test_evaluate_refuses_bad_options_by_name(args, message, tmp_path, capsys) -> None:
    assert main(["evaluate", "--quick", "--runs", "1", "--quiet", "--out", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err


def test_truth_is_aligned_with_test_targets() -> None:
    graphs = (None, SlotGraph(1, np.array([0, 1]), np.array([1, 0]), np.array([1.0, 0.0]), np.zeros(2)))
    history = History(DeviceIndex(("a", "b")), 10, graphs)
    truth = pa.table({"owner": ["b", "a"], "collaborator": ["a", "b"], "slot": [11, 11], "reliability": [0.2, 0.9]})
    assert truth_for(history, [1], truth).tolist() == [0.9, 0.2]
    with pytest.raises(ValueError, match="no truth row"):
        truth_for(history, [1], truth.slice(0, 1))


def test_quick_evaluation_writes_the_report(tmp_path, capsys) -> None:
    predictions = tmp_path / "forecasts.parquet"
    assert main(["evaluate", "--quick", "--runs", "1", "--epochs", "2", "--quiet", "--out", str(tmp_path), "--seed", "3",
                 "--predictions", str(predictions)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["setup"]["seed"] == 3 and report["setup"]["simulation"]["area_m"] == 1000.0
    methods = ("bm", "bm_paper", "bm_paper_max", "lstm", "transformer", "gnn", "gnn_pool", "channel_beta", "fxg",
               "beta", "qs_trust", "mean", "oracle")
    for method in methods:
        assert set(report[method]["rmse"]) == {"mean", "std"} and 0 <= report[method]["rmse"]["mean"] <= 1
        assert 0 <= report[method]["ece_truth"]["mean"] <= 1 and f"| {method} |" in (tmp_path / "report.md").read_text()
    assert report["oracle"]["rmse_truth"]["mean"] == 0.0 and report["oracle"]["ece_truth"]["mean"] == 0.0
    for method in ("bm", "bm_paper", "bm_paper_max", "lstm", "transformer", "gnn", "gnn_pool"):  # the epoch kept
        assert report["runs"][0][method]["kept_epoch"] in (-1, 0, 1)
    assert "kept_epoch" not in report["channel_beta"] and "kept_epoch" in (tmp_path / "report.md").read_text()
    assert report["channel_beta"]["rmse_truth"]["mean"] < report["mean"]["rmse_truth"]["mean"]  # it knows the pair
    per_slot = report["bm"]["rmse_per_slot"]["mean"]
    assert len(per_slot) == len(report["runs"][0]["bm"]["rmse_per_slot"]) >= 5
    # the hidden truth is the expectation of T_col, so no method's error to T_col beats the oracle by much
    assert all(report[m]["rmse"]["mean"] > report["oracle"]["rmse"]["mean"] - 0.05 for m in ("beta", "qs_trust"))
    assert "| bm |" in (tmp_path / "report.md").read_text()
    curves = {m: report[m]["voc"]["mean"] for m in ("bm", "channel_beta", "fxg", "beta", "qs_trust", "oracle", "random")}
    assert all(len(c) == 9 and all(0 <= v <= 1 for v in c) for c in curves.values())
    assert max(curves["oracle"]) > curves["random"][0]  # trusting the truth beats picking at random
    assert curves["oracle"][-1] <= curves["oracle"][0] + 0.05  # a strict threshold leaves tasks unserved
    assert "Achieved VoC" in (tmp_path / "report.md").read_text() and "expected-value rule" in (tmp_path / "report.md").read_text()
    assert len(report["oracle"]["voc_expected"]["mean"]) == 9
    # by P(success) x VoC the oracle reads the hidden P(success) itself, the expected value it maximizes
    assert "success rule" in (tmp_path / "report.md").read_text()
    assert max(report["oracle"]["voc_success"]["mean"]) >= max(report["oracle"]["voc_expected"]["mean"]) - 0.02
    assert len(report["bm_online"]["voc"]["mean"]) == 9  # bm_online selects too, with the shift it publishes
    # scored by expectation rather than drawn outcomes: the same choices, so the same level within the draws' noise
    for method in ("bm", "channel_beta", "oracle"):
        expected = report[method]["expected_voc"]["mean"]
        assert len(expected) == 9 and all(0 <= v <= 1 for v in expected)
        assert abs(np.mean(expected) - np.mean(report[method]["voc"]["mean"])) < 0.02
    assert "Expected VoC" in (tmp_path / "report.md").read_text()
    for method in ("bm", "bm_paper_max", "qs_trust"):  # the reliability diagram covers every prediction
        assert sum(report[method]["calibration_share"]["mean"]) == pytest.approx(1.0)
    assert "Calibration on the test edges" in (tmp_path / "report.md").read_text()
    # per behaviour of the collaborator, against the truth: every class of the mix, and the Bayes filter's floor
    by = report["bm"]["rmse_truth_by_behaviour"]
    assert set(by) == {"stable_reliable", "stable_unreliable", "degrading", "recovering", "intermittent", "periodic",
                       "selective"}
    bias = report["channel_beta"]["bias_truth_by_behaviour"]  # the signed error per class, never beyond its RMSE
    assert set(bias) == set(by) and all(abs(bias[label]["mean"]) <= report["channel_beta"][
        "rmse_truth_by_behaviour"][label]["mean"] + 1e-12 for label in by)
    assert "Mean error (forecast − truth; positive: over-rated) per behaviour" in (tmp_path / "report.md").read_text()
    assert report["bayes"]["rmse_truth"]["mean"] < report["channel_beta"]["rmse_truth"]["mean"]
    assert "per behaviour of the collaborator" in (tmp_path / "report.md").read_text()
    paired = report["paired"]
    assert paired["metric"] == "rmse_truth" and paired["best_other"] not in ("oracle", "bayes", "bm")
    assert "Paired difference of rmse_truth" in (tmp_path / "report.md").read_text()
    # every test edge with every method's forecast, which reproduces the report's figures
    import pyarrow.parquet as pq

    table = pq.read_table(predictions)
    assert table.column_names[:9] == ["run", "seed", "slot", "owner", "collaborator", "target", "tasks", "truth",
                                      "behaviour"]
    assert set(methods) | {"bayes"} <= set(table.column_names)
    assert set(table["seed"].to_pylist()) == {3}
    bm, truth = table["bm"].to_numpy(), table["truth"].to_numpy()
    assert np.sqrt(np.mean((bm - truth) ** 2)) == pytest.approx(report["bm"]["rmse_truth"]["mean"])
    # bm_online is bm with the online shift replayed over the test slots from the file's own columns
    shift = replayed_shifts(bm, table["target"].to_numpy(), table["tasks"].to_numpy(), table["slot"].to_numpy(),
                            RecalibrationConfig())
    assert table["bm_online"].to_numpy() == pytest.approx(np.clip(bm + shift, 0.0, 1.0))
    assert paired["best_other"] != "bm_online"
    for png in ("voc_vs_theta.png", "rmse_per_slot.png", "reliability.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"({png})" in (tmp_path / "report.md").read_text()


def test_the_online_scorer_adds_the_shift_of_the_slot_it_forecasts_by_hand() -> None:
    def constant(src: np.ndarray, dst: np.ndarray, end: int, profile: np.ndarray) -> np.ndarray:
        return np.full(len(src), 0.5)

    scorer = shifted_scorer(constant, np.array([3, 5]), np.array([0.1, 0.7]))
    pair = (np.zeros(2, np.int64), np.ones(2, np.int64))
    assert scorer(*pair, 2, np.zeros((2, 2))) == pytest.approx([0.6, 0.6])  # slot 3
    assert scorer(*pair, 3, np.zeros((2, 2))) == pytest.approx([1.0, 1.0])  # slot 4, no edges: slot 5's, clipped
    assert scorer(*pair, 9, np.zeros((2, 2))) == pytest.approx([1.0, 1.0])  # after the last slot: the last's
    assert shifted_scorer(constant, np.zeros(0, np.int64), np.zeros(0)) is constant


def test_selection_rule_by_hand() -> None:
    from model.trust import select

    trust = np.array([[0.9, 0.4, 0.8], [0.1, 0.2, 0.3]])
    voc = np.array([[0.5, 0.9, 0.7], [0.9, 0.9, 0.9]])
    valid = np.array([[True, True, True], [True, True, False]])
    assert select(trust, voc, valid, 0.5).tolist() == [2, -1]  # highest VoC among T >= theta; none qualifies
    assert select(trust, voc, valid, 0.1).tolist() == [1, 0]
    # the expected-value rule: T x VoC is 0.45, 0.36, 0.56 in row 0 and 0.09, 0.18 in row 1
    assert select(trust, voc, valid, 0.1, "expected").tolist() == [2, 1]
    assert select(trust, voc, valid, 0.85, "expected").tolist() == [0, -1]
    with pytest.raises(ValueError, match="selection rule"):
        select(trust, voc, valid, 0.1, "greedy")
    # the success rule: P(success) x T_res x VoC is 0.45, 0.09, 0.35 in row 0 and 0.72, 0.09 in row 1
    success = np.array([[0.9, 0.1, 0.5], [0.8, 0.1, 0.9]])
    assert select(trust, voc, valid, 0.1, "success", success).tolist() == [0, 0]
    assert select(trust, voc, valid, 0.85, "success", success).tolist() == [0, -1]  # eligible by T, as the others
    with pytest.raises(ValueError, match="success= is given with rule 'success' and only then"):
        select(trust, voc, valid, 0.1, "success")
    with pytest.raises(ValueError, match="success= is given with rule 'success' and only then"):
        select(trust, voc, valid, 0.1, "expected", success)
    voc[1, 1] = np.nan  # an unknown VoC: never the best, refused where it could be chosen, ignored where it cannot
    assert select(trust, voc, valid, 0.5).tolist() == [2, -1]
    with pytest.raises(ValueError, match="voc=nan at task 1, candidate 1"):
        select(trust, voc, valid, 0.1, "expected")


def test_success_probability_by_hand() -> None:
    from model.config import TrustWeights
    from model.trust import collaboration_weight, success_probability

    weights = TrustWeights()  # a1 = 0.6, a2 = 0.4
    # P(tr) 0.9, P(com | tr) 0.5: T_col's expectation 0.9 * (0.6 + 0.4 * 0.5) = 0.72, P(success) 0.45
    assert success_probability(np.array([0.72]), np.array([0.9]), weights) == pytest.approx([0.45])
    # the inverse of T_col's expectation wherever it is one: P(com) = P(tr) * P(com | tr)
    p_tr, p_com_given_tr = np.array([0.3, 0.7, 1.0]), np.array([0.0, 0.6, 1.0])
    expected = collaboration_weight(p_tr, p_tr * p_com_given_tr, weights)
    assert success_probability(expected, p_tr, weights) == pytest.approx(p_tr * p_com_given_tr)
    # clipped: below a1 * P(tr) (0.5 < 0.54) no success; above P(tr) (0.95 > 0.9) at most P(tr)
    assert success_probability(np.array([0.5, 0.95]), np.array([0.9, 0.9]), weights) == pytest.approx([0.0, 0.9])


def test_the_cli_offers_every_method_the_evaluation_knows() -> None:
    from model.evaluate import METHODS
    from trustbeam.cli import EVALUATE_METHODS

    assert EVALUATE_METHODS == METHODS


def test_candidate_rmse_by_hand() -> None:
    """Every candidate of every test task counts once: the truth scores zero, a constant its own error."""
    from model.voc import candidate_rmse, in_range, scored_tasks
    from simulator.config import SimConfig
    from simulator.engine import MemorySink, Simulator

    simulator, sink = Simulator(SimConfig(devices=30, tasks=300, slots=6, seed=4)), MemorySink()
    simulator.run([sink])
    world, events = simulator.world, sink["events"]
    weights = world.config.weights

    def truth(owners, candidates, end, profile):
        return world.expected(owners, candidates, end + 1).reliability(weights)

    scorers = {"truth": truth, "half": lambda o, c, e, p: np.full(len(c), 0.5)}
    got = candidate_rmse(world, list(scored_tasks(world, events, 0, [4, 5], scorers)))
    errors = []
    for slot in (4, 5):
        owners = pc.index_in(events.filter(pc.equal(events["slot"], slot))["owner"], value_set=world.ids).to_numpy()
        pool = in_range(world, owners.astype(np.int64), slot)
        errors.append(0.5 - pool.expected.reliability(weights))
    assert got["truth"] == pytest.approx(0.0, abs=1e-12)
    assert got["half"] == pytest.approx(float(np.sqrt(np.mean(np.concatenate(errors) ** 2))))
