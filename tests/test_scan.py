"""Selective scan backends against the sequential reference, and the reference against hand arithmetic."""

from __future__ import annotations

import math

import pytest
import torch

from model.scan import cuda_kernels_available, resolve_backend, selective_scan, selective_scan_ref

TOLERANCE = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=2e-4, atol=2e-4)}


def inputs(batch: int, dim: int, length: int, state: int, dtype: torch.dtype, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=dtype)

    return dict(u=rand(batch, dim, length), delta=rand(batch, dim, length).abs() * 0.5,  # step sizes are positive
                A=-torch.rand(dim, state, generator=g, dtype=dtype) * 4 - 0.1,
                B=rand(batch, state, length), C=rand(batch, state, length), D=rand(dim),
                z=rand(batch, dim, length), delta_bias=rand(dim) * 0.1)


def test_reference_by_hand() -> None:
    # dim = N = 1, L = 2, no softplus: h1 = d1*B1*u1, h2 = exp(d2*A)*h1 + d2*B2*u2, y = C*h + D*u
    u, delta, A, B, C, D = (torch.tensor(v, dtype=torch.float64) for v in
                            ([[[1.0, 2.0]]], [[[0.5, 0.25]]], [[-2.0]], [[[3.0, -1.0]]], [[[2.0, 4.0]]], [0.1]))
    y, last = selective_scan_ref(u, delta, A, B, C, D, return_last_state=True)
    h1 = 0.5 * 3.0 * 1.0
    h2 = math.exp(0.25 * -2.0) * h1 + 0.25 * -1.0 * 2.0
    assert y[0, 0].tolist() == pytest.approx([2.0 * h1 + 0.1, 4.0 * h2 + 0.2])
    assert last.item() == pytest.approx(h2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 7, 4), (4, 8, 33, 16), (3, 64, 64, 16)], ids=str)
@pytest.mark.parametrize("extras", ["core", "full"])
def test_cpu_backend_matches_reference(shape, dtype, extras) -> None:
    x = inputs(*shape, dtype)
    if extras == "core":
        x = {k: x[k] for k in ("u", "delta", "A", "B", "C")}
    options = dict(delta_softplus=extras == "full", return_last_state=True)
    leaves = {k: v.clone().requires_grad_() for k, v in x.items()}
    y, last = selective_scan(**leaves, **options, backend="cpu")
    ref_leaves = {k: v.clone().requires_grad_() for k, v in x.items()}
    y_ref, last_ref = selective_scan_ref(**ref_leaves, **options)
    torch.testing.assert_close(y, y_ref, **TOLERANCE[dtype])
    torch.testing.assert_close(last, last_ref, **TOLERANCE[dtype])
    weights = torch.randn_like(y)
    (y * weights).sum().backward()
    (y_ref * weights).sum().backward()
    for name in x:
        scale = max(1.0, ref_leaves[name].grad.abs().max().item())
        tol = {k: v * scale for k, v in TOLERANCE[dtype].items()}
        torch.testing.assert_close(leaves[name].grad, ref_leaves[name].grad, **tol, msg=f"grad of {name}")


def test_cpu_backward_matches_finite_differences() -> None:
    x = inputs(2, 3, 5, 2, torch.float64, seed=3)
    args = tuple(x[k].clone().requires_grad_() for k in ("u", "delta", "A", "B", "C"))
    assert torch.autograd.gradcheck(lambda *a: selective_scan(*a, backend="cpu"), args)


def test_auto_prefers_the_extension_on_cpu_and_cuda_needs_kernels() -> None:
    u = torch.zeros(1, 1, 1)
    assert resolve_backend("auto", u) == "cpu"
    if not cuda_kernels_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU and mamba-ssm"):
            resolve_backend("cuda", u)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_kernels_available(), reason="needs a CUDA GPU and mamba-ssm")
@pytest.mark.parametrize("shape", [(2, 8, 64, 16), (4, 64, 256, 16)], ids=str)
def test_cuda_kernels_match_reference(shape) -> None:
    x = inputs(*shape, torch.float32)
    y_ref = selective_scan_ref(**x, delta_softplus=True)
    y = selective_scan(**{k: v.cuda() for k, v in x.items()}, delta_softplus=True, backend="cuda")
    torch.testing.assert_close(y.cpu(), y_ref, rtol=1e-3, atol=1e-3)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_kernels_available(), reason="needs a CUDA GPU and mamba-ssm")
@pytest.mark.parametrize("gated, last", [(False, False), (True, True)])
def test_cuda_inference_without_mamba_ssms_package_equals_its_selective_scan_fn(gated, last) -> None:
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn

    x = {k: v.cuda() if gated or k != "z" else None for k, v in inputs(3, 16, 40, 8, torch.float32).items()}
    want = selective_scan_fn(**x, delta_softplus=True, return_last_state=last)
    with torch.no_grad():
        got = selective_scan(**x, delta_softplus=True, return_last_state=last, backend="cuda")
    for a, b in zip(got if last else [got], want if last else [want]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_kernels_available(), reason="needs a CUDA GPU and mamba-ssm")
def test_scanning_on_cuda_outside_autograd_loads_neither_mamba_ssms_package_nor_transformers() -> None:
    import subprocess
    import sys

    check = ("import sys, torch; from model.scan import selective_scan\n"
             "x = [torch.rand(2, 4, 9, device='cuda'), torch.rand(2, 4, 9, device='cuda'), -torch.rand(4, 3, device='cuda'),"
             " torch.randn(2, 3, 9, device='cuda'), torch.randn(2, 3, 9, device='cuda')]\n"
             "with torch.no_grad(): selective_scan(*x, backend='cuda')\n"
             "print(sorted(m for m in ('mamba_ssm', 'transformers') if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_a_lock_file_left_by_a_killed_build_is_removed_under_the_flock(tmp_path, caplog) -> None:
    """torch alone would wait forever on the lock file a killed build leaves; whoever holds the flock removes it."""
    from model.scan import build_lock

    stale = tmp_path / "ext" / "lock"
    stale.parent.mkdir()
    stale.touch()
    with build_lock(stale.parent) as build_dir:
        assert build_dir == stale.parent and not stale.exists()
    assert "left by a build that was killed" in caplog.text
    with build_lock(stale.parent):  # released: a second holder gets it, and nothing is left to remove
        pass
    assert caplog.text.count("left by a build that was killed") == 1


@pytest.mark.slow  # a second full build of the extension (about 40 s on 2 cores); `make slow-tests`
def test_a_portable_build_of_the_scan_matches_the_reference(tmp_path, monkeypatch) -> None:
    """The worker images build for x86-64-v2 (never -march=native): that build must load and agree, even where
    a killed build left torch's lock file behind (torch alone would wait on it forever)."""
    import os
    import platform
    import subprocess
    import sys

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 baselines only")
    check = ("import torch; from model.scan import cpu_extension, scan_march, selective_scan, selective_scan_ref\n"
             "assert scan_march() == 'x86-64-v2' and cpu_extension() is not None\n"
             "g = torch.Generator().manual_seed(0)\n"
             "u, dt = torch.randn(2, 4, 9, generator=g), torch.rand(2, 4, 9, generator=g)\n"
             "A, B, C = -torch.rand(4, 3, generator=g), torch.randn(2, 3, 9, generator=g), torch.randn(2, 3, 9, generator=g)\n"
             "got, want = selective_scan(u, dt, A, B, C, backend='cpu'), selective_scan_ref(u, dt, A, B, C)\n"
             "assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()\n")
    from model.scan import extension_build_dir

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    stale = extension_build_dir("trustbeam_selective_scan_x86_64_v2") / "lock"
    stale.parent.mkdir(parents=True)
    stale.touch()
    env = {**os.environ, "TRUSTBEAM_SCAN_MARCH": "x86-64-v2"}
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not stale.exists() and "left by a build that was killed" in done.stderr


def test_a_march_that_is_not_one_is_refused(monkeypatch) -> None:
    from model.scan import scan_march

    monkeypatch.setenv("TRUSTBEAM_SCAN_MARCH", "native; rm -rf /")
    with pytest.raises(ValueError, match="TRUSTBEAM_SCAN_MARCH"):
        scan_march()
