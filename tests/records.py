"""Valid records to start tests from, and hypothesis strategies that build valid records of any kind."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from schemas import CollaborationEvent, CollaboratorRanking, DeviceStatus, RankedCandidate, TrustScore
from schemas.base import MAX_ID_CHARS, Kind, Record, Spec, specs
from schemas.records import MONITOR_PREFIX


def event(**changes: Any) -> CollaborationEvent:
    fields = dict(event_id="e-1", event_time_ms=1_767_225_600_000, owner="dev-1", collaborator="dev-2",
                  task_size_bits=4e7, density_cycles_per_bit=2339.0, trust_threshold=0.5,
                  tr_success=True, com_success=False)
    return CollaborationEvent(**{**fields, **changes})


def status(**changes: Any) -> DeviceStatus:
    fields = dict(device="dev-1", time_ms=0, cpu_hz=2e9, tx_w=0.1, rx_w=0.08, x_m=1.0, y_m=-2.0,
                  willingness=0.9, comm_ok=True, comp_ok=False)
    return DeviceStatus(**{**fields, **changes})


def ranking(**changes: Any) -> CollaboratorRanking:
    fields = dict(owner="dev-1", slot=3, slot_start_ms=180_000, slot_end_ms=240_000, threshold=0.5,
                  model_version="bm-abc123", is_update=False, task_size_bits=4e7,
                  size_split_bits=3e7,
                  candidates=(RankedCandidate(collaborator="dev-2", trust=0.9, voc=0.8, size_step=-0.05, cpu_hz=2.1e9,
                                              p_success=0.72, success_step=-0.1),
                              RankedCandidate(collaborator="dev-3", trust=0.6, voc=0.7)))
    return CollaboratorRanking(**{**fields, **changes})


def score(**changes: Any) -> TrustScore:
    fields = dict(owner="dev-1", collaborator="dev-2", slot=3, slot_start_ms=180_000, slot_end_ms=240_000,
                  t_beh=0.8, t_res=0.5, trust=0.4, model_version="bm-abc123", is_update=True, task_size_bits=4e7,
                  size_split_bits=3e7, size_step=-0.03, cpu_hz=2.1e9, p_success=0.3,
                  success_step=-0.06)
    return TrustScore(**{**fields, **changes})


VALID = {CollaborationEvent: event, DeviceStatus: status, TrustScore: score, CollaboratorRanking: ranking}

_printable = st.characters(codec="utf-8", exclude_categories=("C", "Zl", "Zp", "Zs"), include_characters=" ")
ids = st.text(_printable, min_size=1, max_size=MAX_ID_CHARS).map(str.strip).filter(bool)


def _value(spec: Spec) -> st.SearchStrategy[Any]:
    if spec.kind is Kind.ID:
        base: st.SearchStrategy[Any] = ids
    elif spec.kind is Kind.INT:
        base = st.integers(min_value=int(spec.ge) if spec.ge is not None else -(2**63), max_value=2**63 - 1)
    elif spec.kind is Kind.BOOL:
        base = st.booleans()
    else:
        low = spec.ge if spec.ge is not None else spec.gt
        base = st.floats(min_value=low, max_value=spec.le, exclude_min=spec.gt is not None,
                         allow_nan=False, allow_infinity=False)
    return st.one_of(st.none(), base) if spec.nullable else base


def valid_records(cls: type[Record]) -> st.SearchStrategy[Record]:
    """Random field values within each field's rules, kept when the cross-field rules pass too."""
    if cls is CollaboratorRanking:
        return _rankings()
    fields = {name: _value(spec) for name, spec in specs(cls)}
    if cls is CollaborationEvent:  # draw a consistent outcome form rather than filtering most draws out
        fields["tr_success"] = st.sampled_from([None, True, False])
        fields = st.fixed_dictionaries(fields).flatmap(_with_outcome)
    if cls in (CollaborationEvent, TrustScore):
        fields = st.fixed_dictionaries(fields) if isinstance(fields, dict) else fields
        fields = fields.flatmap(lambda v: st.builds(lambda c: {**v, "collaborator": c},
                                                    ids.filter(lambda c: c != v["owner"])))
    if cls is CollaborationEvent:  # a reporter the rule admits: none, the owner or a monitor
        fields = fields.flatmap(lambda v: st.builds(lambda r: {**v, "reporter": r}, st.one_of(
            st.none(), st.just(v["owner"]), ids.map(lambda name: (MONITOR_PREFIX + name)[:MAX_ID_CHARS].strip()))))
    if cls is TrustScore:
        fields = fields.flatmap(lambda v: st.builds(lambda d: {**v, "slot_end_ms": v["slot_start_ms"] + d},
                                                    st.integers(1, 10**9)))

    def build(values: dict[str, Any]) -> Record | None:
        try:
            return cls(**values)
        except ValueError:
            return None

    values = st.fixed_dictionaries(fields) if isinstance(fields, dict) else fields
    return values.map(build).filter(lambda r: r is not None)


def _with_outcome(values: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    tr = values["tr_success"]
    com = st.just(None) if tr is None else st.booleans() if tr else st.just(False)
    graded = _value(Spec(Kind.FLOAT, "", ge=0, le=1, nullable=tr is not None))
    return st.builds(lambda c, r: {**values, "com_success": c, "reliability": r}, com, graded)


@st.composite
def _rankings(draw: st.DrawFn) -> CollaboratorRanking:
    threshold = draw(st.floats(0, 1))
    names = draw(st.lists(ids, unique=True, max_size=8))
    owner = draw(ids.filter(lambda o: o not in names))
    vocs = sorted(draw(st.lists(st.floats(0, 1), min_size=len(names), max_size=len(names))), reverse=True)
    candidates = [RankedCandidate(collaborator=n, trust=draw(st.floats(threshold, 1)), voc=v)
                  for n, v in zip(names, vocs)]
    start = draw(st.integers(0, 2**40))
    return CollaboratorRanking(owner=owner, slot=draw(st.integers(0, 10**6)), slot_start_ms=start,
                               slot_end_ms=start + draw(st.integers(1, 10**7)), threshold=threshold,
                               model_version=draw(ids), is_update=draw(st.booleans()),
                               candidates=tuple(candidates))
