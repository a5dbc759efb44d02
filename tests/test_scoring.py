"""The shared slot scorer: consistent with the training path, shardable, ranking by the paper's rule, cold start."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from model.bm import BM
from model.config import RankingConfig, SlotClock, SystemParams
from simulator.experiment import simulated_run, simulated_world
from model.context import PHYSICS_COLUMNS
from model.credibility import credibility
from model.evidence import CHANNELS, REPORTS, EvidenceState, typical_speed_gap
from model.graphs import DeviceIndex, device_keys
from model.history import History
from model import published
from model.published import SlotScores, owner_lists, ranked_rows
from model.scoring import (DeviceFrame, DeviceHistory, EvidenceSnapshot, credited_evidence, score_log, score_slot,
                           shard_of, slot_part, status_arrays, window_read)
from model.stages import TorchStages, distinct_rows
from model.targets import PairQuery, targets
from simulator.config import Attack, AttackKind, SimConfig
from tests.pipeline_fixtures import forget_y
from tests.test_bm import SMALL

SIM = SimConfig(devices=40, tasks=600, slots=12, seed=3, telemetry=True)
# owners report most outcomes, and a fifth of them bad-mouth: their reports weigh by their credibility
REPORTED = replace(SIM, attack=Attack(AttackKind.BAD_MOUTHING, 0.2), owner_reports=0.7)


# a quarter of the devices are Sybils answering under 3 ids each, judged as one where their ids stand (model.identity)
SYBILS = replace(SIM, attack=Attack(AttackKind.SYBIL, 0.25, sybil_ids=3))
# a fifth of the devices serve small tasks and fail large ones, tasks 1/4 to 4 times the nominal size
OPPORTUNISTS = replace(SIM, attack=Attack(AttackKind.OPPORTUNISTIC, 0.2), task_size_spread=4.0)

# a quarter of the devices run on the slowest CPU and claim the fastest in their statuses
OVERCLAIMERS = replace(SIM, attack=Attack(AttackKind.OVERCLAIMING, 0.25))
# a quarter of the devices run a load to drop it where their record is poor, and creep back to it in three slots
BURNERS = replace(SIM, attack=Attack(AttackKind.FAKE_RECOVERY, 0.25, fake_creep=3, fake_burn=True))


@pytest.fixture(scope="module", params=[SIM, REPORTED], ids=["monitored", "owner-reported"])
def log(request):
    return scored_log(request.param)


@pytest.fixture(scope="module")
def sybil_log():
    return scored_log(SYBILS)


def scored_log(config: SimConfig, **evidence):
    """A run's events, statuses, history and an untrained model; where its tasks' sizes vary, the model's size
    evidence parts them at the nominal (median) size, and where statuses carry loads it fits their cycles, as training
    would; ``evidence`` sets further fields of its EvidenceConfig."""
    events, _, status = simulated_run(config)
    history = History.from_events(events, SIM.clock, SMALL.weights, status=status)
    torch.manual_seed(0)
    split = config.task_size_bits if config.task_size_spread > 1 else None
    model = BM(replace(SMALL, evidence=replace(SMALL.evidence, size_split_bits=split, cycles=config.telemetry,
                                               **evidence)),
               np.random.default_rng(0).normal(size=(len(history.index), 8)).astype(np.float32)).eval()
    with torch.no_grad():  # Y (and so the sequences and their telemetry) counts: its weights start at zero
        for net in model.head.members:
            net.behaviour[0].weight.add_(0.3 * torch.randn_like(net.behaviour[0].weight))
    return events, status, history, model


def test_slot_scores_equal_the_training_paths_prediction(log) -> None:
    assert_scores_equal_prediction(log)


def test_sybil_ids_are_judged_as_one_alike_offline_and_in_the_scorer(sybil_log) -> None:
    events, status, history, model = sybil_log
    world = simulated_world(SYBILS)[3]
    sybil = np.flatnonzero(world.physical != np.arange(world.size))[0]  # a further id, and the device's first
    first = world.physical[sybil]
    rows = history.index.lookup(pa.array([world.ids[first].as_py(), world.ids[sybil].as_py()]))
    evidence = history.pair_evidence(np.array([0, 0]), rows, np.array([9, 9]), SMALL.evidence)
    apart = history.pair_evidence(np.array([0, 0]), rows, np.array([9, 9]), replace(SMALL.evidence, colocation_m=None))
    width = SMALL.evidence.collaborator_normalized
    np.testing.assert_array_equal(evidence[0, :width], evidence[1, :width])  # one record for both ids
    assert not np.array_equal(apart[0, :width], apart[1, :width])  # two records apart
    assert_scores_equal_prediction(sybil_log)
    position = {d: xy for d, xy in zip(status["device"].to_pylist(), zip(status["x_m"].to_pylist(),
                                                                       status["y_m"].to_pylist()))}
    ranking = RankingConfig(range_m=None, scores_per_owner=1000)
    scores = [s for r in score_log(TorchStages(model, history.index), events, status, ranking, SystemParams(), "v1")
              for s in r.scores]
    aliases = [s for s in scores if position[s.owner] == position[s.collaborator]]
    assert len(scores) > 1000 and not aliases  # a Sybil owner is not offered its own ids


def test_the_task_sizes_correction_alike_offline_and_in_the_scorer() -> None:
    """The head's size correction adopted: the scorer reads each owner's latest task's size and the collaborators'
    size evidence from its frames as the training path reads them from the history, and the size moves T_beh."""
    events, status, history, model = scored_log(OPPORTUNISTS)
    model.head.sizing.adopt(lam_index=2, strength=2.0, prior_mean=0.8, ridge=1.0)
    assert_scores_equal_prediction((events, status, history, model))
    graph = history.graphs[9]
    small, large = (np.tile([size, SIM.density_cycles_per_bit], (len(graph.src), 1))
                    for size in (OPPORTUNISTS.task_size_bits / 4, OPPORTUNISTS.task_size_bits * 4))
    with torch.no_grad():
        moved = [model.t_beh(model.pair_outputs(history, PairQuery(graph.src, graph.dst, 9, p))).numpy()
                 for p in (small, large)]
    assert np.abs(moved[0] - moved[1]).max() > 0.05


def test_published_trust_says_its_task_size_and_how_it_moves_with_the_size() -> None:
    """Each record names the owner's task size its trust is for and, where the correction is adopted, the size that
    parts large tasks from small ones and the trust's change for a task of the other class: T_res times T_beh's for
    such a task minus T_beh's (the training path's, offline); a scheduler reads the trust for a task of its own from
    them. Without the correction both are null."""
    events, status, history, model = scored_log(OPPORTUNISTS)
    ranking = RankingConfig(range_m=None, scores_per_owner=1000)
    rows = {name: i for i, name in enumerate(history.index.ids)}
    unadopted = next(r for r in score_log(TorchStages(model, history.index), events, status, ranking, SystemParams(),
                                          "v1") if r.slot == 9)
    assert all(s.size_step is None and s.size_split_bits is None for s in unadopted.scores) and unadopted.scores
    model.head.sizing.adopt(lam_index=2, strength=2.0, prior_mean=0.8, ridge=1.0)
    result = next(r for r in score_log(TorchStages(model, history.index), events, status, ranking, SystemParams(),
                                       "v1") if r.slot == 9)
    src = np.array([rows[s.owner] for s in result.scores])
    dst = np.array([rows[s.collaborator] for s in result.scores])
    profile = latest_profiles(events, np.array([s.owner for s in result.scores], object), 9)
    split = OPPORTUNISTS.task_size_bits
    assert {s.size_split_bits for s in result.scores} == {r.size_split_bits for r in result.rankings} == {split}
    other = profile.copy()
    other[:, 0] = np.where(profile[:, 0] > split, split / 3, split * 3)  # a task of the other class, wherever in it
    with torch.no_grad():
        at, across = (model.t_beh(model.pair_outputs(history, PairQuery(src, dst, 9, p))).numpy()
                      for p in (profile, other))
    t_res = np.array([s.t_res for s in result.scores])
    step = np.array([s.size_step for s in result.scores])
    np.testing.assert_allclose(step, (across - at) * t_res, atol=1e-5)
    assert np.abs(step).max() > 0.01 and all(s.size_slope is None for s in result.scores)
    np.testing.assert_array_equal([s.task_size_bits for s in result.scores], profile[:, 0])
    listed = {(r.owner, c.collaborator): c.size_step for r in result.rankings for c in r.candidates}
    by_pair = {(s.owner, s.collaborator): s.size_step for s in result.scores}
    assert listed and all(by_pair[pair] == value for pair, value in listed.items())
    size_of = {s.owner: s.task_size_bits for s in result.scores}
    assert all(r.task_size_bits == size_of[r.owner] for r in result.rankings)
    # the chance of success moves with T_beh: never above the other class's T, never below 0, and it moves somewhere
    moved = np.array([s.p_success + s.success_step for s in result.scores])
    assert (moved >= -1e-12).all() and (moved <= np.clip(np.array([s.trust for s in result.scores]) + step, 0, 1)
                                        + 1e-12).all()
    assert np.abs(moved - [s.p_success for s in result.scores]).max() > 0.01
    assert all(s.success_step is None for s in unadopted.scores)


def test_the_scorer_reads_each_cpu_as_its_tasks_times_show_and_publishes_it() -> None:
    """A model that judges the statuses' CPU claims (training's typical speed gap): the scorer's T_beh is the training
    path's, which reads the verified CPU (:meth:`model.history.History.pair_physics`); every record says the CPU its
    collaborator was read at: that one, about a third of the claim for the overclaimers and the claim for nearly every
    honest device. The rankings' VoC is computed at it: it moves, against the same model believing the claims, for
    exactly the pairs with a side read slower than it claims (a slower CPU takes longer but spends less energy)."""
    events, status, history, model = scored_log(OVERCLAIMERS)
    world = simulated_world(OVERCLAIMERS)[3]
    devices = np.arange(len(history.index))
    gap = typical_speed_gap(history.collaborator_sums(devices, np.full(len(devices), 9), model.config.evidence)[0])
    believing = copy.deepcopy(model)
    model.config = replace(model.config, evidence=replace(model.config.evidence, speed_gap=gap))
    assert_scores_equal_prediction((events, status, history, model))
    (judged, believed), src, dst = scored_at_slot_nine((events, status, history), (model, believing))
    physics = history.pair_physics(src, dst, np.full(len(src), 9), np.full((len(src), 2), 1.0), SystemParams(),
                                   model.config.evidence)
    cpu = np.array([s.cpu_hz for s in judged.scores])
    np.testing.assert_allclose(cpu, physics[:, PHYSICS_COLUMNS.index("cpu_collaborator_hz")], rtol=1e-6)  # float32
    at = [world.ids.to_pylist().index(s.collaborator) for s in judged.scores]
    attacker, claimed = world.attacker[at], world.claimed_cpu_hz[at]
    assert attacker.any() and np.allclose(cpu[attacker], claimed[attacker] / 3, rtol=0.35)
    assert (cpu[~attacker] == claimed[~attacker]).mean() > 0.95
    assert {s.cpu_hz for s in believed.scores} <= set(world.claimed_cpu_hz)
    voc = ({(r.owner, c.collaborator): c.voc for r in result.rankings for c in r.candidates}
           for result in (judged, believed))
    read, claim = next(voc), next(voc)
    slowed_down = {s.collaborator for s, k in zip(judged.scores, claimed) if s.cpu_hz < k}
    touched = {pair for pair in read.keys() & claim.keys() if slowed_down & set(pair)}
    assert touched and all(read[pair] != claim[pair] for pair in touched)
    assert all(read[pair] == claim[pair] for pair in read.keys() & claim.keys() - touched)


def test_the_head_reads_each_load_as_far_as_its_last_fall_is_read() -> None:
    """A model that watches loads for shifts and weighs each fall by its cohort's credit: the scorer's T_beh is the
    training path's, whose physics reads a candidate's load raised by the part of its last fall that is doubted
    (:func:`model.evidence.credited_load`): slower than it reports, never faster. The rankings' VoC, what the task is
    worth at the CPU the device reports free, is the same model's reading every fall in full: only trust waits."""
    events, status, history, model = scored_log(BURNERS, shifts=True, fall_credit=True)
    assert_scores_equal_prediction((events, status, history, model))
    in_full = copy.deepcopy(model)
    in_full.config = replace(model.config, evidence=replace(model.config.evidence, fall_credit=False))
    (credited, read_in_full), src, dst = scored_at_slot_nine((events, status, history), (model, in_full))
    ratio = PHYSICS_COLUMNS.index("offload_over_local")
    read, reported = (history.pair_physics(src, dst, np.full(len(src), 9), np.full((len(src), 2), 1.0),
                                           SystemParams(), m.config.evidence)[:, ratio] for m in (model, in_full))
    slower = read > reported
    assert slower.any() and (read >= reported).all()
    raised = {history.index.ids[j] for j in dst[slower]}
    voc, voc_in_full = ({(r.owner, c.collaborator): c.voc for r in result.rankings for c in r.candidates}
                        for result in (credited, read_in_full))
    common = voc.keys() & voc_in_full.keys()
    assert any(pair[1] in raised for pair in common)
    assert all(voc[pair] == voc_in_full[pair] for pair in common)


def scored_at_slot_nine(log, models) -> tuple[list[SlotScores], np.ndarray, np.ndarray]:
    """Each of ``models``' scores of slot 9 of ``log`` (events, statuses, history), every pair ranked; and the history
    rows of the first's owners and collaborators, (src, dst)."""
    events, status, history = log
    ranking = RankingConfig(range_m=None, scores_per_owner=1000)
    results = [next(r for r in score_log(TorchStages(m, history.index), events, status, ranking, SystemParams(), "v1")
                    if r.slot == 9) for m in models]
    rows = {name: i for i, name in enumerate(history.index.ids)}
    src = np.array([rows[s.owner] for s in results[0].scores])
    dst = np.array([rows[s.collaborator] for s in results[0].scores])
    return results, src, dst


def latest_profiles(events: pa.Table, owners: np.ndarray, slot: int) -> np.ndarray:
    """(o, 2) the size and density of each owner's latest task by the end of ``slot``: what the scorer reads."""
    slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
    seen = events.filter(slot_of <= slot).sort_by([("event_time_ms", "descending"), ("event_id", "descending")])
    owner, first = np.unique(seen["owner"].to_numpy(zero_copy_only=False), return_index=True)
    size, density = (seen[c].to_numpy()[first] for c in ("task_size_bits", "density_cycles_per_bit"))
    at = np.searchsorted(owner, owners)
    return np.stack([size[at], density[at]], axis=1)


def assert_scores_equal_prediction(log) -> None:
    events, status, history, model = log
    ranking = RankingConfig(range_m=None, scores_per_owner=1000)
    stages = TorchStages(model, history.index)
    rows = {name: i for i, name in enumerate(history.index.ids)}
    for result in score_log(stages, events, status, ranking, SystemParams(), "v1"):
        if result.slot not in (2, 9):
            continue
        src = np.array([rows[s.owner] for s in result.scores])
        dst = np.array([rows[s.collaborator] for s in result.scores])
        profile = latest_profiles(events, np.array([s.owner for s in result.scores], object), result.slot)
        with torch.no_grad():
            expected = model.t_beh(model.pair_outputs(history, PairQuery(src, dst, result.slot, profile))).numpy()
        got = np.array([s.t_beh for s in result.scores])
        assert len(got) > 100
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_shards_give_the_same_frame_as_one_history(log) -> None:
    events, status, history, model = log
    stages, ranking = TorchStages(model, history.index), RankingConfig()
    whole = DeviceHistory(model.config.evidence)
    shards = [DeviceHistory(model.config.evidence) for _ in range(3)]
    slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
    for slot in range(6):
        part = slot_part(stages, events.filter(slot_of == slot), slot)
        whole.add_part(part)
        for k, shard in enumerate(shards):
            shard.add_part(part.select(k, 3))
        if slot == 2:  # slots up to 2 final in every history; the later ones pending
            for target in [whole, *shards]:
                target.fold(2)
    keys, ids, times, values = status_arrays(status)
    whole.add_status(keys, ids, times, values)
    for k, shard in enumerate(shards):
        mine = shard_of(keys, 3) == k
        shard.add_status(keys[mine], ids[mine], times[mine], values[mine])
    one = whole.frame(stages, 5, ranking)
    joined = DeviceFrame.concat([s.frame(stages, 5, ranking) for s in shards])
    for name in ("keys", "ids", "status", "recent_owner", "since", "pairs"):
        np.testing.assert_array_equal(getattr(one, name), getattr(joined, name))
    for name in ("y", "collaborator", "owner", "pair_evidence", "reports"):
        np.testing.assert_allclose(getattr(one, name), getattr(joined, name), rtol=1e-9, atol=1e-6)
    np.testing.assert_array_equal(np.isnan(one.profile), np.isnan(joined.profile))
    assert one.recent_owner.sum() > 5 and len(one.pairs) > 5


def test_bad_mouthers_lose_their_credibility_alike_offline_and_in_the_scorer() -> None:
    config = replace(REPORTED, devices=60, tasks=2400, slots=24)
    events, _, status, world = simulated_world(config)
    index = DeviceIndex(tuple(world.ids.to_pylist()))
    model = BM(SMALL, np.zeros((world.size, 8), np.float32)).eval()
    stages = TorchStages(model, index)
    history = DeviceHistory(model.config.evidence)
    history.add_status(*status_arrays(status))
    slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
    for slot in range(config.slots):
        history.add_part(slot_part(stages, events.filter(slot_of == slot), slot))
        history.fold(slot)
    keys, pairs, reports, monitored, _ = history.reported(config.slots - 1)
    weight = credibility(pairs[:, 1], pairs[:, 0], reports[:, -1, :], monitored)
    def world_rows(device_keys: np.ndarray) -> np.ndarray:
        names = np.array(history.names[1])[np.searchsorted(history.names[0], device_keys)]
        return pc.index_in(pa.array(names.tolist()), value_set=world.ids).to_numpy()

    liar = world.attacker[world_rows(pairs[:, 1])]
    assert liar.any() and weight[liar].max() < 0.1 and np.median(weight[~liar]) > 0.95
    # the offline path weighs the same reports alike
    offline = History.from_events(events, SIM.clock, SMALL.weights, index=index, first_slot=0, status=status)
    credited = offline.credited(SMALL.evidence, config.slots - 1)
    frame = history.frame(stages, config.slots - 1, RankingConfig())
    collaborator, _, _, disbelieved = credited_evidence(frame, with_discredited=True)
    rows = index.lookup(pa.array(frame.ids.tolist()))
    monitored_now, _ = offline.tracks(SMALL.evidence)["collaborator"].query(rows, config.slots - 1)
    np.testing.assert_allclose(collaborator, monitored_now + credited.collaborator[rows], rtol=1e-9, atol=1e-9)
    # what was reported and not believed: the liars' reports of their victims, alike offline and in the scorer
    np.testing.assert_allclose(disbelieved, credited.discredited[rows], rtol=1e-9, atol=1e-9)
    told_by_liars = np.zeros(world.size, bool)
    told_by_liars[world_rows(pairs[liar, 0])] = True
    victim = told_by_liars[pc.index_in(pa.array(frame.ids.tolist()), value_set=world.ids).to_numpy()]
    tasks = disbelieved[:, -1, 0]  # at the longest memory
    assert (tasks[victim] > 0).all() and np.median(tasks[victim]) > 10 * max(np.median(tasks[~victim]), 1e-3)
    # a bad-mouther says the computations failed (T_col a1 at most), honest owners mostly that they succeeded
    said = disbelieved[victim, -1, 1] / tasks[victim]
    assert np.median(said) <= SMALL.weights.a_tr
    # from the liars themselves: most of what they reported was not believed, little of what honest owners did
    liar_in_frame = world.attacker[pc.index_in(pa.array(frame.ids.tolist()), value_set=world.ids).to_numpy()]
    doubted, reported = disbelieved[:, -1, 2], disbelieved[:, -1, 3]
    assert (reported[liar_in_frame] > 0).all() and (doubted <= reported + 1e-12).all()
    assert np.median(doubted[liar_in_frame] / reported[liar_in_frame]) > 0.9
    assert np.median(doubted[~liar_in_frame] / np.maximum(reported[~liar_in_frame], 1e-12)) < 0.1
    # and training learns from what it believes: a liar's reported outcomes weigh by its credibility in the targets
    plain, believed = targets(offline, [config.slots - 1]), targets(offline, [config.slots - 1], SMALL.evidence)
    lying = world.attacker[plain.query.src] & (offline.graphs[config.slots - 1].reported_share == 1)
    assert lying.any() and (believed.flagged[lying] < 0.1 * plain.flagged[lying]).all()
    assert np.median(believed.flagged[~lying] / plain.flagged[~lying]) > 0.95
    np.testing.assert_array_equal(believed.t_col, plain.t_col)
    # a fit judges in hindsight: early on the liars still look honest, as of the end of the run they do not
    early = 4
    then, hindsight = (targets(offline, [early], SMALL.evidence, judged_at) for judged_at in (None, config.slots - 1))
    lying = world.attacker[then.query.src] & (offline.graphs[early].reported_share == 1)
    assert lying.any() and hindsight.flagged[lying].sum() < 0.2 * then.flagged[lying].sum()
    assert np.median(hindsight.flagged[~lying] / then.flagged[~lying]) > 0.95


def test_an_updated_slot_replaces_its_evidence_instead_of_adding_it(log) -> None:
    events, _, history, model = log
    stages = TorchStages(model, history.index)
    slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
    first = events.filter(slot_of == 1)
    updated, fresh = DeviceHistory(model.config.evidence), DeviceHistory(model.config.evidence)
    updated.add_part(slot_part(stages, first.slice(0, 20), 1))  # the slot's early events, then all of them
    updated.add_part(slot_part(stages, first, 1))
    fresh.add_part(slot_part(stages, first, 1))
    for target in (updated, fresh):
        target.fold(1)
    a, b = updated.frame(stages, 2, RankingConfig()), fresh.frame(stages, 2, RankingConfig())
    np.testing.assert_allclose(a.collaborator, b.collaborator)
    updated.add_part(slot_part(stages, first, 1))  # a replayed part of a final slot: embeddings only
    np.testing.assert_allclose(updated.frame(stages, 2, RankingConfig()).collaborator, b.collaborator)


def test_evidence_snapshots_round_trip_and_reshard(log, tmp_path) -> None:
    events, status, history, model = log
    stages = TorchStages(model, history.index)  # its size evidence parts tasks below their one size: every one large
    split = SIM.task_size_bits / 2
    stages.config = replace(stages.config, evidence=replace(stages.config.evidence, size_split_bits=split))
    slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
    whole = DeviceHistory(model.config.evidence)
    whole.add_status(*status_arrays(status))  # every device's reported loads count too
    for slot in range(4):
        whole.add_part(slot_part(stages, events.filter(slot_of == slot), slot))
    whole.fold(3)
    assert len(whole.evidence[REPORTS]) > 10
    snapshot = EvidenceSnapshot(whole.folded_through, whole.evidence)
    snapshot.save(tmp_path / "evidence.npz")
    loaded = EvidenceSnapshot.load(tmp_path / "evidence.npz")
    shards = [loaded.select(k, 3) for k in range(3)]
    merged = EvidenceSnapshot.merge(shards)
    assert merged.folded_through == 3
    for role in ("collaborator", "owner", "pair", REPORTS):
        for name in ("keys", "slots", "values", "tags"):
            np.testing.assert_array_equal(getattr(merged.states[role], name), getattr(whole.evidence[role], name))
    seeded = DeviceHistory(model.config.evidence)
    seeded.seed(shards[1])
    assert seeded.folded_through == 3 and len(seeded.evidence["pair"]) == len(shards[1].states["pair"])
    # a snapshot saved before the size channels (the first 11): they start at zero, the rest as saved
    before = {role: EvidenceState(state.lams, state.keys, state.slots, state.values[..., :11], state.tags)
              for role, state in whole.evidence.items() if role != REPORTS}
    EvidenceSnapshot(3, {**whole.evidence, **before}).save(tmp_path / "before.npz")
    upgraded = EvidenceSnapshot.load(tmp_path / "before.npz").states["collaborator"].values
    np.testing.assert_array_equal(upgraded[..., :11], whole.evidence["collaborator"].values[..., :11])
    assert upgraded.shape == whole.evidence["collaborator"].values.shape and not upgraded[..., 11:].any()
    assert whole.evidence["collaborator"].values[..., 11:].any()  # the sizes the snapshot had not kept
    resumed = DeviceHistory(model.config.evidence)  # and a job resumed from it folds the next slots' sums onto it
    resumed.seed(EvidenceSnapshot.load(tmp_path / "before.npz"))
    resumed.add_part(slot_part(stages, events.filter(slot_of == 4), 4))
    resumed.fold(4)
    assert resumed.folded_through == 4 and resumed.evidence["collaborator"].values.shape[-1] == len(CHANNELS)


def test_rankings_follow_the_rule_and_bounds(log) -> None:
    events, status, history, model = log
    ranking = RankingConfig(top_k=3, scores_per_owner=4, range_m=400.0)
    results = list(score_log(TorchStages(model, history.index), events, status, ranking, SystemParams(), "v1"))
    slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
    for result in results:
        owners = set(events.filter(slot_of == result.slot)["owner"].to_pylist())
        assert {r.owner for r in result.rankings} == owners
        assert len(result.scores) <= 4 * len(owners)
        for r in result.rankings:
            assert all(c.trust >= r.threshold for c in r.candidates)  # the records also validate this
            assert [c.voc for c in r.candidates] == sorted((c.voc for c in r.candidates), reverse=True)
            for c in r.candidates[3:]:  # past the top 3 by VoC: members of the (T, VoC) or (T, p_success x VoC)
                more = [d for d in r.candidates if d.trust > c.trust]  # frontier only: above the more trusted
                assert c.voc >= max((d.voc for d in more), default=0) or \
                    c.p_success * c.voc >= max((d.p_success * d.voc for d in more), default=0)
            assert all(0 <= c.p_success <= c.trust for c in r.candidates)  # P(success) <= T_beh: a1 < 1
        assert all(0 <= s.p_success <= s.trust for s in result.scores)


def ranked_one(trust: np.ndarray, voc: np.ndarray, keys: np.ndarray, threshold: float, top_k: int,
               success: np.ndarray | None = None) -> np.ndarray:
    """The positions one owner's ranking lists, in their order (:func:`ranked_rows` for one row)."""
    order, keep = ranked_rows(trust[None], voc[None], keys[None], np.array([threshold]), top_k,
                              None if success is None else success[None])
    return order[0][keep[0]]


@pytest.mark.parametrize("seed", range(6))
def test_a_ranking_holds_the_rules_choice_for_every_threshold_above_its_own(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    trust, voc = rng.choice(np.linspace(0, 1, 12), n), rng.choice(np.linspace(0, 1, 9), n)  # ties on both
    keys = rng.permutation(n).astype(np.int64)
    listed = ranked_one(trust, voc, keys, 0.0, top_k=3)
    order = np.lexsort((keys, -trust, -voc))
    np.testing.assert_array_equal(listed[:3], order[:3])  # the top 3 by the rule, first
    assert [p for p in order if p in set(listed.tolist())] == listed.tolist()  # in the rule's order
    for theta in np.linspace(0, 1, 41):
        eligible = [p for p in order if trust[p] >= theta]
        if eligible:  # the rule's choice at theta, and what a scheduler reading the ranking picks
            assert next(p for p in listed if trust[p] >= theta) == eligible[0]
    # with P(success) x T_res, the success rule's best value at every theta is listed too (the expected-value
    # rule's, T x VoC, is on the (T, VoC) frontier already)
    success = trust * rng.choice(np.linspace(0.3, 1, 8), n)
    listed = ranked_one(trust, voc, keys, 0.0, top_k=3, success=success)
    np.testing.assert_array_equal(listed[:3], order[:3])
    for theta in np.linspace(0, 1, 41):
        eligible = trust >= theta
        if eligible.any():
            shown = np.isin(np.arange(n), listed) & eligible
            for value in (success * voc, trust * voc, voc):
                assert value[shown].max() == value[eligible].max()


def one_owner_at_a_time(trust: np.ndarray, voc: np.ndarray, keys: np.ndarray, threshold: float,
                        top_k: int) -> np.ndarray:
    """The reference: the ranking rule on one owner's eligible candidates, as written in the paper's terms."""
    eligible = np.flatnonzero(trust >= threshold)
    t, v, k = trust[eligible], voc[eligible], keys[eligible]
    order = np.lexsort((k, -t, -v))  # the selection order
    by_trust = np.lexsort((k, -v, -t))
    best_above = np.maximum.accumulate(v[by_trust])[:-1]  # the best VoC among the more trusted (NaN spreads)
    frontier = by_trust[np.r_[True, v[by_trust][1:] > best_above]] if len(k) else by_trust
    listed = np.zeros(len(k), bool)
    listed[order[:top_k]] = True
    listed[frontier] = True
    return eligible[order[listed[order]]]


@pytest.mark.parametrize("seed", range(4))
def test_rankings_of_many_owners_at_once_equal_one_owner_at_a_time(seed: int) -> None:
    """Ties on T and VoC, NaN VoCs and T (a NaN T is never eligible), and owners with nothing eligible."""
    rng = np.random.default_rng(seed)
    m, n = 40, int(rng.integers(1, 30))
    trust = rng.choice(np.r_[np.linspace(0, 1, 8), np.nan], (m, n))
    voc = rng.choice(np.r_[np.linspace(0, 1, 6), np.nan], (m, n))
    keys = np.sort(rng.choice(10 * n, (m, n)), axis=1)  # as a frame's: ascending, ties allowed across owners
    thresholds = rng.choice([0.0, 0.5, 0.9, 1.1], m)
    order, keep = ranked_rows(trust, voc, keys, thresholds, top_k=3)
    for row in range(m):
        want = one_owner_at_a_time(trust[row], voc[row], keys[row], thresholds[row], 3)
        np.testing.assert_array_equal(order[row][keep[row]], want)
    assert (keep.sum(axis=1) == 0).any() and (keep.sum(axis=1) > 3).any()  # nothing eligible; a frontier past top 3


@pytest.mark.parametrize("pad_to", [1, 2, 3, 16])
@pytest.mark.parametrize("per_call", [1, 512])
def test_owner_lists_keep_each_owners_picks_in_owner_order(pad_to: int, per_call: int, monkeypatch) -> None:
    """Owners go together by their pair counts rounded up (1: counts as they are), ``per_call`` at a time; the padding
    (row -1, here a value that sorts last) is never picked, even where an owner has fewer pairs than the picks asked
    for."""
    monkeypatch.setattr(published, "OWNERS_PER_CALL", per_call)
    begin, end = np.array([5, 0, 9, 2, 9]), np.array([9, 1, 9, 5, 10])  # pairs 0..9 in runs; the third owner has none
    value = np.array([3, 1, 0, 9, 8, 7, 4, 6, 5, 2, -np.inf])  # pick each owner's two largest, largest first

    def choose(rows: np.ndarray, owners: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.argsort(-value[rows], axis=1, kind="stable"), np.arange(rows.shape[1]) < 2

    picked, counts = owner_lists(begin, end, choose, pad_to)
    assert counts.tolist() == [2, 1, 0, 2, 1]
    assert picked.tolist() == [5, 7, 0, 3, 4, 9]


def test_the_chance_of_success_and_its_step_by_size_by_hand() -> None:
    """a1 = 0.6, a2 = 0.4: P(success) = clip((T_beh - 0.6 P(tr)) / 0.4, 0, P(tr)), times T_res, and its step for the
    other size class read from T_beh + the size correction. Pair 1: 0.9 -> 0.9, and at 0.7 0.4 (step -0.5); pair 2:
    0.15 x 0.5 -> 0.075, at 0.7 0.4 x 0.5 = 0.2 (+0.125); pair 3: 0 (T_beh at 0.6 P(tr)), at 0.6 0.75 clipped to its
    P(tr) 0.5 (+0.5). The published size_step is T_res times T_beh's."""
    keys = np.arange(4, dtype=np.int64)
    pairs = published.PairScores(
        0, 0, 0, keys, np.array(["o", "a", "b", "c"], object), np.array([0]), np.full(4, 0.1), np.zeros(3, np.int64),
        np.array([1, 2, 3]), np.array([0.9, 0.6, 0.3]), np.array([1.0, 0.5, 1.0]), np.array([0.5, 0.6, 0.7]),
        size_step=np.array([-0.2, 0.1, 0.3]), size_split_bits=1e6, p_tr=np.array([0.9, 0.9, 0.5]))
    result = pairs.publish(RankingConfig(top_k=3, scores_per_owner=3), "v", SlotClock(0, 1000))
    by_collaborator = {s.collaborator: s for s in result.scores}
    assert [by_collaborator[c].p_success for c in "abc"] == pytest.approx([0.9, 0.075, 0.0])
    assert [by_collaborator[c].success_step for c in "abc"] == pytest.approx([-0.5, 0.125, 0.5])
    assert [by_collaborator[c].size_step for c in "abc"] == pytest.approx([-0.2, 0.05, 0.3])
    listed = {c.collaborator: c.success_step for r in result.rankings for c in r.candidates}
    assert listed == {c: by_collaborator[c].success_step for c in listed} and listed
    without = replace(pairs, size_step=None).publish(RankingConfig(top_k=3, scores_per_owner=3), "v",
                                                     SlotClock(0, 1000))
    assert all(s.success_step is None and s.p_success is not None for s in without.scores)


@pytest.mark.parametrize("k, n", [(0, 5), (1, 5), (7, 3), (131_072, 10 ** 6), (1_000, 10 ** 12)])
def test_a_chunks_distinct_rows_are_np_uniques(k: int, n: int) -> None:
    rows = np.random.default_rng(k).integers(0, n, k)
    distinct, places = distinct_rows(rows)
    want, inverse = np.unique(rows, return_inverse=True)
    np.testing.assert_array_equal(distinct, want)
    np.testing.assert_array_equal(places, inverse.reshape(-1))


def test_every_recent_owner_gets_a_ranking_even_with_nothing_in_range(log) -> None:
    events, status, history, model = log
    stages = TorchStages(model, history.index)
    for range_m in (1.0, 300.0):  # 1 m: nobody is in range of anybody
        results = list(score_log(stages, events, status, RankingConfig(range_m=range_m), SystemParams(), "v1"))
        slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
        for result in results:
            owners = set(events.filter(pa.array(slot_of == result.slot))["owner"].to_pylist())
            assert {r.owner for r in result.rankings} == owners and len(result.rankings) == len(owners)
        empty = sum(not r.candidates for result in results for r in result.rankings)
        if range_m == 1.0:
            assert empty == sum(len(r.rankings) for r in results) and not any(r.scores for r in results)
        else:
            assert empty < sum(len(r.rankings) for r in results) / 2


def test_a_model_that_reads_the_cycles_refuses_a_history_that_keeps_none() -> None:
    """The scorer of a model that reads the loads' cycles (EvidenceConfig.cycles) refuses, by name, a frame whose
    history was made without them, rather than read a cycle of zero for every device."""
    events, status, history, model = scored_log(SIM)
    assert model.config.evidence.cycles
    stages, ranking = TorchStages(model, history.index), RankingConfig(range_m=300.0)
    plain = DeviceHistory(replace(model.config.evidence, cycles=False))
    plain.add_status(*status_arrays(status))
    slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
    for slot in range(4):
        plain.add_part(slot_part(stages, events.filter(slot_of == slot), slot))
    frame = plain.frame(stages, 3, ranking)
    assert frame.cycle.shape[-1] == 0 and frame.recent_owner.any()
    with pytest.raises(ValueError, match=r"EvidenceConfig.cycles"):
        score_slot(stages, frame, 3, ranking, SystemParams(), "v1")


def test_status_is_taken_as_of_the_slot_end() -> None:
    history = DeviceHistory(SMALL.evidence)
    values = np.arange(3 * 9, dtype=float).reshape(3, 9) / 30  # the last column is the reported load
    keys = device_keys(["a", "a", "b"])
    history.add_status(keys, np.array(["a", "a", "b"], object), np.array([100, 50, 500]), values)
    model = BM(replace(SMALL, clock=SlotClock(origin_ms=0, slot_ms=200)), np.zeros((2, 8), dtype=np.float32))
    stages = TorchStages(model, DeviceIndex(("a", "b")))
    frame = history.frame(stages, 0, RankingConfig())
    by_id = dict(zip(frame.ids, range(len(frame.ids))))
    np.testing.assert_array_equal(frame.status[by_id["a"]], values[0])  # time 100 is the latest before 200
    assert np.isnan(frame.status[by_id["b"]]).all()  # b's only status comes after the slot
    # the encoder's telemetry per window slot: the load reported by each slot's end (b: nothing in slot 0-1)
    windows = history.windows(stages, 2)
    _, lengths, telemetry = windows.batch(slice(0, len(windows)), windows.buffers(len(windows)))
    a, b = by_id["a"], by_id["b"]
    assert lengths.tolist() == [3, 3]
    np.testing.assert_allclose(telemetry[a, :3], [[values[0, -1], 1.0]] * 3, rtol=1e-6)
    np.testing.assert_allclose(telemetry[b, :3], [[0.0, 0.0], [0.0, 0.0], [values[2, -1], 1.0]], rtol=1e-6)
    np.testing.assert_array_equal(telemetry[:, 3:], telemetry[:, 2:3].repeat(SMALL.window - 3, axis=1))  # padding


def test_devices_the_model_never_saw_are_scored_from_the_cold_row(log) -> None:
    events, status, history, model = log
    renamed = {"dev-000003": "newcomer-a", "dev-000007": "newcomer-b"}

    def rename(column: pa.ChunkedArray) -> pa.Array:
        return pa.array([renamed.get(v, v) for v in column.to_pylist()], pa.string())

    events = events.set_column(events.schema.get_field_index("owner"), "owner", rename(events["owner"]))
    events = events.set_column(events.schema.get_field_index("collaborator"), "collaborator",
                               rename(events["collaborator"]))
    status = status.set_column(status.schema.get_field_index("device"), "device", rename(status["device"]))
    stages = TorchStages(model, history.index)  # the model's index holds dev-000003 and dev-000007, not the newcomers
    assert stages.feature_rows(pa.array(["newcomer-a", "dev-000001"])).tolist() == [len(history.index), 1]
    results = list(score_log(stages, events, status, RankingConfig(range_m=None, scores_per_owner=1000),
                             SystemParams(), "v1"))
    scored = {s.collaborator for r in results for s in r.scores} | {r.owner for r in results for r in r.rankings}
    assert {"newcomer-a", "newcomer-b"} <= scored
    values = [s.t_beh for r in results for s in r.scores if s.collaborator == "newcomer-a"]
    assert values and all(0 <= v <= 1 for v in values)
    assert pc.sum(pc.equal(events["collaborator"], "newcomer-a")).as_py() > 0


def test_a_slot_scored_in_pieces_gives_the_records_of_scoring_it_whole(log) -> None:
    from model.candidates import Pieces

    events, status, history, model = log
    stages, ranking = TorchStages(model, history.index), RankingConfig(range_m=300.0, scores_per_owner=1000)
    whole = DeviceHistory(model.config.evidence)
    whole.add_status(*status_arrays(status))
    slot_of = SIM.clock.slot_of(events["event_time_ms"].to_numpy())
    for slot in range(8):
        whole.add_part(slot_part(stages, events.filter(slot_of == slot), slot))
    frame = whole.frame(stages, 7, ranking)
    one = score_slot(stages, frame, 7, ranking, SystemParams(), "v1")
    parts = [score_slot(stages, part, 7, ranking, SystemParams(), "v1", piece=k)
             for k, part in enumerate(frame.pieces(Pieces(3, cell_m=1.0), ranking.range_m))]
    assert sum(bool(p.rankings) for p in parts) >= 2  # the slot really was spread
    joined = SlotScores.join(parts)

    def table(result):
        return sorted((s.owner, s.collaborator, round(s.t_beh, 5), round(s.trust, 5)) for s in result.scores)

    def ranked(result):
        return sorted((r.owner, r.threshold, tuple((c.collaborator, c.voc) for c in r.candidates)) for r in result.rankings)

    def trusts(result):  # the head's float32 matrix products differ in the last bit with the batch's size
        return np.array([c.trust for r in sorted(result.rankings, key=lambda r: r.owner) for c in r.candidates])

    assert len(one.scores) > 200 and table(joined) == table(one)
    assert ranked(joined) == ranked(one)
    np.testing.assert_allclose(trusts(joined), trusts(one), atol=1e-6)


def test_the_offline_scorer_scores_pieces_on_threads_and_joins_them_in_piece_order(log) -> None:
    from model.candidates import Pieces

    events, status, history, model = log
    stages, ranking = TorchStages(model, history.index), RankingConfig(range_m=300.0, scores_per_owner=1000)
    whole = list(score_log(stages, events, status, ranking, SystemParams(), "v1"))
    threaded = list(score_log(stages, events, status, ranking, SystemParams(), "v1", pieces=Pieces(3, cell_m=1.0)))
    assert [r.slot for r in threaded] == [r.slot for r in whole] and all(r.piece == 0 for r in threaded)
    home = Pieces(3, cell_m=1.0).home(np.stack([status["x_m"].to_numpy(), status["y_m"].to_numpy()], 1), 300.0)
    assert len(set(home[home >= 0].tolist())) >= 2  # the devices really lie on several pieces

    def records(result):  # the head's float32 products differ in the last bit with the batch's size
        scores = sorted((s.owner, s.collaborator, s.t_beh, s.trust) for s in result.scores)
        return [s[:2] for s in scores], np.array([s[2:] for s in scores])

    for a, b in zip(threaded, whole):
        (pairs_a, values_a), (pairs_b, values_b) = records(a), records(b)
        assert pairs_a == pairs_b
        np.testing.assert_allclose(values_a, values_b, atol=1e-6)
        assert sorted(r.owner for r in a.rankings) == sorted(r.owner for r in b.rankings)
    assert sum(len(r.scores) for r in whole) > 200


def test_one_dedup_rule_and_one_retention_horizon() -> None:
    from model.scoring import dedup, first_occurrences, slots_read_back

    table = pa.table({"event_id": ["b", "a", "b", "c", "a"], "n": [0, 1, 2, 3, 4]})
    assert first_occurrences(table).tolist() == [0, 1, 3]  # the first of each id, in arrival order
    assert dedup(table)["n"].to_pylist() == [0, 1, 3]
    assert slots_read_back(32, RankingConfig(owner_slots=1)) == 32
    assert slots_read_back(4, RankingConfig(owner_slots=6)) == 6


def test_a_model_that_reads_no_y_skips_the_encoder_and_scores_the_same(log) -> None:
    events, status, history, model = log
    assert model.uses_encoder  # the fixture's head reads Y
    head_only = copy.deepcopy(model)
    forget_y(head_only)
    assert not head_only.uses_encoder
    assert BM(replace(SMALL, head="paper"), np.zeros((4, 8), np.float32)).uses_encoder  # the paper head reads only Y
    ranking = RankingConfig(range_m=None, scores_per_owner=1000)
    skipping, running = TorchStages(head_only, history.index), TorchStages(head_only, history.index)
    running.uses_encoder = True  # the same model with its encoder run anyway

    def never(*_):
        raise AssertionError("the encoder ran for a model that reads no Y")

    skipping.slot_embeddings = skipping.long_term = never
    assert window_read(skipping) == 1 and window_read(running) == SMALL.window
    got = list(score_log(skipping, events, status, ranking, SystemParams(), "v1"))
    want = list(score_log(running, events, status, ranking, SystemParams(), "v1"))
    assert [r.slot for r in got] == [r.slot for r in want] and sum(len(r.scores) for r in got) > 100
    for a, b in zip(got, want):
        assert [(s.owner, s.collaborator) for s in a.scores] == [(s.owner, s.collaborator) for s in b.scores]
        np.testing.assert_allclose([s.t_beh for s in a.scores], [s.t_beh for s in b.scores], atol=1e-6, rtol=0)
        assert [[c.collaborator for c in r.candidates] for r in a.rankings] == \
            [[c.collaborator for c in r.candidates] for r in b.rankings]
