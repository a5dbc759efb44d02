"""Attacks injected into a recorded ratings log (simulator.inject) and what model.manipulation measures of them."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from model.manipulation import injection_measures
from simulator.config import Attack, AttackKind
from model.distrust import DISTRUST
from simulator.inject import MIN_RATINGS, inject
from tests.test_snapshots import write_log
from trustbeam.cli import main


@pytest.fixture(scope="module")
def log(tmp_path_factory) -> str:
    """A graded log of 3,000 ratings among 40 accounts (``import-log``'s events.parquet)."""
    root = tmp_path_factory.mktemp("log")
    write_log(root / "log.csv")
    assert main(["import-log", "--csv", str(root / "log.csv"), "--no-header", "--owner-col", "0",
                 "--collaborator-col", "1", "--outcome-col", "2", "--time-col", "3", "--outcome-range", "-10", "10",
                 "--slot-days", "7", "--out", str(root / "log")]) == 0
    return str(root / "log" / "events.parquet")


def _column(table: pa.Table, name: str) -> np.ndarray:
    return table[name].to_numpy(zero_copy_only=False)


@pytest.mark.parametrize("kind", [AttackKind.BALLOT_STUFFING, AttackKind.BAD_MOUTHING])
def test_colluders_add_one_fake_rating_per_real_one_at_its_time(log: str, kind: AttackKind) -> None:
    import pyarrow.parquet as pq

    events = pq.read_table(log)
    injected = inject(events, Attack(kind, 0.25), seed=3)
    clean, attacked, colluders = injected.clean, injected.attacked, injected.attackers
    raters, given = np.unique(_column(events, "owner"), return_counts=True)
    assert len(colluders) == round(0.25 * (given >= MIN_RATINGS).sum())
    assert clean.drop_columns(["reporter"]).equals(events.drop_columns(["reporter"]))
    assert clean["reporter"].equals(clean["owner"]) and attacked["reporter"].equals(attacked["owner"])
    fake = attacked.filter(pc.ends_with(attacked["event_id"], "-fake"))
    real_of_colluders = np.isin(_column(events, "owner"), colluders).sum()
    assert 0.9 * real_of_colluders <= fake.num_rows <= real_of_colluders  # a rating of its own is dropped
    assert attacked.num_rows == clean.num_rows + fake.num_rows
    assert len(set(_column(attacked, "event_id"))) == attacked.num_rows
    assert np.isin(_column(fake, "owner"), colluders).all()
    assert (np.diff(_column(attacked, "event_time_ms")) >= 0).all()
    assert set(_column(fake, "event_time_ms")) <= set(_column(events, "event_time_ms"))
    targets = _column(fake, "collaborator")
    assert (targets != _column(fake, "owner")).all()
    if kind is AttackKind.BALLOT_STUFFING:
        assert np.isin(targets, colluders).all() and (_column(fake, "reliability") == 1.0).all()
        assert not len(injected.victims)
    else:
        assert not np.isin(targets, colluders).any() and (_column(fake, "reliability") == 0.0).all()
        first_rated = {}
        for when, name in zip(_column(events, "event_time_ms"), _column(events, "collaborator")):
            first_rated.setdefault(name, when)
        assert all(first_rated[t] <= w for t, w in zip(targets, _column(fake, "event_time_ms")))
        assert set(injected.victims) == set(targets)


@pytest.mark.parametrize("kind", [AttackKind.WHITEWASHING, AttackKind.SYBIL])
def test_fresh_ids_rename_the_attackers_ratings_and_change_nothing_else(log: str, kind: AttackKind) -> None:
    import pyarrow.parquet as pq

    events = pq.read_table(log)
    attack = Attack(kind, 0.25, whitewash_ids=4)
    injected = inject(events, attack, seed=3)
    clean, attacked, attackers, alias = injected.clean, injected.attacked, injected.attackers, injected.alias
    grade, rated = _column(events, "reliability"), _column(events, "collaborator")
    names, received = np.unique(rated, return_counts=True)
    eligible = names[(received >= MIN_RATINGS) & np.isin(names, rated[grade < DISTRUST])]
    assert len(attackers) == round(0.25 * len(eligible)) and np.isin(attackers, eligible).all()
    assert not len(injected.victims) and attacked["reporter"].equals(attacked["owner"])
    assert attacked.drop_columns(["owner", "collaborator", "reporter"]).equals(
        clean.drop_columns(["owner", "collaborator", "reporter"]))  # no rating added, dropped or regraded
    assert set(alias.values()) == set(attackers)  # every attacker acts under a fresh id
    for column in ("owner", "collaborator"):  # the fresh ids read as their accounts give the clean log back
        assert [alias.get(n, n) for n in attacked[column].to_pylist()] == clean[column].to_pylist()
    for account in attackers:
        ids = _column(attacked, "collaborator")[_column(clean, "collaborator") == account]
        if kind is AttackKind.SYBIL:
            assert set(ids) <= {account, *(f"{account}#sybil{k}" for k in (1, 2))}
            continue
        negatives = np.cumsum(grade[rated == account] < DISTRUST)  # the k-th id after the k-th negative, at most 3
        expected = np.minimum(np.r_[0, negatives[:-1]], 3)
        assert ids.tolist() == [account if k == 0 else f"{account}#ww{k}" for k in expected]


def test_a_log_cannot_carry_on_off_and_the_same_seed_injects_the_same(log: str) -> None:
    import pyarrow.parquet as pq

    events = pq.read_table(log)
    with pytest.raises(ValueError, match="'on-off' cannot be injected into a recorded log"):
        inject(events, Attack(AttackKind.ON_OFF, 0.2), seed=0)
    a, b = (inject(events, Attack(AttackKind.BAD_MOUTHING, 0.2), seed=5) for _ in range(2))
    assert a.attacked.equals(b.attacked)


def test_injection_measures_by_hand() -> None:
    """Honest rater h rated victim v (target 1.0) and colluder c (target 0.0); colluder c's own edge is left out."""
    keys = {"slot": [7, 7, 7], "owner": ["h", "h", "c"], "collaborator": ["v", "c", "v"], "target": [1.0, 0.0, 0.0]}
    clean = pa.table({**keys, "m": [0.9, 0.3, 0.5]})
    attacked = pa.table({**keys, "m": [0.6, 0.5, 0.1]})
    out = injection_measures(clean, attacked, np.array(["c"]), np.array(["v"]), ["m"])["m"]
    assert out["victim_shift"] == pytest.approx(-0.3) and out["attacker_shift"] == pytest.approx(0.2)
    assert out["attacker_rmse_clean"] == pytest.approx(0.3) and out["attacker_rmse_attacked"] == pytest.approx(0.5)
    assert out["rmse_genuine_clean"] == pytest.approx(np.sqrt((0.1 ** 2 + 0.3 ** 2) / 2))
    assert out["rmse_genuine_attacked"] == pytest.approx(np.sqrt((0.4 ** 2 + 0.5 ** 2) / 2))


def test_injection_measures_read_fresh_ids_as_their_accounts() -> None:
    """Honest rater h rated whitewasher w under its fresh id w#ww1 (0.4 -> 0.7) and honest v (0.8 -> 0.8); the
    fresh id's own rating of v is the attacker's, left out."""
    clean = pa.table({"slot": [7, 7, 7], "owner": ["h", "h", "w"], "collaborator": ["w", "v", "v"],
                      "target": [0.0, 1.0, 1.0], "m": [0.4, 0.8, 0.5]})
    attacked = pa.table({"slot": [7, 7, 7], "owner": ["h", "h", "w#ww1"], "collaborator": ["w#ww1", "v", "v"],
                         "target": [0.0, 1.0, 1.0], "m": [0.7, 0.8, 0.9]})
    out = injection_measures(clean, attacked, np.array(["w"]), np.zeros(0, str), ["m"], {"w#ww1": "w"})["m"]
    assert out["attacker_shift"] == pytest.approx(0.3) and np.isnan(out["victim_shift"])
    assert out["attacker_rmse_clean"] == pytest.approx(0.4) and out["attacker_rmse_attacked"] == pytest.approx(0.7)
    assert out["rmse_genuine_attacked"] == pytest.approx(np.sqrt((0.7 ** 2 + 0.2 ** 2) / 2))
    without = injection_measures(clean, attacked, np.array(["w"]), np.zeros(0, str), ["m"])["m"]
    assert np.isnan(without["attacker_shift"])  # unread, the fresh id matches no clean edge


@pytest.mark.parametrize("attack, measure", [("bad-mouthing=0.25", "victim_shift"),
                                             ("whitewashing=0.25", "attacker_shift")])
def test_evaluate_reports_what_an_injected_attack_moved(log: str, tmp_path, attack: str, measure: str) -> None:
    out = tmp_path / "report"
    assert main(["evaluate", "--quick", "--runs", "1", "--quiet", "--events", log, "--attack", attack,
                 "--methods", "mean", "channel_beta", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert f"{attack} injected" in report["title"]
    for method in ("mean", "channel_beta"):  # the attacked edges matched their clean twins (fresh ids as accounts)
        assert np.isfinite(report[method][measure]["mean"]) and report[method]["rmse_genuine_clean"]["mean"] > 0
    if measure == "victim_shift":
        assert report["channel_beta"]["victim_shift"]["mean"] < 0  # a rule believes every report
    assert "Injected attack" in (out / "report.md").read_text()
