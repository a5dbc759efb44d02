"""The wire records: collaboration events and device status in, trust scores and rankings out.

Units are SI (bits, cycles/bit, Hz, W, m, s, J); times are integer milliseconds
since the Unix epoch, UTC; device ids are strings. Probabilities and trust
values lie in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from schemas.base import Record, Rule, absent, flag, ident, integer, number, records, true
from schemas.errors import ValidationError

MAX_RANKED = 1000
MONITOR_PREFIX = "monitor:"  # the id namespace of neutral monitors: a reporter named "monitor:<name>" is one


def _task_size() -> Any:
    """What a published trust is for: the size of the owner's latest task."""
    return number("size of the owner's task the trust (and VoC) is for: its latest (null: unknown)", unit="bit", gt=0,
                  nullable=True)


def _size_slope() -> Any:
    """How a version-2 producer's trust moved with the task's size; since version 3 it moves by size class."""
    return number("change of the trust T per doubling of the task's size (version 2; null since version 3, whose "
                  "trust moves by size class: size_step)", unit="1/doubling", nullable=True)


def _size_split() -> Any:
    """What parts large tasks from small ones in the model's trust (:func:`model.evidence.size_x`)."""
    return number("task size above which a task is large to the model's trust, at or below which small (null: the "
                  "model's trust does not depend on the size)", unit="bit", gt=0, nullable=True)


def _size_step() -> Any:
    """How a published trust moves for a task of the other size class (the model's size correction)."""
    return number("change of the trust T for a task on the other side of size_split_bits than task_size_bits (null: "
                  "the model's trust does not depend on the size)", nullable=True)


def _cpu() -> Any:
    """The CPU a published trust and VoC were computed at (:func:`model.evidence.verified_cpu`)."""
    return number("the collaborator's CPU frequency f the trust and VoC were computed at: the cpu_hz its statuses "
                  "claim, or less where the times its tasks took do not bear the claim out; a scheduler computing "
                  "a task's VoC itself reads the collaborator at this, times the share of it the load in its latest "
                  "status leaves free (null: the statuses' claim)", unit="Hz", gt=0,
                  nullable=True)


def _p_success() -> Any:
    """The chance a task succeeds at the collaborator, as the success rule weighs its VoC
    (:func:`model.trust.success_probability`)."""
    return number("P(success) x T_res: the chance the owner's task succeeds at the collaborator (transmission and "
                  "computation, P(tr) * P(com | tr), read from T_beh and the model's P(tr) curve at the pair's "
                  "distance) times T_res; a scheduler maximizing the value it expects picks the highest p_success "
                  "x VoC among T >= theta (null: the model has no P(tr) curve)", ge=0, le=1, nullable=True)


def _success_step() -> Any:
    """How a published chance of success moves for a task of the other size class, as the trust does by size_step."""
    return number("change of p_success for a task on the other side of size_split_bits than task_size_bits: the "
                  "chance read from T_beh moved by the size correction (null: the model's trust does not depend on "
                  "the size, or no p_success is published)", nullable=True)


def foreign_reporter(reporter: Any, owner: Any) -> Any:
    """True where a reporter names neither the task's owner nor a monitor (null: the neutral monitor of a log that
    does not say), for one record or for object columns of a batch."""
    if not isinstance(reporter, np.ndarray):
        return reporter is not None and reporter != owner and not _monitor(reporter)
    out = np.zeros(len(reporter), bool)
    named = np.flatnonzero(reporter != None)  # noqa: E711 (elementwise on an object column)
    out[named] = [r != o and not _monitor(r) for r, o in zip(reporter[named], owner[named])]
    return out


def _monitor(reporter: str) -> bool:
    return reporter.startswith(MONITOR_PREFIX) and len(reporter) > len(MONITOR_PREFIX)


@dataclass(frozen=True, kw_only=True)
class CollaborationEvent(Record):
    """One task an owner offloaded to a collaborator, and how it went.

    The outcome is either the two flags (``tr_success``, ``com_success``; the
    paper's p_tr and p_com of one task) or, for logs that grade the outcome,
    ``reliability`` in [0, 1]. At least one form must be present; when both are,
    the flags define T_col. ``reporter`` says who observed it: a neutral monitor
    (null, or an id in the ``monitor:`` namespace) or the owner itself, whose
    report a dishonest owner may falsify (ballot-stuffing, bad-mouthing).
    """

    NAME = "collaboration_event"

    event_id: str = ident("unique id of this collaboration; duplicates are dropped")
    event_time_ms: int = integer("when the task was issued", unit="ms since epoch (UTC)", ge=0)
    owner: str = ident("device that owns and offloads the task (i)")
    collaborator: str = ident("device that executed the task (j)")
    task_size_bits: float = number("task input size", unit="bit", gt=0, nullable=True)
    density_cycles_per_bit: float = number("processing density", unit="cycle/bit", gt=0, nullable=True)
    trust_threshold: float = number("the task's trust threshold theta", ge=0, le=1, nullable=True)
    tr_success: bool = flag("transmission to the collaborator succeeded (p_tr)", nullable=True)
    com_success: bool = flag("computation at the collaborator succeeded (p_com)", nullable=True)
    reliability: float = number("graded outcome, for logs without the two flags", ge=0, le=1, nullable=True)
    t_total_s: float = number("measured transmission + computation time", unit="s", ge=0, nullable=True)
    e_total_j: float = number("measured transmission + computation energy", unit="J", ge=0, nullable=True)
    t_local_s: float = number("owner's local execution time for the task", unit="s", ge=0, nullable=True)
    e_local_j: float = number("owner's local execution energy for the task", unit="J", ge=0, nullable=True)
    voc: float = number("achieved value of task completion V", ge=0, le=1, nullable=True)
    reporter: str = ident("who reported the outcome: the owner's id, or a neutral monitor's "
                          f"('{MONITOR_PREFIX}<name>'; null: a monitor, as in the paper's setting)", nullable=True)

    RULES = (
        Rule("collaborator", "must differ from owner", lambda r: r.owner == r.collaborator),
        Rule("reporter", f"must name the owner or a monitor ('{MONITOR_PREFIX}<name>')",
             lambda r: foreign_reporter(r.reporter, r.owner)),
        Rule("com_success", "tr_success and com_success come together",
             lambda r: np.logical_and(np.logical_not(absent(r.tr_success)), absent(r.com_success))),
        Rule("tr_success", "tr_success and com_success come together",
             lambda r: np.logical_and(absent(r.tr_success), np.logical_not(absent(r.com_success)))),
        Rule("reliability", "an outcome is required: tr_success+com_success or reliability",
             lambda r: np.logical_and(absent(r.tr_success), absent(r.reliability))),
        Rule("com_success", "computation cannot succeed without transmission",
             lambda r: np.logical_and(true(r.com_success), np.logical_not(true(r.tr_success)))),
    )


@dataclass(frozen=True, kw_only=True)
class DeviceStatus(Record):
    """A device's resources and willingness at a time: the inputs of T_res and of the physics."""

    NAME = "device_status"

    device: str = ident("the device reporting")
    time_ms: int = integer("when the status was observed", unit="ms since epoch (UTC)", ge=0)
    cpu_hz: float = number("CPU frequency f", unit="Hz", gt=0)
    tx_w: float = number("transmit power p_tr", unit="W", ge=0)
    rx_w: float = number("receive power p_rx", unit="W", ge=0)
    x_m: float = number("position, x", unit="m")
    y_m: float = number("position, y", unit="m")
    willingness: float = number("willingness to collaborate, in [0, 1]", ge=0, le=1)
    comm_ok: bool = flag("communication resources available")
    comp_ok: bool = flag("computation resources available")
    cpu_load: float = number("background CPU utilisation the device reports, in [0, 1] (telemetry; null: not "
                             "reported)", ge=0, le=1, nullable=True)


@dataclass(frozen=True, kw_only=True)
class TrustScore(Record):
    """The rolling trust of one (owner, collaborator) pair after a slot: T = T_beh * T_res, for a task of
    ``task_size_bits``; a scheduler's task of another size s has T + ``size_step`` where s and ``task_size_bits``
    lie on different sides of ``size_split_bits``, else T (clipped to [0, 1]). Version 2 added the task's size and
    ``size_slope`` (then T + ``size_slope`` * log2(s / task_size_bits)); version 3 the split and the step; version 4
    the collaborator's CPU as the job reads it (``cpu_hz``); version 5 the chance of success (``p_success``); version
    6 its change for a task of the other size class (``success_step``, read as ``size_step`` is)."""

    NAME = "trust_score"
    SCHEMA_VERSION = 6

    owner: str = ident("device that would offload (i)")
    collaborator: str = ident("candidate collaborator (j)")
    slot: int = integer("slot index k, covering [origin + k*len, origin + (k+1)*len)", ge=0)
    slot_start_ms: int = integer("slot start", unit="ms since epoch (UTC)", ge=0)
    slot_end_ms: int = integer("slot end (exclusive)", unit="ms since epoch (UTC)", ge=0)
    t_beh: float = number("long-term behavioural trust T_beh", ge=0, le=1)
    t_res: float = number("resource trust T_res", ge=0, le=1)
    trust: float = number("overall trust T = T_beh * T_res", ge=0, le=1)
    model_version: str = ident("version (content hash) of the model that scored")
    is_update: bool = flag("re-publication of a slot after late events")
    revision: int = integer("which publication of the slot this is: 0 the first, n the n-th update (null: a "
                            "producer that does not number them)", ge=0, nullable=True)
    task_size_bits: float = _task_size()
    size_slope: float = _size_slope()
    size_split_bits: float = _size_split()
    size_step: float = _size_step()
    cpu_hz: float = _cpu()
    p_success: float = _p_success()
    success_step: float = _success_step()

    RULES = (
        Rule("collaborator", "must differ from owner", lambda r: r.owner == r.collaborator),
        Rule("slot_end_ms", "must be after slot_start_ms", lambda r: r.slot_end_ms <= r.slot_start_ms),
    )


@dataclass(frozen=True, kw_only=True)
class RankedCandidate(Record):
    """One entry of a ranking."""

    NAME = "ranked_candidate"

    collaborator: str = ident("candidate collaborator (j)")
    trust: float = number("overall trust T", ge=0, le=1)
    voc: float = number("expected value of task completion V for the owner's task profile", ge=0, le=1)
    size_slope: float = _size_slope()
    size_step: float = _size_step()
    cpu_hz: float = _cpu()
    p_success: float = _p_success()
    success_step: float = _success_step()


@dataclass(frozen=True, kw_only=True)
class CollaboratorRanking(Record):
    """An owner's top candidates after a slot: those with T >= threshold, best VoC first, for a task of
    ``task_size_bits`` (see :class:`TrustScore` for another size). Version 2 added it and the candidates'
    ``size_slope``; version 3 ``size_split_bits`` and the candidates' ``size_step``; version 4 the candidates'
    ``cpu_hz``; version 5 their ``p_success``; version 6 their ``success_step``. Listed: the top candidates by VoC,
    then every other candidate the paper's, the expected-value or the success rule would choose at some theta' >=
    ``threshold`` (for the task of ``task_size_bits``)."""

    NAME = "collaborator_ranking"
    SCHEMA_VERSION = 6

    owner: str = ident("device that would offload (i)")
    slot: int = integer("slot index k", ge=0)
    slot_start_ms: int = integer("slot start", unit="ms since epoch (UTC)", ge=0)
    slot_end_ms: int = integer("slot end (exclusive)", unit="ms since epoch (UTC)", ge=0)
    threshold: float = number("trust threshold theta the candidates passed", ge=0, le=1)
    model_version: str = ident("version (content hash) of the model that scored")
    is_update: bool = flag("re-publication of a slot after late events")
    revision: int = integer("which publication of the slot this is: 0 the first, n the n-th update (null: a "
                            "producer that does not number them)", ge=0, nullable=True)
    task_size_bits: float = _task_size()
    size_split_bits: float = _size_split()
    candidates: tuple[RankedCandidate, ...] = records(
        RankedCandidate, "candidates in selection order (first is chosen)", max_len=MAX_RANKED
    )

    RULES = (Rule("slot_end_ms", "must be after slot_start_ms", lambda r: r.slot_end_ms <= r.slot_start_ms),)

    def check_rules(self) -> None:
        super().check_rules()
        seen: set[str] = set()
        for index, candidate in enumerate(self.candidates):
            where = f"candidates.{index}"
            _check_candidate(self.owner, self.threshold, candidate, where)
            if candidate.collaborator in seen:
                raise ValidationError(f"{where}.collaborator", candidate.collaborator, "listed twice")
            seen.add(candidate.collaborator)
            if index and candidate.voc > self.candidates[index - 1].voc:
                raise ValidationError(f"{where}.voc", candidate.voc, "candidates must be in descending VoC")

    @classmethod
    def batch_violations(cls, batch: Any) -> np.ndarray:
        """:attr:`RULES`, and the candidates' rules on the flattened candidates of every ranking at once."""
        bad = super().batch_violations(batch)
        nested = batch.values["candidates"]
        items, parent = nested.items, nested.parents()
        if not len(parent):
            return bad
        collaborator, voc = items.column("collaborator"), items.column("voc")
        wrong = ((collaborator == batch.column("owner")[parent])
                 | (items.column("trust") < batch.column("threshold")[parent]))
        later = parent[1:] == parent[:-1]  # an item and the one before it in the same ranking
        wrong[1:] |= later & (voc[1:] > voc[:-1])
        # a collaborator listed twice in a ranking: items in order of (ranking, hash of the id), neighbours that share
        # both compared as text (ids sorted as text cost ~3 x as much; two ids of one ranking would have to share a
        # 64-bit hash to hide a repeat)
        digest = np.fromiter(map(hash, collaborator.tolist()), np.int64, len(collaborator))
        order = np.lexsort((digest, parent))
        ranking, digest, collaborator = parent[order], digest[order], collaborator[order]
        twice = (ranking[1:] == ranking[:-1]) & (digest[1:] == digest[:-1])
        twice[twice] = collaborator[1:][twice] == collaborator[:-1][twice]
        wrong[order[1:][twice]] = True
        bad[parent[wrong]] = True
        return bad


def _check_candidate(owner: str, threshold: float, candidate: RankedCandidate, where: str) -> None:
    if candidate.collaborator == owner:
        raise ValidationError(f"{where}.collaborator", candidate.collaborator, "must differ from owner")
    if candidate.trust < threshold:
        raise ValidationError(f"{where}.trust", candidate.trust, f"below the threshold {threshold}")


WIRE_RECORDS: tuple[type[Record], ...] = (CollaborationEvent, DeviceStatus, TrustScore, CollaboratorRanking)
