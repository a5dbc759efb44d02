"""BM's stages on CPU and GPU side by side: devices per second for the BiMamba encoder and for a whole slot.

Encoder rows: the long-term embedding Y of N devices from S slot embeddings each (BM's default widths,
3 bidirectional layers, an untrained seeded model; the product's own stage objects), for S in
``--lengths``, through each backend that this machine has:

* ``torch cpu``: PyTorch on the CPU with trustbeam's C++ selective scan;
* ``torch cuda reference``: PyTorch on the GPU with the reference scan (materializes (B, D, L, N));
* ``torch cuda mamba-ssm``: PyTorch on the GPU with mamba-ssm's fused kernels (the ``gpu`` extra), inputs
  through pinned staging buffers while the batch before computes (:func:`model.stages.pinned_batches`);
* ``torch cuda mamba-ssm pageable``: the same, each batch copied straight from pageable memory before it runs;
* ``onnxruntime cpu`` / ``onnxruntime cuda``: the exported graph (``trustbeam export-onnx``) on
  onnxruntime's CPU or CUDA execution provider.

A backend the machine lacks gets a row saying why. Each row: devices, median seconds over ``--repeats``
(after one warm-up call), devices/s, peak GPU memory, and the largest difference from the first
backend's Y on the first 512 devices (parity). Slot rows (``--slot-sizes``): one slot of a synthetic
fleet at the paper's density scored end to end by ``trustbeam score --device D`` (GNN, BiMamba, pairs in
range, rankings; :mod:`bench.fleet_bench`), per device in ``--slot-devices``, per ``--slot-pieces`` count
(``trustbeam score --score_pieces``: pieces of the slot scored on threads at once) and per ``--slot-models`` model
(``encoder``: a head that reads Y, so the slot GNN and BiMamba run; ``head``: one kept from the warm-up, as training
has kept in every evaluation, which runs neither). Each row is also printed to
stderr as a JSON line when it is measured, so a run stopped at a lease's time limit keeps the rows it finished.

Run: ``python -m bench.gpu_bench [--lengths 32 64 256] [--devices 1000000 1000000 20000]
[--slot-sizes 100000 1000000] [--slot-devices cpu cuda] [--slot-pieces 1 16]
[--slot-models encoder head]``; ``--cpu-devices`` caps N for the
PyTorch CPU rows and ``--onnx-cpu-devices`` for onnxruntime's CPU rows (its unrolled scan runs ~14x slower than the
C++ one).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from bench.report import emit, progress

if TYPE_CHECKING:
    from model.stages import Windows

BACKENDS = ("torch cpu", "torch cuda reference", "torch cuda mamba-ssm", "torch cuda mamba-ssm pageable",
            "onnxruntime cpu", "onnxruntime cuda")
PARITY_DEVICES = 512


def missing(backend: str) -> str | None:
    """Why this machine cannot run ``backend`` (None when it can)."""
    import torch

    from model.scan import cpu_extension, cuda_kernels_available

    if backend == "torch cpu" and cpu_extension() is None:
        return "the C++ scan did not build"
    if "cuda" in backend and not backend.startswith("onnx") and not torch.cuda.is_available():
        return "PyTorch sees no CUDA GPU"
    if backend.startswith("torch cuda mamba-ssm") and not cuda_kernels_available():
        return "mamba-ssm is not installed (pip install -e '.[gpu]')"
    if backend.startswith("onnxruntime"):
        import onnxruntime as ort

        if backend.endswith("cuda") and "CUDAExecutionProvider" not in ort.get_available_providers():
            return "onnxruntime has no CUDAExecutionProvider (install onnxruntime-gpu)"
    return None


def encoder(backend: str, checkpoint: Path) -> Callable[["Windows"], np.ndarray]:
    """The product's ``long_term`` stage of ``checkpoint`` on ``backend``: the windows of N devices -> Y (N, d)."""
    import torch

    from exporters.onnx.runtime import OnnxStages
    from model.bimamba import MambaConfig
    from model.checkpoint import load
    from model.stages import TorchStages

    if backend.startswith("onnxruntime"):
        return OnnxStages(checkpoint / "onnx", device=backend.split()[-1]).long_term
    model, index, _ = load(checkpoint)
    scan = {"torch cpu": "cpu", "torch cuda reference": "reference", "torch cuda mamba-ssm": "cuda",
            "torch cuda mamba-ssm pageable": "cuda"}[backend]
    for module in model.modules():
        if isinstance(getattr(module, "config", None), MambaConfig):
            module.config = replace(module.config, backend=scan)
    device = torch.device("cuda" if "cuda" in backend else "cpu")
    pinned = not backend.endswith("pageable")
    return TorchStages(model, index, device=device, pinned=pinned).long_term  # batches sized by the GPU's free memory


def encoder_rows(lengths: list[int], devices: list[int], cpu_devices: int, repeats: int, work: Path,
                 onnx_cpu_devices: int | None = None, backends: tuple[str, ...] = BACKENDS) -> list[dict]:
    """The encoder rows (module docstring) of ``backends``; ``onnx_cpu_devices`` (default ``cpu_devices``) caps
    onnxruntime's CPU rows."""
    import torch

    from bench.fault_harness import untrained_checkpoint
    from exporters.onnx.export import export_onnx
    from model.bm import BMConfig
    from model.stages import Windows
    from simulator.config import SimConfig

    rows = []
    for length, n in zip(lengths, devices):
        checkpoint = untrained_checkpoint(work / f"model-{length}", SimConfig(devices=500), window=length, small=False)
        if any(backend.startswith("onnxruntime") for backend in backends):
            export_onnx(checkpoint)
        d = BMConfig().gnn.out_dim  # the slot-embedding width
        rng = np.random.default_rng(length)
        sequences = rng.standard_normal((n, length, d), dtype=np.float32)  # float32 drawn directly: 1M x S x d
        lengths_n = rng.integers(1, length + 1, n).astype(np.int64)
        reports = np.stack([rng.random((n, length)), np.ones((n, length))], -1).astype(np.float32)
        reference: np.ndarray | None = None
        for backend in backends:
            why = missing(backend)
            row = {"stage": "encoder", "backend": backend, "S": length}
            if why:
                rows.append(progress({**row, "skipped": why}))
                continue
            cap = (onnx_cpu_devices or cpu_devices) if backend == "onnxruntime cpu" else cpu_devices
            count = min(n, cap) if "cpu" in backend else n
            run = encoder(backend, checkpoint)
            parity = run(Windows.dense(sequences[:PARITY_DEVICES], lengths_n[:PARITY_DEVICES],
                                       reports[:PARITY_DEVICES]))  # warm-up
            windows = Windows.dense(sequences[:count], lengths_n[:count], reports[:count])
            reference = parity if reference is None else reference
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            times = []
            try:
                for _ in range(repeats):
                    started = time.perf_counter()
                    run(windows)
                    times.append(time.perf_counter() - started)
            except torch.cuda.OutOfMemoryError:
                rows.append(progress({**row, "devices": count, "skipped": "out of GPU memory"}))
                torch.cuda.empty_cache()
                continue
            seconds = statistics.median(times)
            rows.append(progress({
                **row, "devices": count, "seconds": round(seconds, 3), "devices_per_s": round(count / seconds),
                "max_abs_diff": float(np.abs(parity - reference).max()),
                "gpu_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20) if "cuda" in backend else ""}))
    return rows


SLOT_MODELS = ("encoder", "head")  # a head that reads Y (the slot GNN and BiMamba run), one kept from the warm-up


def slot_rows(sizes: list[int], devices: list[str], work: Path, pieces: tuple[int, ...] = (1,),
              models: tuple[str, ...] = ("encoder",)) -> list[dict]:
    """One slot of each fleet size scored by ``trustbeam score`` on each device, per ``--score_pieces`` count and per
    model of :data:`SLOT_MODELS` (``head``: what training has kept in every evaluation so far; no encoder runs)."""
    from bench.fault_harness import untrained_checkpoint
    from bench.fleet_bench import measure, write_fleet
    from simulator.config import SimConfig

    checkpoints = {model: untrained_checkpoint(work / f"fleet-{model}", SimConfig(devices=500), window=32, small=False,
                                               reads_y=model == "encoder") for model in models}
    rows = []
    for size in sizes:
        events = None
        for device in devices:
            why = missing("torch cuda reference") if device == "cuda" else None
            for model, count in ((model, count) for model in models for count in pieces):
                row = {"stage": "slot", "backend": f"trustbeam score --device {device} --score_pieces {count}, {model}"}
                if why:
                    rows.append(progress({**row, "devices": size, "skipped": why}))
                    continue
                events = write_fleet(size, 1, work) if events is None else events
                result = measure(size, 1, work, checkpoints[model], device=device, model=model, pieces=count,
                                 events=events)
                rows.append(progress({**row, **result, "devices_per_s": round(size / result["total_s"])}))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 256], help="S: slots per sequence")
    parser.add_argument("--devices", type=int, nargs="+", default=[1_000_000, 1_000_000, 20_000],
                        help="devices N per S (one per --lengths)")
    parser.add_argument("--cpu-devices", type=int, default=20_000, help="the most devices a PyTorch CPU row encodes")
    parser.add_argument("--onnx-cpu-devices", type=int, default=2_000, help="the most devices onnxruntime's CPU row encodes")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS), metavar="BACKEND",
                        help=f"the encoder rows' backends, each quoted (default all: {', '.join(BACKENDS)})")
    parser.add_argument("--slot-sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--slot-devices", nargs="*", choices=["cpu", "cuda"], default=["cuda"])
    parser.add_argument("--slot-pieces", type=int, nargs="+", default=[1],
                        help="trustbeam score --score_pieces per slot row: the pieces scored on threads at once")
    parser.add_argument("--slot-models", nargs="+", choices=SLOT_MODELS, default=["encoder"],
                        help="the models a slot row scores with: a head that reads Y, or one kept from the warm-up")
    args = parser.parse_args()
    if len(args.devices) != len(args.lengths):
        parser.error(f"--devices: one per --lengths ({len(args.lengths)}), got {len(args.devices)}")
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows = encoder_rows(args.lengths, args.devices, args.cpu_devices, args.repeats, work, args.onnx_cpu_devices,
                            tuple(args.backends))
        rows += slot_rows(args.slot_sizes, args.slot_devices, work, tuple(args.slot_pieces), tuple(args.slot_models))
    emit("gpu_bench", rows, {"machine": platform.machine(), "cpus": os.cpu_count(), "torch": torch.__version__,
                             "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None})


if __name__ == "__main__":
    main()
