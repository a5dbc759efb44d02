"""Export a BM checkpoint's inference stages to ONNX, checked against PyTorch before it is kept.

Three graphs, each with a dynamic batch axis:

==================  ==========================================================  ==================
file                inputs                                                      output
==================  ==========================================================  ==================
``gnn.onnx``        nodes (a,) int64 node2vec rows (the cold row: the number of h (a, d) float32
                    devices); src, dst (E,) int64 positions in ``nodes``;
                    t_col, offset (E,) float32
``sequence.onnx``   sequences (n, S, d) float32 right-padded; lengths (n,) int64; y (n, d) float32
                    telemetry (n, S, 2) float32 (reported load, reported)
``head.onnx``       y_i, y_j (P, d) float32; physics (P, 5) float32 (NaN         t_beh (P,) float32
                    unknown); evidence (P, F) float32 (the paper head reads
                    only y_i and y_j)
``pairs.onnx``      the same head on inputs split by what they depend on          t_beh (P,) float32
                    (:class:`model.head.PairSides`): y_owner (n_o, d), owner
                    (n_o, 2L), y_collaborator (n_c, d), collaborator (n_c, 11L
                    + 4 + 13L), pair (P, 4L), physics (P, 5) float32; src, dst
                    (P,) int64 rows (what scorers run)
==================  ==========================================================  ==================

A model whose head reads no Y (:attr:`model.bm.BM.uses_encoder` False) is exported as its two head graphs alone:
scorers never run the other two for it. The node2vec table (the known devices' rows, then the cold row) is a
constant of ``gnn.onnx``; S
is fixed in ``sequence.onnx``. The exporter
is the TorchScript-based one (``dynamo=False``) over the reference scan loop, unrolled S times:
PLATFORM.md measured it correct for this model, and in-place parallel scans export silently
wrong with it, so each export is run in onnxruntime against PyTorch before it is written.

``manifest.json`` holds the format, the source checkpoint's content hash and model version, whether the model
uses its encoder (``uses_encoder``; ``files`` then names the three graphs, else ``head.onnx`` only), S,
the widths, alpha (a_tr, a_com), the model config and device ids, the idle embedding, and the
sha256 of each graph; each graph also carries the same scalars as ONNX metadata.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import astuple
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from model.bm import BM
from model.checkpoint import config_to_dict, file_sha256, load, staged_directory
from model.evidence import STATS
from model.head import PairSides
from model.stages import SIDES

# 3: sequence.onnx reads each slot's telemetry; 4: uses_encoder; 5: pairs.onnx; 6: the load's drift; 7: its memory;
# 8: pairs.onnx gives T_beh's size slope beside it, and size_corrected; 9: its size step (a task of the other class);
# 10: the rules' P(tr) curve (transmission), which the published P(success) reads
FORMAT = "trustbeam-onnx/10"
OPSET = 18
STAGE_FILES = ("gnn.onnx", "sequence.onnx", "head.onnx", "pairs.onnx")
HEAD_FILES = ("head.onnx", "pairs.onnx")  # what a model that reads no Y needs


def stage_files(uses_encoder: bool) -> tuple[str, ...]:
    return STAGE_FILES if uses_encoder else HEAD_FILES


class GNNStage(nn.Module):
    def __init__(self, model: BM) -> None:
        super().__init__()
        self.encoder = model.slot_encoder
        with torch.no_grad():
            self.register_buffer("features", torch.cat([model.eval().device_features(), model.cold[None]]))

    def forward(self, nodes: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, t_col: torch.Tensor,
                offset: torch.Tensor) -> torch.Tensor:
        return self.encoder.encode(self.features[nodes], src, dst, t_col, offset)  # (a, d)


class SequenceStage(nn.Module):
    def __init__(self, model: BM) -> None:
        super().__init__()
        self.model = model

    def forward(self, sequences: torch.Tensor, lengths: torch.Tensor, telemetry: torch.Tensor) -> torch.Tensor:
        return self.model.encode(sequences, lengths, telemetry)  # (n, d)


class HeadStage(nn.Module):
    def __init__(self, model: BM) -> None:
        super().__init__()
        self.model = model

    def forward(self, y_i: torch.Tensor, y_j: torch.Tensor, physics: torch.Tensor, evidence: torch.Tensor
                ) -> torch.Tensor:
        return self.model.t_beh(self.model.head(y_i, y_j, physics, evidence))  # (P,)


class PairsStage(nn.Module):
    """The head on inputs split by what they depend on (:class:`model.head.PairSides`): the scorer's candidates."""

    def __init__(self, model: BM) -> None:
        super().__init__()
        self.model = model

    def forward(self, y_owner: torch.Tensor, owner: torch.Tensor, y_collaborator: torch.Tensor,
                collaborator: torch.Tensor, pair: torch.Tensor, physics: torch.Tensor, src: torch.Tensor,
                dst: torch.Tensor) -> torch.Tensor:
        sides = PairSides(y_owner, owner, y_collaborator, collaborator, pair, physics, src, dst)
        return self.model.pair_scores(sides)  # (P, 2): T_beh, its change for a task of the other size class


def _examples(model: BM, seed: int = 0) -> dict[str, tuple[torch.Tensor, ...]]:
    """Random inputs of every stage (also the parity check's inputs)."""
    g = torch.Generator().manual_seed(seed)
    n, d, window = len(model.features) + 1, model.config.gnn.out_dim, model.config.window  # + the cold row
    evidence = model.config.evidence
    lams = len(evidence.lams)
    active = min(n, 24)
    nodes = torch.randperm(n, generator=g)[:active].sort().values
    edges = 3 * active
    src, dst = torch.randint(0, active, (edges,), generator=g), torch.randint(0, active, (edges,), generator=g)
    lengths = torch.randint(1, window + 1, (9,), generator=g)
    lengths[0] = window
    return {
        "gnn.onnx": (nodes, src, dst, torch.rand(edges, generator=g), torch.rand(edges, generator=g)),
        "sequence.onnx": (torch.randn(9, window, d, generator=g), lengths,
                          torch.stack([torch.rand(9, window, generator=g), (torch.rand(9, window, generator=g) > 0.3)
                                       .float()], -1)),
        "head.onnx": (torch.randn(33, d, generator=g), torch.randn(33, d, generator=g), physics_example(33, g),
                      torch.rand(33, evidence.features, generator=g)),
        "pairs.onnx": (torch.randn(11, d, generator=g), torch.rand(11, 2 * lams, generator=g),
                       torch.randn(11, d, generator=g),
                       torch.rand(11, evidence.collaborator_normalized + len(STATS) * lams, generator=g),
                       torch.rand(33, 4 * lams, generator=g), physics_example(33, g),
                       torch.randint(0, 11, (33,), generator=g), torch.randint(0, 11, (33,), generator=g)),
    }


def physics_example(pairs: int, g: torch.Generator) -> torch.Tensor:
    """Plausible raw pair physics (distance m, CPUs Hz, time ratio, task size bit) with some unknown (NaN) rows."""
    physics = torch.stack([torch.rand(pairs, generator=g) * 400, 2e9 + torch.rand(pairs, generator=g) * 4e9,
                           2e9 + torch.rand(pairs, generator=g) * 4e9, 0.2 + torch.rand(pairs, generator=g) * 2,
                           1e5 * 2 ** (6 * torch.rand(pairs, generator=g))], 1)
    physics[::5] = float("nan")
    return physics


_SIGNATURES: dict[str, tuple[list[str], str, dict[str, dict[int, str]]]] = {
    "gnn.onnx": (["nodes", "src", "dst", "t_col", "offset"], "h",
                 {"nodes": {0: "active"}, "src": {0: "edges"}, "dst": {0: "edges"}, "t_col": {0: "edges"},
                  "offset": {0: "edges"}, "h": {0: "active"}}),
    "sequence.onnx": (["sequences", "lengths", "telemetry"], "y",
                      {"sequences": {0: "devices"}, "lengths": {0: "devices"}, "telemetry": {0: "devices"},
                       "y": {0: "devices"}}),
    "head.onnx": (["y_i", "y_j", "physics", "evidence"], "t_beh",
                  {"y_i": {0: "pairs"}, "y_j": {0: "pairs"}, "physics": {0: "pairs"}, "evidence": {0: "pairs"},
                   "t_beh": {0: "pairs"}}),
    "pairs.onnx": (list(SIDES), "t_beh",
                   {"y_owner": {0: "owners"}, "owner": {0: "owners"}, "y_collaborator": {0: "collaborators"},
                    "collaborator": {0: "collaborators"}, "pair": {0: "pairs"}, "physics": {0: "pairs"},
                    "src": {0: "pairs"}, "dst": {0: "pairs"}, "t_beh": {0: "pairs"}}),
}


def export_onnx(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                tolerance: float = 1e-5) -> dict[str, Any]:
    """Export the checkpoint's stages to ``out`` (default ``CHECKPOINT/onnx``); returns the manifest.

    Raises ValueError when a graph fails ``onnx.checker`` or differs from PyTorch by more than
    ``tolerance`` on random inputs; nothing is written then.
    """
    import onnx

    model, index, source = load(checkpoint)
    target = Path(out) if out is not None else Path(checkpoint) / "onnx"
    config = model.config
    meta = {"format": FORMAT, "model_version": source["model_version"], "source_content_hash": source["content_hash"],
            "uses_encoder": model.uses_encoder, "size_corrected": model.size_corrected,
            "window": config.window, "d_model": config.gnn.out_dim, "node_dim": config.gnn.node_dim,
            "devices": len(index), "a_tr": config.weights.a_tr, "a_com": config.weights.a_com, "opset": OPSET}
    modules = {"gnn.onnx": GNNStage, "sequence.onnx": SequenceStage, "head.onnx": HeadStage, "pairs.onnx": PairsStage}
    stages = {name: modules[name](model) for name in stage_files(model.uses_encoder)}
    with staged_directory(target) as staging:
        files = {}
        for name, module in stages.items():
            path = staging / name
            _export(module.eval(), _examples(model)[name], path, name)
            graph = onnx.load(str(path))
            onnx.helper.set_model_props(graph, {k: str(v) for k, v in meta.items()})
            onnx.checker.check_model(graph, full_check=True)
            onnx.save(graph, str(path))
            error = parity_error(module, path, _examples(model, seed=1)[name], _SIGNATURES[name][0])
            if error > tolerance:
                raise ValueError(f"{name}: onnxruntime differs from PyTorch by {error:.3g} (> {tolerance})")
            files[name] = file_sha256(path)
        transmission = model.transmission()
        manifest = {**meta, "files": files, "config": config_to_dict(config), "ids": list(index.ids),
                    "idle": model.slot_encoder.idle.detach().tolist(),
                    "transmission": None if transmission is None else [*astuple(transmission[0]), transmission[1]]}
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _export(module: nn.Module, example: tuple[torch.Tensor, ...], path: Path, name: str) -> None:
    inputs, output, axes = _SIGNATURES[name]
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer and deprecation chatter; parity is checked instead
        torch.onnx.export(module, example, str(path), dynamo=False, opset_version=OPSET, input_names=inputs,
                          output_names=[output], dynamic_axes=axes)


def parity_error(module: nn.Module, path: Path, example: tuple[torch.Tensor, ...], inputs: list[str]) -> float:
    """Max |onnxruntime - PyTorch| of one stage on the given inputs."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    declared = {i.name for i in session.get_inputs()}  # the exporter drops inputs a graph never reads
    got = session.run(None, {k: v.numpy() for k, v in zip(inputs, example) if k in declared})[0]
    with torch.no_grad():
        want = module(*example).numpy()
    return float(np.abs(got - want).max())
