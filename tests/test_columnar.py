"""Records as checked columns: the same records, errors and wire bytes as records made one by one."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

from schemas import (CollaboratorRanking, Columns, Nested, RankedCandidate, TrustScore, ValidationError, from_json,
                     to_json)

TRICKY_IDS = ["dév-0", 'quote"d', "back\\slash", "per%sent", "100%%", "emoji-\U0001F600", "a b", "greek-\u03a9"]


def _score_columns(n: int) -> dict:
    rng = np.random.default_rng(0)
    return {"owner": np.array([TRICKY_IDS[i % 3] for i in range(n)], object),
            "collaborator": np.array([TRICKY_IDS[3 + i % 5] + str(i) for i in range(n)], object), "slot": 4,
            "slot_start_ms": 1000, "slot_end_ms": 2000, "t_beh": rng.random(n), "t_res": rng.random(n),
            "trust": np.r_[rng.random(max(n - 2, 0)), [1e-300, 0.1 + 0.2]][:n], "model_version": "bm-1%",
            "is_update": False, "revision": np.arange(n, dtype=np.int64)}


def _one_by_one(columns: dict, n: int) -> list[TrustScore]:
    return [TrustScore(**{k: (v[i].item() if isinstance(v[i], np.generic) else v[i]) if isinstance(v, np.ndarray)
                          else v for k, v in columns.items()}) for i in range(n)]


def test_columns_hold_the_records_made_one_by_one_and_encode_their_bytes() -> None:
    columns = _score_columns(8)
    made = Columns.of(TrustScore, 8, **columns)
    assert list(made) == _one_by_one(columns, 8) and len(made) == 8
    assert all(type(r.t_beh) is float and type(r.revision) is int for r in made)
    assert made.json() == [to_json(r) for r in _one_by_one(columns, 8)]
    assert from_json(TrustScore, made.json()[5]) == made[5]
    assert made.json_lines() == b"".join(line + b"\n" for line in made.json())
    empty = Columns.of(TrustScore, 0, **_score_columns(0))
    assert list(empty) == [] and empty.json() == [] and empty.json_lines() == b""


def test_nullable_values_per_record_and_shared_encode_as_null() -> None:
    columns = {**_score_columns(3), "revision": [None, 2, None]}
    made = Columns.of(TrustScore, 3, **columns)
    assert [r.revision for r in made] == [None, 2, None]
    assert made.json() == [to_json(r) for r in made]
    shared = Columns.of(TrustScore, 3, **{**_score_columns(3), "revision": None, "is_update": True})
    assert shared.json() == [to_json(r) for r in shared] and b'"revision":null' in shared.json()[0]


def _rankings(lengths: list[int], **changes) -> dict:
    n, items = len(lengths), sum(lengths)
    candidates = {"collaborator": np.array([f"c-{k}" for k in range(items)], object),
                  "trust": np.full(items, 0.9), "voc": np.linspace(0.9, 0.1, items)}
    candidates.update(changes)
    return dict(owner=np.array([TRICKY_IDS[k % len(TRICKY_IDS)] for k in range(n)], object), slot=2,
                slot_start_ms=0, slot_end_ms=60_000, threshold=np.full(n, 0.5), model_version="bm", is_update=True,
                revision=1, candidates=Nested.of(Columns.of(RankedCandidate, items, **candidates), lengths))


def test_rankings_with_nested_candidates_equal_rankings_made_one_by_one() -> None:
    made = Columns.of(CollaboratorRanking, 4, **_rankings([2, 0, 3, 1]))
    assert [len(r.candidates) for r in made] == [2, 0, 3, 1]
    assert [c.collaborator for c in made[2].candidates] == ["c-2", "c-3", "c-4"]
    assert [from_json(CollaboratorRanking, m) for m in made.json()] == list(made)
    assert made.json() == [to_json(r) for r in made]


@pytest.mark.parametrize("lengths, changes, message", [
    ([2, 3], {"trust": np.array([0.9, 0.9, 0.9, 0.4, 0.9])}, "candidates.1.trust: below the threshold 0.5"),
    ([2, 3], {"voc": np.array([0.9, 0.8, 0.3, 0.7, 0.6])}, "candidates.1.voc: candidates must be in descending VoC"),
    ([2, 3], {"collaborator": np.array(["c-0", "c-1", "c-2", "c-2", "c-4"], object)},
     "candidates.1.collaborator: listed twice"),
    ([5], {"collaborator": np.array(["c-0", "c-1", "c-2", "c-3", TRICKY_IDS[0]], object)},
     "candidates.4.collaborator: must differ from owner"),
])
def test_a_ranking_that_breaks_a_candidate_rule_is_refused_as_its_construction_would(lengths, changes, message) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        Columns.of(CollaboratorRanking, len(lengths), **_rankings(lengths, **changes))


def test_too_many_candidates_or_a_list_field_not_nested_is_refused() -> None:
    with pytest.raises(ValidationError, match="candidates: more than 1000 items"):
        Columns.of(CollaboratorRanking, 1, **_rankings([1001]))
    with pytest.raises(ValidationError, match="candidates: a list field's column must be Nested"):
        Columns.of(CollaboratorRanking, 1, **{**_rankings([1]), "candidates": [()]})


@pytest.mark.parametrize("field, value, message", [
    ("t_beh", float("nan"), "t_beh: must be finite (no NaN or infinity) (got nan)"),
    ("trust", 1.5, "trust: must be <= 1 (got 1.5)"),
    ("revision", -1, "revision: must be >= 0 (got -1)"),
    ("collaborator", "dev\x079", "collaborator: non-printable character U+0007"),
    ("collaborator", TRICKY_IDS[2], "collaborator: must differ from owner"),  # row 2's owner: a rule across fields
])
def test_a_bad_value_in_a_column_is_refused_by_name(field, value, message) -> None:
    columns = _score_columns(4)
    columns[field] = columns[field].copy()
    columns[field][2] = value
    with pytest.raises(ValidationError, match=re.escape(message)):
        Columns.of(TrustScore, 4, **columns)


def test_columns_of_the_wrong_length_or_an_unknown_field_are_refused() -> None:
    with pytest.raises(ValueError, match="t_beh: a column of 4 values for 5 records"):
        Columns.of(TrustScore, 5, **{**_score_columns(5), "t_beh": np.zeros(4)})
    with pytest.raises(ValidationError, match="unknown field"):
        Columns.of(TrustScore, 5, **_score_columns(5), colour="red")


def test_concatenated_and_unpickled_batches_hold_the_same_records() -> None:
    first = Columns.of(CollaboratorRanking, 2, **_rankings([2, 1]))
    second = Columns.of(CollaboratorRanking, 3, **{**_rankings([0, 1, 2]), "revision": None, "is_update": False})
    joined = Columns.concat([first, second])
    assert list(joined) == [*first, *second] and joined.json() == first.json() + second.json()
    again = pickle.loads(pickle.dumps(joined))
    assert list(again) == list(joined) and again.json() == joined.json()


@pytest.mark.parametrize("bad, message", [("", "must not be empty"), (" lead", "leading or trailing whitespace"),
                                          ("trail ", "leading or trailing whitespace"), ("x" * 129, "longer than 128"),
                                          ("tab\there", "non-printable character U+0009"), (7, "expected a string"),
                                          (None, "required field is null")])
def test_a_bad_id_among_many_good_ones_is_refused_by_name(bad, message) -> None:
    columns = _score_columns(50)
    columns["collaborator"] = columns["collaborator"].copy()
    columns["collaborator"][37] = bad
    with pytest.raises(ValidationError, match=re.escape(message)) as refused:
        Columns.of(TrustScore, 50, **columns)
    assert refused.value.field == "collaborator"
