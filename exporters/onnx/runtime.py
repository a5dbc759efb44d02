"""The onnxruntime scorer: BM's exported stages behind :class:`model.stages.Stages`.

Loading verifies the manifest (format, each graph's sha256, and, when given, the content hash of
the checkpoint it must come from) and refuses anything else with :class:`OnnxModelError`.
Execution providers: TensorRT, then CUDA, then CPU, whichever this onnxruntime build offers
(the ``gpu`` extra installs onnxruntime-gpu in place of the CPU package, never beside it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

import pyarrow as pa

from model.bm import BMConfig
from model.channel import OutageCurve
from model.checkpoint import CheckpointError, config_from_dict, file_sha256, read_manifest
from model.gnn import batched_inputs
from model.graphs import DeviceIndex, SlotGraph
from model.evidence import EvidenceBlocks
from model.stages import chunks, lookup_rows, pair_sides

PREFERRED_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
CPU_DEVICES_PER_CALL = 256  # the encoder's devices per session call on the CPU: see OnnxStages
GPU_DEVICES_PER_CALL = 65536


class OnnxModelError(ValueError):
    """An ONNX export is missing, altered, or not the export of the expected checkpoint."""


def _onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise OnnxModelError("onnxruntime is not installed: pip install 'trustbeam[onnx]' (CPU) or "
                             "'trustbeam[gpu]' (CUDA/TensorRT), not both") from None
    return onnxruntime


def providers(device: str = "auto") -> list[str]:
    """The execution providers for ``--device``: auto = the fastest installed, cpu = the CPU only, cuda = CUDA
    (refused when onnxruntime-gpu's CUDA provider is not installed)."""
    ort = _onnxruntime()

    available = set(ort.get_available_providers())
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device == "cuda" and "CUDAExecutionProvider" not in available:
        raise OnnxModelError("--device cuda --backend onnx: onnxruntime has no CUDAExecutionProvider here "
                             "(install the gpu extra: onnxruntime-gpu)")
    return [p for p in PREFERRED_PROVIDERS if p in available]


class OnnxStages:
    """BM's stages on onnxruntime sessions (see :mod:`exporters.onnx.export` for the graphs)."""

    def __init__(self, directory: str | os.PathLike[str], expect_content_hash: str | None = None,
                 devices_per_call: int | None = None, pairs_per_call: int = 65536, device: str = "auto",
                 threads: int = 0) -> None:
        """``threads``: each session's intra-op CPU threads (0: onnxruntime's default, every core);
        ``devices_per_call``: default 256 on the CPU (the unrolled scan's (B, D, N) steps stay in cache: 1.5x over
        1,024 per call on 2 cores), 65,536 on a GPU."""
        from exporters.onnx.export import FORMAT, stage_files

        root = Path(directory)
        manifest = read_manifest(root, "manifest.json", FORMAT, OnnxModelError,
                                 "no manifest.json; run `trustbeam export-onnx --checkpoint DIR`")
        if expect_content_hash is not None and manifest.get("source_content_hash") != expect_content_hash:
            raise OnnxModelError(f"{root}: exported from checkpoint {manifest.get('model_version')!r}, not the one "
                                 f"configured (content hash {expect_content_hash[:12]}...); export it again")
        self.uses_encoder = bool(manifest.get("uses_encoder", True))
        self.size_corrected = bool(manifest["size_corrected"])
        files = stage_files(self.uses_encoder)
        for name in files:
            if not (root / name).is_file() or file_sha256(root / name) != manifest["files"].get(name):
                raise OnnxModelError(f"{root}/{name}: missing or altered (sha256 does not match the manifest)")
        try:
            self.config: BMConfig = config_from_dict(BMConfig, manifest["config"])
        except CheckpointError as error:
            raise OnnxModelError(f"{root}/manifest.json: {error}") from None
        ort = _onnxruntime()
        self.manifest = manifest
        self.index = DeviceIndex(tuple(manifest["ids"]))
        self.idle = np.asarray(manifest["idle"], dtype=np.float32)
        curve = manifest["transmission"]
        self.transmission = None if curve is None else (OutageCurve(curve[0], curve[1]), curve[2])
        self.providers = providers(device)
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: the GPU packages warn on every CPU fallback
        options.intra_op_num_threads = threads
        self.sessions = {name: ort.InferenceSession(str(root / name), options, providers=self.providers)
                         for name in files}
        on_cpu = self.providers[0] == "CPUExecutionProvider"
        self.devices_per_call = devices_per_call or (CPU_DEVICES_PER_CALL if on_cpu else GPU_DEVICES_PER_CALL)
        self.pairs_per_call = pairs_per_call

    @property
    def model_version(self) -> str:
        return self.manifest["model_version"]

    def feature_rows(self, ids: pa.Array) -> np.ndarray:
        return lookup_rows(self.index, ids)

    def slot_embeddings(self, graph: SlotGraph, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        nodes, src, dst, t_col, offset = (t.numpy() for t in batched_inputs([graph], len(rows)))
        h = self.sessions["gnn.onnx"].run(None, {"nodes": rows[nodes].astype(np.int64), "src": src, "dst": dst,
                                                  "t_col": t_col, "offset": offset})[0]
        return nodes, h

    def long_term(self, windows: Windows) -> np.ndarray:
        out = np.zeros((len(windows), self.config.gnn.out_dim), np.float32)
        session = self.sessions["sequence.onnx"]
        buffers = windows.buffers(self.devices_per_call)
        for part in chunks(len(windows), self.devices_per_call):
            sequences, lengths, telemetry = windows.batch(part, buffers)
            out[part] = session.run(None, {"sequences": sequences, "lengths": lengths, "telemetry": telemetry})[0]
        return out

    def t_beh_pairs(self, y: np.ndarray, physics: np.ndarray, blocks: EvidenceBlocks, src: np.ndarray,
                    dst: np.ndarray, pair_at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = np.zeros((len(src), 2))
        session = self.sessions["pairs.onnx"]
        declared = {i.name for i in session.get_inputs()}  # the paper head's graph reads Y and the rows only
        for part in chunks(len(src), self.pairs_per_call):
            sides = pair_sides(y, physics[part], blocks, src[part], dst[part], pair_at[part])
            out[part] = session.run(None, {k: v for k, v in sides.items() if k in declared})[0]
        return out[:, 0], out[:, 1]

    def t_beh(self, y_i: np.ndarray, y_j: np.ndarray, physics: np.ndarray, evidence: np.ndarray) -> np.ndarray:
        out = np.zeros(len(y_i))
        session = self.sessions["head.onnx"]
        declared = {i.name for i in session.get_inputs()}  # the paper head's graph reads y_i and y_j only
        for part in chunks(len(y_i), self.pairs_per_call):
            inputs = {"y_i": y_i[part], "y_j": y_j[part], "physics": physics[part], "evidence": evidence[part]}
            out[part] = session.run(None, {k: np.ascontiguousarray(v, np.float32) for k, v in inputs.items()
                                           if k in declared})[0]
        return out
