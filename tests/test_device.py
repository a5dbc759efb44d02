"""``--device``: names refused by name, a missing GPU refused before any work, and the GPU path equal to the CPU's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from beam_pipeline.options import JobConfig
from exporters.onnx import OnnxModelError
from exporters.onnx.runtime import providers
from model.checkpoint import load
from model.config import SystemParams
from model.scoring import score_log
from model.stages import TorchStages, Windows, resolve_device
from tests.pipeline_fixtures import RANKING, run_tables, write_checkpoint

GPU = torch.cuda.is_available()


def test_device_names_resolve_and_a_typo_is_refused_by_name() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if GPU else "cpu")
    with pytest.raises(ValueError, match=r"--device: must be one of auto, cpu, cuda \(got 'gpu'\)"):
        resolve_device("gpu")


@pytest.mark.skipif(GPU, reason="needs a machine without a CUDA GPU")
def test_cuda_without_a_gpu_is_refused_before_any_work() -> None:
    with pytest.raises(ValueError, match="--device cuda: PyTorch sees no CUDA GPU"):
        resolve_device("cuda")


def test_the_onnx_backend_runs_where_it_is_told() -> None:
    import onnxruntime as ort

    assert providers("cpu") == ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert providers("cuda")[0] in ("TensorrtExecutionProvider", "CUDAExecutionProvider")
    else:
        with pytest.raises(OnnxModelError, match="no CUDAExecutionProvider"):
            providers("cuda")


def test_job_options_refuse_an_unknown_device(tmp_path) -> None:
    checkpoint = write_checkpoint(tmp_path / "model")
    with pytest.raises(ValueError, match="--device: must be one of"):
        JobConfig(str(checkpoint), device="tpu")
    assert JobConfig(str(checkpoint), device="cpu").device == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_a_simulated_run_scores_the_same_on_the_gpu(tmp_path) -> None:
    checkpoint = write_checkpoint(tmp_path / "model")
    events, status = run_tables()
    runs = []
    for device in ("cpu", "cuda"):
        model, index, _ = load(checkpoint)
        stages = TorchStages(model, index, device=torch.device(device))
        runs.append(list(score_log(stages, events, status, RANKING, SystemParams(), "v")))
    cpu, cuda = runs
    assert sum(len(r.scores) for r in cpu) > 100
    for a, b in zip(cpu, cuda):
        assert [(s.owner, s.collaborator) for s in a.scores] == [(s.owner, s.collaborator) for s in b.scores]
        np.testing.assert_allclose([s.t_beh for s in b.scores], [s.t_beh for s in a.scores], atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_pinned_batches_encode_what_pageable_copies_and_the_cpu_encode(tmp_path) -> None:
    """Several batches and a short last one, so each staging buffer is refilled while the other is in flight."""
    from model.status import TELEMETRY

    model, index, _ = load(write_checkpoint(tmp_path / "model"))
    rng = np.random.default_rng(0)
    n, s, d = 50, model.config.window, model.config.gnn.out_dim
    windows = Windows.dense(rng.standard_normal((n, s, d), dtype=np.float32), rng.integers(1, s + 1, n),
                            rng.random((n, s, len(TELEMETRY)), dtype=np.float32))
    cpu = TorchStages(model, index, device=torch.device("cpu")).long_term(windows)
    pinned, pageable = (TorchStages(model, index, devices_per_call=7, device=torch.device("cuda"),
                                    pinned=pinned).long_term(windows) for pinned in (True, False))
    assert pinned.shape == (n, d) and np.abs(pinned).sum(1).min() > 0  # every row written
    np.testing.assert_allclose(pinned, pageable, atol=1e-6)
    np.testing.assert_allclose(pinned, cpu, atol=1e-4)


@pytest.mark.skipif(GPU, reason="needs a machine without a CUDA GPU")
def test_training_on_cuda_without_a_gpu_is_refused_before_any_work() -> None:
    from model.train import TrainConfig, train_bm

    with pytest.raises(ValueError, match="--device cuda: PyTorch sees no CUDA GPU"):
        train_bm(None, None, TrainConfig(device="cuda"))  # refused before the history is read


def test_parallel_grid_workers_are_refused_off_the_cpu(monkeypatch) -> None:
    from model import train as training

    monkeypatch.setattr(training, "resolve_device", lambda name: torch.device("cuda"))
    with pytest.raises(ValueError, match="--workers 2: parallel grid workers run on the CPU only"):
        training.train_bm(None, None, training.TrainConfig(device="cuda", workers=2))


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_training_runs_on_the_gpu_and_its_model_predicts_like_the_cpu(tmp_path) -> None:
    from model.train import TrainConfig, predict, train_bm
    from tests.test_bm import SMALL, simulated_history
    from simulator.config import SimConfig

    history = simulated_history(SimConfig(devices=40, tasks=1200, slots=24, seed=4))[0]
    model, _, report = train_bm(history, SMALL, TrainConfig(epochs=2, patience=2, lr=1e-2, chunk_slots=4,
                                                            head_epochs=20, device="cuda"))
    assert model.device.type == "cuda" and np.isfinite(report.test_rmse)
    on_gpu, t_col = predict(model, history, report.test_slots)
    on_cpu, _ = predict(model.cpu(), history, report.test_slots)
    np.testing.assert_allclose(on_gpu, on_cpu, atol=1e-4)
    assert report.test_rmse == pytest.approx(float(np.sqrt(np.mean((on_gpu - t_col) ** 2))), abs=1e-6)


def test_encoder_batches_are_sized_by_the_gpus_free_memory() -> None:
    from model.bm import BMConfig
    from model.stages import CPU_DEVICES_PER_CALL, encoder_batch

    config = BMConfig()  # S = 32, d_inner 64, d_state 16: 4 * 32 * 64 * (2 * 16 + 8) = 327,680 bytes per device
    assert encoder_batch(config, torch.device("cpu")) == CPU_DEVICES_PER_CALL
    gpu = torch.device("cuda")
    assert encoder_batch(config, gpu, free_bytes=80 * 2**30) == int(0.5 * 80 * 2**30 // 327_680)  # 131,072
    assert encoder_batch(config.__class__(window=256), gpu, free_bytes=80 * 2**30) == 131_072 // 8  # longer S, fewer
    assert encoder_batch(config, gpu, free_bytes=0) == 256 and encoder_batch(config, gpu, free_bytes=2**50) == 1 << 20
