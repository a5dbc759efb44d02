"""ONNX export: onnx.checker, parity with PyTorch per stage and over a simulated run, refusals."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from beam_pipeline.options import JobConfig
from exporters.onnx import FORMAT, OnnxModelError, OnnxStages, export_onnx
from model.checkpoint import load
from model.config import SystemParams
from model.evidence import STATS, EvidenceBlocks
from model.graphs import SlotGraph
from model.scoring import score_log
from model.stages import TorchStages, Windows
from simulator.config import Attack, AttackKind, SimConfig
from tests.pipeline_fixtures import RANKING, SIM, run_tables, write_checkpoint


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    checkpoint = write_checkpoint(tmp_path_factory.mktemp("ckpt") / "model")
    export_onnx(checkpoint)
    return checkpoint, checkpoint / "onnx"


@pytest.fixture(scope="module")
def both(exported) -> tuple[TorchStages, OnnxStages]:
    checkpoint, onnx_dir = exported
    model, index, manifest = load(checkpoint)
    return TorchStages(model, index), OnnxStages(onnx_dir, expect_content_hash=manifest["content_hash"])


def test_export_passes_the_checker_and_carries_its_metadata(exported) -> None:
    checkpoint, onnx_dir = exported
    manifest = json.loads((onnx_dir / "manifest.json").read_text())
    source = json.loads((checkpoint / "config.json").read_text())
    assert manifest["format"] == FORMAT and manifest["source_content_hash"] == source["content_hash"]
    curve, tr_rate = load(checkpoint)[0].transmission()  # what the published P(success) reads, as training fitted it
    assert manifest["transmission"] == pytest.approx([curve.log_c, curve.alpha, tr_rate])
    for name in ("gnn.onnx", "sequence.onnx", "head.onnx", "pairs.onnx"):
        graph = onnx.load(str(onnx_dir / name))
        onnx.checker.check_model(graph, full_check=True)
        props = {p.key: p.value for p in graph.metadata_props}
        assert props["model_version"] == source["model_version"]
        assert int(props["window"]) == source["config"]["window"]
        assert float(props["a_tr"]) == pytest.approx(0.6) and float(props["a_com"]) == pytest.approx(0.4)
    assert not [p for p in onnx_dir.parent.iterdir() if p.name.startswith(".")], "a staging directory was left"


@pytest.mark.parametrize("active,edges", [(1, 1), (5, 4), (30, 200)])
def test_gnn_stage_matches_pytorch(both, active: int, edges: int) -> None:
    torch_stages, onnx_stages = both
    rng = np.random.default_rng(active)
    rows = np.sort(rng.choice(SIM.devices + 1, size=active, replace=False))  # node2vec rows, the cold row too
    src, dst = rng.integers(0, active, edges), rng.integers(0, active, edges)  # positions among the slot's devices
    graph = SlotGraph(0, src, dst, rng.random(edges), rng.random(edges))
    (at_t, h_t), (at_o, h_o) = torch_stages.slot_embeddings(graph, rows), onnx_stages.slot_embeddings(graph, rows)
    np.testing.assert_array_equal(at_t, at_o)
    np.testing.assert_allclose(h_o, h_t, atol=1e-5, rtol=0)


@pytest.mark.parametrize("devices", [1, 7, 2500])
def test_sequence_stage_matches_pytorch_for_every_length(both, devices: int) -> None:
    torch_stages, onnx_stages = both
    window = torch_stages.config.window
    rng = np.random.default_rng(devices)
    sequences = rng.normal(size=(devices, window, torch_stages.config.gnn.out_dim)).astype(np.float32)
    lengths = rng.integers(1, window + 1, devices)
    telemetry = np.stack([rng.random((devices, window)), rng.random((devices, window)) > 0.3], -1).astype(np.float32)
    windows = Windows.dense(sequences, lengths, telemetry)
    got, want = onnx_stages.long_term(windows), torch_stages.long_term(windows)
    assert got.shape == want.shape == (devices, torch_stages.config.gnn.out_dim)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("pairs", [1, 100, 70_000])
def test_head_stage_matches_pytorch(both, pairs: int) -> None:
    torch_stages, onnx_stages = both
    rng = np.random.default_rng(pairs)
    y_i, y_j = (rng.normal(size=(pairs, torch_stages.config.gnn.out_dim)).astype(np.float32) for _ in range(2))
    physics = np.stack([rng.uniform(1, 400, pairs), rng.uniform(2e9, 6e9, pairs), rng.uniform(2e9, 6e9, pairs),
                        rng.uniform(0.2, 2.5, pairs), 2 ** rng.uniform(17, 23, pairs)], axis=1).astype(np.float32)
    physics[::7] = np.nan  # unknown physics
    evidence = rng.random((pairs, torch_stages.config.evidence.features)).astype(np.float32)
    got = onnx_stages.t_beh(y_i, y_j, physics, evidence)
    np.testing.assert_allclose(got, torch_stages.t_beh(y_i, y_j, physics, evidence), atol=1e-5, rtol=0)
    assert ((got >= 0) & (got <= 1)).all()


@pytest.mark.parametrize("devices, pairs, per_call", [(1, 1, 65536), (40, 900, 250), (500, 70_000, 65536)])
def test_pairs_of_a_frame_score_as_their_gathered_rows(both, devices: int, pairs: int, per_call: int) -> None:
    """t_beh_pairs (PyTorch: each device's part of the head once; ONNX: every pair's inputs built) equals t_beh on
    every pair's gathered inputs, however the pairs fall into calls; and its size step equals t_beh for tasks of the
    other size class minus t_beh (the model adopted its size correction)."""
    torch_stages, onnx_stages = both
    evidence, width = torch_stages.config.evidence, torch_stages.config.gnn.out_dim
    lams, split = len(evidence.lams), evidence.size_split_bits
    tail = evidence.collaborator_normalized - 9 * lams + len(STATS) * lams  # recency .. the load's memory, the STATS
    rng = np.random.default_rng(pairs)
    y = rng.normal(size=(devices, width)).astype(np.float32)
    blocks = EvidenceBlocks(*(rng.random((rows, columns)).astype(np.float32) for rows, columns in (
        (devices, 9 * lams), (devices, tail), (devices, 2 * lams), (pairs // 3 + 1, 4 * lams))))
    src, dst = rng.integers(0, devices, pairs), rng.integers(0, devices, pairs)
    pair_at = rng.integers(0, pairs // 3 + 1, pairs)
    physics = np.stack([rng.uniform(1, 400, pairs), rng.uniform(2e9, 6e9, pairs), rng.uniform(2e9, 6e9, pairs),
                        rng.uniform(0.2, 2.5, pairs), split * 2 ** rng.uniform(-3, 3, pairs)],
                       axis=1).astype(np.float32)
    physics[::7] = np.nan
    want = torch_stages.t_beh(y[src], y[dst], physics, blocks.features(src, dst, pair_at))
    other = physics.copy()
    other[:, 4] = np.where(physics[:, 4] > split, split / 5, split * 5)  # a task of the other class
    moved = torch_stages.t_beh(y[src], y[dst], other, blocks.features(src, dst, pair_at)) - want
    assert torch_stages.size_corrected and (pairs < 100 or np.abs(moved).max() > 1e-3)
    for stages in both:
        stages.pairs_per_call = per_call
        try:
            got, step = stages.t_beh_pairs(y, physics, blocks, src, dst, pair_at)
        finally:
            stages.pairs_per_call = 65536
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
        np.testing.assert_allclose(step, moved, atol=1e-5, rtol=0)


def test_a_simulated_run_scores_the_same_on_both_backends(both) -> None:
    scores_alike(both, SIM)


def test_a_head_that_reads_what_was_not_believed_scores_the_same_on_both_backends(tmp_path) -> None:
    """Owners report their tasks and a fifth bad-mouth: the head reads what was reported and not believed
    (model.evidence.discredited_block), in the export as in PyTorch."""
    sim = replace(SIM, attack=Attack(AttackKind.BAD_MOUTHING, 0.2), owner_reports=1.0)
    checkpoint = write_checkpoint(tmp_path / "model", sim)
    export_onnx(checkpoint)
    model, index, manifest = load(checkpoint)
    assert model.config.evidence.discredited
    onnx_stages = OnnxStages(checkpoint / "onnx", expect_content_hash=manifest["content_hash"])
    scores_alike((TorchStages(model, index), onnx_stages), sim)


def scores_alike(both: tuple[TorchStages, OnnxStages], sim: SimConfig) -> None:
    """Every slot of ``sim``'s run scores the same pairs, T_beh, trust and rankings on both backends."""
    events, status = run_tables(sim)
    runs = [list(score_log(stages, events, status, RANKING, SystemParams(), "v")) for stages in both]
    assert [r.slot for r in runs[0]] == [r.slot for r in runs[1]] == list(range(sim.slots))
    for a, b in zip(*runs):
        assert [(s.owner, s.collaborator) for s in a.scores] == [(s.owner, s.collaborator) for s in b.scores]
        np.testing.assert_allclose([s.t_beh for s in b.scores], [s.t_beh for s in a.scores], atol=1e-5)
        np.testing.assert_allclose([s.trust for s in b.scores], [s.trust for s in a.scores], atol=1e-5)
        np.testing.assert_allclose([s.p_success for s in b.scores], [s.p_success for s in a.scores], atol=1e-4)
        assert [[c.collaborator for c in r.candidates] for r in a.rankings] == \
            [[c.collaborator for c in r.candidates] for r in b.rankings]
    assert sum(len(r.scores) for r in runs[0]) > 100


def test_altered_or_foreign_exports_are_refused(exported, tmp_path) -> None:
    checkpoint, onnx_dir = exported
    copy = tmp_path / "onnx"
    shutil.copytree(onnx_dir, copy)
    with pytest.raises(OnnxModelError, match="not the one configured|export it again"):
        OnnxStages(copy, expect_content_hash="0" * 64)
    with open(copy / "head.onnx", "r+b") as handle:
        handle.seek(100)
        byte = handle.read(1)
        handle.seek(100)
        handle.write(bytes([byte[0] ^ 1]))
    with pytest.raises(OnnxModelError, match="head.onnx: missing or altered"):
        OnnxStages(copy)
    with pytest.raises(OnnxModelError, match="no manifest.json"):
        OnnxStages(tmp_path / "nothing")


def test_the_onnx_backend_needs_an_export(exported, tmp_path) -> None:
    checkpoint, _ = exported
    with pytest.raises(ValueError, match="--onnx_model: .* holds no ONNX export"):
        JobConfig(str(checkpoint), backend="onnx", onnx_model=str(tmp_path))
    with pytest.raises(ValueError, match="--backend: must be one of torch, onnx"):
        JobConfig(str(checkpoint), backend="tensorrt")
    stages = JobConfig(str(checkpoint), backend="onnx").stages()[0]
    assert isinstance(stages, OnnxStages) and stages.providers[-1] == "CPUExecutionProvider"


def test_a_model_that_reads_no_y_exports_its_head_alone(tmp_path) -> None:
    checkpoint = write_checkpoint(tmp_path / "model", reads_y=False)
    manifest = export_onnx(checkpoint)
    assert manifest["uses_encoder"] is False and set(manifest["files"]) == {"head.onnx", "pairs.onnx"}
    assert sorted(p.name for p in (checkpoint / "onnx").glob("*.onnx")) == ["head.onnx", "pairs.onnx"]
    model, index, source = load(checkpoint)
    stages = [TorchStages(model, index), OnnxStages(checkpoint / "onnx", expect_content_hash=source["content_hash"])]
    assert not any(s.uses_encoder for s in stages)
    events, status = run_tables()
    runs = [list(score_log(s, events, status, RANKING, SystemParams(), "v")) for s in stages]
    assert sum(len(r.scores) for r in runs[0]) > 100
    for a, b in zip(*runs):
        assert [(s.owner, s.collaborator) for s in a.scores] == [(s.owner, s.collaborator) for s in b.scores]
        np.testing.assert_allclose([s.t_beh for s in b.scores], [s.t_beh for s in a.scores], atol=1e-5)
