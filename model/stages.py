"""BM's three inference stages behind one interface, so scoring runs on PyTorch or onnxruntime.

A scorer (:mod:`model.scoring`) needs only these stages of a trained BM:

* ``slot_embeddings``: the slot GNN over one slot graph -> the active devices' slot embeddings
* ``long_term``: the sequence encoder (BiMamba) over S slot embeddings per device -> Y
* ``t_beh``: the pair head on Y_i, Y_j, the pair's physics and evidence -> T_beh; ``t_beh_pairs`` the same for
  candidate pairs of a frame's devices, from per-device inputs (the scorer's call: on PyTorch, what depends on one
  device goes through the head's first layer once per device, not once per candidate), with how far each T_beh
  moves for a task of the other size class (:meth:`model.bm.BM.pair_scores`)

A model whose head does not read Y (``uses_encoder`` False: the warmed-up head that training keeps when no
end-to-end epoch helps) needs ``t_beh`` only: scorers skip the other two, and its ONNX export holds
``head.onnx`` and ``pairs.onnx`` alone. Besides them, ``feature_rows`` maps device ids to rows of the model's
node2vec table: the devices of the training period have their own row, every other device (a new one) reads the
cold row, whose index is the table's length. :class:`TorchStages` runs them on the PyTorch model;
``exporters.onnx.OnnxStages`` runs the exported ONNX graphs. Both take and return numpy arrays
(float32 in, float32/float64 out).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

import numpy as np
import pyarrow as pa
import torch

from model.bm import BM, BMConfig
from model.channel import OutageCurve
from model.config import DEVICES
from model.evidence import EvidenceBlocks
from model.gnn import batched_inputs
from model.graphs import DeviceIndex, SlotGraph
from model.head import PairSides


class Stages(Protocol):
    config: BMConfig
    idle: np.ndarray  # (d,) the slot embedding of an idle device
    uses_encoder: bool  # whether t_beh reads Y (else slot_embeddings and long_term are never needed)
    size_corrected: bool  # whether t_beh depends on the task's size (the last physics column)
    pairs_per_call: int  # pairs a t_beh call scores at once (bounds its memory)
    transmission: tuple[OutageCurve, float] | None  # the P(tr) curve and the rate where the distance is unknown that
    #                                                 the model's rules read (model.bm.BM.transmission), which the
    #                                                 published P(success) reads; None: the model has none

    def feature_rows(self, ids: pa.Array) -> np.ndarray:
        """(n,) int64 node2vec rows of device ids; the cold row (the table's length) for devices the model
        does not know."""

    def slot_embeddings(self, graph: SlotGraph, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One slot graph over positions 0..n-1 whose node2vec rows are ``rows`` (n,) -> (active positions (a,)
        sorted, embeddings (a, d))."""

    def long_term(self, windows: "Windows") -> np.ndarray:
        """The windows of n devices -> (n, d) float32 Y."""

    def t_beh(self, y_i: np.ndarray, y_j: np.ndarray, physics: np.ndarray, evidence: np.ndarray) -> np.ndarray:
        """(P, d), (P, d) long-term embeddings of owners and candidates, (P, 5) physics, (P, F) evidence ->
        (P,) float64 T_beh."""

    def t_beh_pairs(self, y: np.ndarray, physics: np.ndarray, blocks: EvidenceBlocks, src: np.ndarray,
                    dst: np.ndarray, pair_at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The same T_beh (P,) of the pairs (``src``, ``dst``) (P,) of a frame's rows, from the frame's Y (n, d), the
        pairs' physics (P, 5) and the evidence blocks (rows per device, ``pair_at`` (P,) per pair): what
        ``t_beh(y[src], y[dst], physics, blocks.features(src, dst, pair_at))`` gives, without a row of inputs per
        pair for what depends on one device; and (P,) T_beh's change were each pair's task of the other size class
        (0 where the model's T_beh does not read the size: ``size_corrected`` False)."""


@dataclass(frozen=True)
class Windows:
    """The sequence encoder's inputs for n devices, compact, gathered a batch at a time (:meth:`batch`): each
    device's window is a list of rows of one table of slot embeddings, so the (n, S, d) array of every window is
    never built (at 1M devices and S = 32 it is 4 GB, written once to be read once)."""

    embeddings: np.ndarray  # (m, d) float32: the slot embeddings the windows read
    rows: np.ndarray  # (n, L) intp, 1 <= L <= S: device i's slot embedding at window position k; k >= L repeat L - 1
    lengths: np.ndarray  # (n,) int64: the slots each device has (the encoder reads positions < length)
    telemetry: np.ndarray  # (n, L, TELEMETRY) float32 what each device reported by each slot's end; padded as rows
    window: int  # S

    @classmethod
    def dense(cls, sequences: np.ndarray, lengths: np.ndarray, telemetry: np.ndarray) -> "Windows":
        """From (n, S, d) right-padded slot embeddings, (n,) lengths and (n, S, TELEMETRY) telemetry."""
        n, window, d = sequences.shape
        return cls(np.ascontiguousarray(sequences, np.float32).reshape(n * window, d),
                   np.arange(n * window, dtype=np.intp).reshape(n, window), np.asarray(lengths, np.int64),
                   np.ascontiguousarray(telemetry, np.float32), window)

    def __len__(self) -> int:
        return len(self.rows)

    def buffers(self, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """Empty (b, S, d) and (b, S, TELEMETRY) float32 arrays for :meth:`batch` to fill, b = ``batch`` or fewer:
        no more rows than devices."""
        batch = max(1, min(batch, len(self)))
        return (np.empty((batch, self.window, self.embeddings.shape[1]), np.float32),
                np.empty((batch, self.window, self.telemetry.shape[2]), np.float32))

    def batch(self, part: slice, buffers: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The devices ``part``'s (b, S, d) sequences, (b,) lengths and (b, S, TELEMETRY) telemetry, written into the
        first b rows of ``buffers`` (:meth:`buffers`, at least b rows)."""
        b, filled = part.stop - part.start, self.rows.shape[1]
        sequences, telemetry = buffers[0][:b], buffers[1][:b]
        # the rows are the table's ("clip" writes straight into ``out``; "raise" would go through a copy)
        np.take(self.embeddings, self.rows[part], axis=0, out=sequences[:, :filled], mode="clip")
        sequences[:, filled:] = sequences[:, filled - 1:filled]
        telemetry[:, :filled] = self.telemetry[part]
        telemetry[:, filled:] = telemetry[:, filled - 1:filled]
        return sequences, self.lengths[part], telemetry


SIDES = ("y_owner", "owner", "y_collaborator", "collaborator", "pair", "physics", "src", "dst")  # PairSides' order


def distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, return_inverse=True)`` of (k,) non-negative int64 rows: the distinct rows in order and each
    one's place among them, by one value sort of (row, index) codes, which numpy does with SIMD where ``np.unique``
    argsorts; the cost grows with k, not with the frame the rows index."""
    rows = np.asarray(rows, np.int64)
    bits = max(len(rows) - 1, 1).bit_length()  # the low bits hold each row's index
    codes = np.sort(rows << bits | np.arange(len(rows), dtype=np.int64))
    ordered = codes >> bits
    new = np.r_[True, ordered[1:] != ordered[:-1]] if len(rows) else np.zeros(0, bool)
    places = np.empty(len(rows), np.int64)
    places[codes & ((1 << bits) - 1)] = np.cumsum(new) - 1
    return ordered[new], places


def pair_sides(y: np.ndarray, physics: np.ndarray, blocks: EvidenceBlocks, src: np.ndarray, dst: np.ndarray,
               pair_at: np.ndarray) -> dict[str, np.ndarray]:
    """The inputs of :class:`model.head.PairSides` (named as :data:`SIDES`) for candidate pairs (``src``, ``dst``) of
    a frame's rows: the rows of the devices these pairs read, once each, and every pair's rows in them."""
    devices, rows = distinct_rows(np.concatenate([src, dst]))
    y_rows = np.ascontiguousarray(y[devices], np.float32)
    collaborator = np.concatenate([blocks.collaborator_head[devices], blocks.collaborator_tail[devices]], axis=1)
    return {"y_owner": y_rows, "owner": np.ascontiguousarray(blocks.owner[devices]), "y_collaborator": y_rows,
            "collaborator": collaborator, "pair": np.ascontiguousarray(blocks.pair[pair_at]),
            "physics": np.ascontiguousarray(physics, np.float32), "src": rows[: len(src)].astype(np.int64),
            "dst": rows[len(src):].astype(np.int64)}


def resolve_device(name: str) -> torch.device:
    """``--device``: ``auto`` is the GPU when PyTorch sees one, else the CPU; ``cuda`` refuses to start without."""
    if name not in DEVICES:
        raise ValueError(f"--device: must be one of {', '.join(DEVICES)} (got {name!r})")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: PyTorch sees no CUDA GPU (torch.cuda.is_available() is False); "
                         "use --device cpu or auto")
    return torch.device("cuda" if name != "cpu" and torch.cuda.is_available() else "cpu")


def chunks(n: int, size: int) -> Iterator[slice]:
    """Slices covering range(n) in pieces of at most ``size`` (bounds the memory of a stage call)."""
    return (slice(begin, min(begin + size, n)) for begin in range(0, n, size))


def lookup_rows(index: DeviceIndex, ids: pa.Array) -> np.ndarray:
    """Rows of ``ids`` in the model's index; ``len(index)`` (the cold row) for the others."""
    rows = index.lookup(ids)
    return np.where(rows >= 0, rows, len(index))


CPU_DEVICES_PER_CALL = 128  # the fused CPU pass's intermediates of a call stay in cache (8,192: 0.17 ms/device, 128: 0.09-0.14)


def encoder_batch(config: BMConfig, device: torch.device, free_bytes: int | None = None,
                  share: float = 0.5) -> int:
    """Devices per sequence-encoder call: ``CPU_DEVICES_PER_CALL`` on the CPU (cache-sized); on a GPU as many as fit in
    ``share`` of its free memory (``free_bytes``, default what CUDA reports), counting per device the
    reference scan's float32 intermediates, decay and drive (S, d_inner, d_state) each, plus the layer's
    activations (the largest tensors of a call; mamba-ssm's fused kernels need far less)."""
    if device.type == "cpu":
        return CPU_DEVICES_PER_CALL
    free = torch.cuda.mem_get_info(device)[0] if free_bytes is None else free_bytes
    m = config.mamba
    per_device = 4 * config.window * m.d_inner * (2 * m.d_state + 8)
    return int(min(1 << 20, max(256, share * free // per_device)))


def pinned_batches(windows: Windows, batch: int, device: torch.device
                   ) -> Iterator[tuple[slice, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    """Each ``batch`` devices of ``windows`` as (sequences, lengths, telemetry) tensors on the GPU ``device``, ready
    for the current stream. :meth:`Windows.batch` gathers them into one of two pinned staging buffers, which the
    copy engine moves on a side stream while the host fills the other and the GPU computes the batch before (a
    copy from pageable memory is synchronous and runs at a fraction of the link's speed)."""
    side, compute = torch.cuda.Stream(device), torch.cuda.current_stream(device)
    batch = max(1, min(batch, len(windows)))  # no larger than the input; an empty input gives no batch
    staging = [(*(torch.from_numpy(b).pin_memory() for b in windows.buffers(batch)),
                torch.empty(batch, dtype=torch.int64, pin_memory=True)) for _ in range(2)]
    copied = [torch.cuda.Event(), torch.cuda.Event()]
    for k, part in enumerate(chunks(len(windows), batch)):
        (sequences, telemetry, lengths), done, rows = staging[k % 2], copied[k % 2], part.stop - part.start
        done.synchronize()  # the copy that last read these buffers (batch k - 2) has left them
        _, batch_lengths, _ = windows.batch(part, (sequences.numpy(), telemetry.numpy()))
        lengths.numpy()[:rows] = batch_lengths
        with torch.cuda.stream(side):
            moved = tuple(t[:rows].to(device, non_blocking=True) for t in (sequences, lengths, telemetry))
            done.record(side)
        compute.wait_stream(side)
        for tensor in moved:
            tensor.record_stream(compute)  # allocated on the side stream, freed once the compute stream is done
        yield part, moved


class TorchStages:
    """The stages on the PyTorch model (inference mode) on ``device``: inputs go there, outputs come back as
    numpy; the scan backend follows the tensors (mamba-ssm's kernels on CUDA when installed, else the
    reference scan; the C++ scan on the CPU). ``devices_per_call``: default :func:`encoder_batch`. On a GPU the
    encoder's batches travel by :func:`pinned_batches` (``pinned`` False: straight from pageable memory, one
    batch after another; the benchmark's comparison)."""

    def __init__(self, model: BM, index: DeviceIndex, devices_per_call: int | None = None, pairs_per_call: int = 65536,
                 device: torch.device = torch.device("cpu"), pinned: bool = True) -> None:
        self.device = device
        self.pinned = pinned and device.type == "cuda"
        self.model, self.index = model.to(device).eval(), index
        self.devices_per_call = devices_per_call or encoder_batch(model.config, device)
        self.pairs_per_call = pairs_per_call
        self.config = model.config
        self.uses_encoder = model.uses_encoder
        self.size_corrected = model.size_corrected
        self.transmission = model.transmission()
        self.idle = model.slot_encoder.idle.detach().cpu().numpy()
        with torch.no_grad():  # the node2vec rows as inference reads them, then the cold row
            self.table = torch.cat([model.device_features(), model.cold[None]])

    def feature_rows(self, ids: pa.Array) -> np.ndarray:
        return lookup_rows(self.index, ids)

    def slot_embeddings(self, graph: SlotGraph, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        nodes, src, dst, t_col, offset = batched_inputs([graph], len(rows))
        with torch.no_grad():
            features = self.table[self.model.tensor(rows)[nodes.to(self.device)]]  # (a, node_dim)
            h = self.model.slot_encoder.encode(features, *(t.to(self.device) for t in (src, dst, t_col, offset)))
        return nodes.numpy(), h.cpu().numpy()

    def long_term(self, windows: Windows) -> np.ndarray:
        if self.pinned:
            return self._long_term_pinned(windows)
        out = np.zeros((len(windows), self.config.gnn.out_dim), np.float32)
        buffers = windows.buffers(self.devices_per_call)  # reused: on the CPU a call's inputs stay in cache
        with torch.no_grad():
            for part in chunks(len(windows), self.devices_per_call):
                y = self.model.encode(*(self.model.tensor(a) for a in windows.batch(part, buffers)))
                out[part] = y.cpu().numpy()
        return out

    def _long_term_pinned(self, windows: Windows) -> np.ndarray:
        """``long_term`` on a GPU: inputs in by :func:`pinned_batches`, Y back into pinned memory without waiting."""
        out = torch.empty((len(windows), self.config.gnn.out_dim), dtype=torch.float32, pin_memory=True)
        with torch.no_grad():
            for part, inputs in pinned_batches(windows, self.devices_per_call, self.device):
                out[part].copy_(self.model.encode(*inputs), non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return out.numpy()

    def t_beh(self, y_i: np.ndarray, y_j: np.ndarray, physics: np.ndarray, evidence: np.ndarray) -> np.ndarray:
        out = np.zeros(len(y_i))
        with torch.no_grad():
            for part in chunks(len(y_i), self.pairs_per_call):
                raw = self.model.head(*(self.model.tensor(np.asarray(a[part], np.float32))
                                        for a in (y_i, y_j, physics, evidence)))
                out[part] = self.model.t_beh(raw).double().cpu().numpy()
        return out

    def t_beh_pairs(self, y: np.ndarray, physics: np.ndarray, blocks: EvidenceBlocks, src: np.ndarray,
                    dst: np.ndarray, pair_at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every device a chunk of pairs reads goes through the head's device-level products once
        (:class:`model.head.PairSides`)."""
        out = np.zeros((len(src), 2))
        with torch.no_grad():
            for part in chunks(len(src), self.pairs_per_call):
                sides = pair_sides(y, physics[part], blocks, src[part], dst[part], pair_at[part])
                scores = self.model.pair_scores(PairSides(*(self.model.tensor(sides[name]) for name in SIDES)))
                out[part] = scores.double().cpu().numpy()
        return out[:, 0], out[:, 1]
