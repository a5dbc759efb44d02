"""Selective scan (Mamba's S6 recurrence) with switchable backends.

Shapes follow mamba-ssm's ``selective_scan_fn``:

* ``u``: (batch, dim, L) input; ``delta``: (batch, dim, L) step sizes (before bias/softplus)
* ``A``: (dim, N) state matrix (negative reals); ``B``, ``C``: (batch, N, L) input-dependent
* ``D``: (dim,) skip; ``z``: (batch, dim, L) gate; ``delta_bias``: (dim,)
* returns ``y``: (batch, dim, L), and with ``return_last_state`` also the state (batch, dim, N)

    delta <- softplus(delta + delta_bias)            (when delta_softplus)
    h_t = exp(delta_t A) h_{t-1} + delta_t B_t u_t
    y_t = C_t . h_t + D u_t,  then y_t * silu(z_t)

Backends: ``reference`` (sequential loop, any dtype incl. float64, ground truth
of the tests), ``cpu`` (a C++ extension compiled on first use, one pass per
(batch, channel) with hand-written backward; about 2-8x faster than the loop
here, see ``bench/scan_bench.py``), ``cuda`` (mamba-ssm's kernels, when a GPU
and the ``gpu`` extra are present: outside autograd its forward kernel alone, without
importing its package; in training its autograd function). ``auto`` picks cuda for CUDA tensors when
available, else cpu, else reference; while tracing (an ONNX export) it picks the
reference loop, the only one a tracer can see through.
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Literal, Sequence

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

Backend = Literal["auto", "reference", "cpu", "cuda"]
# bindings.cpp alone includes PyTorch's Python headers (most of a build's time), so the three compile side by side
_SOURCES = tuple(Path(__file__).parent / "csrc" / name
                 for name in ("bindings.cpp", "selective_scan.cpp", "pair_mlp.cpp"))


def selective_scan(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    backend: Backend = "auto",
) -> Any:
    """The selective scan by the chosen backend; see the module docstring for shapes."""
    chosen = resolve_backend(backend, u)
    if chosen == "cuda" and not torch.is_grad_enabled():
        return _cuda_inference(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    if chosen == "cuda":
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn

        return selective_scan_fn(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)
    if delta_bias is not None:
        delta = delta + delta_bias[..., None]
    if delta_softplus:
        delta = F.softplus(delta)
    if chosen == "cpu":
        y, last = _CpuScan.apply(u, delta, A, B, C)
    else:
        y, last = _reference_core(u, delta, A, B, C)
    if D is not None:
        y = y + u * D[..., None]
    if z is not None:
        y = y * F.silu(z)
    return (y, last) if return_last_state else y


def _cuda_inference(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                    D: torch.Tensor | None, z: torch.Tensor | None, delta_bias: torch.Tensor | None,
                    delta_softplus: bool, return_last_state: bool) -> Any:
    """mamba-ssm's forward kernel (its compiled ``selective_scan_cuda``) called as its ``SelectiveScanFn.forward``
    calls it, outside autograd. The scorer needs no backward, and importing ``mamba_ssm`` runs its package's
    ``__init__``, which loads its language models and with them transformers (4.8 s of a 1M-device scoring
    process under cProfile on an H200, inside its first slot's frame)."""
    import selective_scan_cuda

    u, delta, B, C = (x if x.stride(-1) == 1 else x.contiguous() for x in (u, delta, B, C))
    z = z if z is None or z.stride(-1) == 1 else z.contiguous()
    D = None if D is None else D.contiguous()
    out, states, *gated = selective_scan_cuda.fwd(u, delta, A, B[:, None] if B.dim() == 3 else B,
                                                  C[:, None] if C.dim() == 3 else C, D, z, delta_bias, delta_softplus)
    y = out if z is None else gated[0]  # (batch, dim, L)
    return (y, states[:, :, -1, 1::2]) if return_last_state else y  # the last state: (batch, dim, N)


def fused_inference(x: torch.Tensor, backend: Backend) -> bool:
    """Whether an inference pass over ``x`` runs a fused C++ kernel of :func:`cpu_extension` (a Mamba block's
    :func:`fused_inner`, the context head's networks' ``pair_mlp``): on the CPU backend, outside autograd (inference
    mode or ``no_grad``) and outside tracing."""
    return not torch.is_grad_enabled() and not torch.jit.is_tracing() and x.dtype in (torch.float32, torch.float64) \
        and backend in ("auto", "cpu") and resolve_backend(backend, x) == "cpu"


def fused_inner(xz: torch.Tensor, lengths: torch.Tensor, conv_w: torch.Tensor, conv_b: torch.Tensor,
                x_proj: torch.Tensor, dt_proj: torch.Tensor, dt_bias: torch.Tensor, A: torch.Tensor,
                D: torch.Tensor) -> torch.Tensor:
    """A Mamba block between its projections, for ``dirs`` directions (1, or 2 for a BiMamba layer), fused in C++
    (inference only; ``model/csrc/selective_scan.cpp``): depthwise causal conv + SiLU, the x projection, softplus
    step sizes, the selective scan, the D skip and the SiLU(z) gate.

    xz: (batch, L, 2 dim dirs) the in_proj outputs of every direction side by side; lengths: (batch,) int64 valid
    positions per sequence (direction 1 scans each valid prefix reversed; padding comes out zero). Per direction,
    stacked on a leading ``dirs`` axis: conv_w (dim, d_conv), conv_b (dim), x_proj (rank + 2N, dim), dt_proj
    (dim, rank), dt_bias (dim), A (dim, N) (negative), D (dim). Returns y: (batch, L, dim dirs), each direction's
    gated scan output at its positions, ready for out_proj.
    """
    return cpu_extension().inner_forward(xz, lengths, conv_w, conv_b, x_proj, dt_proj, dt_bias, A, D)


def selective_scan_ref(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                       D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                       delta_bias: torch.Tensor | None = None, delta_softplus: bool = False,
                       return_last_state: bool = False) -> Any:
    """The sequential reference (ground truth); same contract as :func:`selective_scan`."""
    return selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state, "reference")


def _reference_core(u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    batch, dim, length = u.shape
    decay = torch.exp(delta[..., None] * A[:, None, :])  # (batch, dim, L, N)
    drive = (delta * u)[..., None] * B.transpose(1, 2)[:, None]  # (batch, dim, L, N)
    h = u.new_zeros(batch, dim, A.shape[1])  # (batch, dim, N)
    ys = []
    for t in range(length):
        h = decay[:, :, t] * h + drive[:, :, t]
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, :, t]))
    return torch.stack(ys, dim=-1), h  # (batch, dim, L), (batch, dim, N)


def resolve_backend(backend: Backend, u: torch.Tensor) -> str:
    if backend == "auto" and torch.jit.is_tracing():
        return "reference"  # an ONNX export traces the loop; compiled kernels are opaque to it
    if backend == "auto":
        if u.is_cuda and cuda_kernels_available():
            return "cuda"
        return "cpu" if not u.is_cuda and cpu_extension() is not None else "reference"
    if backend == "cuda" and not cuda_kernels_available():
        raise RuntimeError("backend 'cuda' needs a CUDA GPU and mamba-ssm (pip install -e '.[gpu]')")
    if backend == "cpu" and cpu_extension() is None:
        raise RuntimeError("backend 'cpu': the C++ extension failed to build; see the log, or use 'reference'")
    return backend


@lru_cache(maxsize=1)
def cuda_kernels_available() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        import selective_scan_cuda  # noqa: F401  (mamba-ssm's kernels, without its package: see _cuda_inference)
    except ImportError:
        return False
    return True


def scan_march() -> str:
    """The CPU the C++ scan is built for: ``TRUSTBEAM_SCAN_MARCH``, default ``native`` (this machine). Images
    that run on other machines build for a portable baseline (``x86-64-v2``, deploy/container/Dockerfile),
    so a worker on an older CPU never dies of SIGILL; each setting is its own cached build."""
    march = os.environ.get("TRUSTBEAM_SCAN_MARCH", "native")
    if not march.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"TRUSTBEAM_SCAN_MARCH: not a -march value: {march!r}")
    return march


@lru_cache(maxsize=1)
def cpu_extension() -> Any | None:
    """The compiled C++ kernels (built once per machine into torch's extension cache), or None: the scan and the fused
    Mamba block (``csrc/selective_scan.cpp``) and the head's pair networks (``csrc/pair_mlp.cpp``,
    :func:`model.head.pair_mlp`), bound in ``csrc/bindings.cpp``."""
    if os.environ.get("TRUSTBEAM_SCAN_NO_EXT"):
        return None
    try:
        march = scan_march()
        # -ffast-math lets OpenMP-simd loops call glibc's vector exp (libmvec): 2-3x faster here; inputs are
        # finite, and float64 stays within 1e-13 of the loop.
        return load_extension(f"trustbeam_selective_scan_{march.replace('-', '_')}", _SOURCES,
                              ["-O3", f"-march={march}", "-fopenmp", "-ffast-math"], ["-fopenmp"])
    except Exception as error:  # compiler missing or failing: fall back, loudly
        log.warning("selective scan C++ extension unavailable, using the reference loop: %s", error)
        return None


def load_extension(name: str, sources: Sequence[Path], cflags: list[str], ldflags: Sequence[str] = ()) -> Any:
    """Build (once per machine, into :func:`extension_build_dir`, under :func:`build_lock`) and import the C++
    extension ``name`` of ``sources``; raises what the build raises."""
    from torch.utils.cpp_extension import load

    with build_lock(extension_build_dir(name)) as build_dir:
        return load(name=name, sources=[str(path) for path in sources], build_directory=str(build_dir),
                    extra_cflags=cflags, extra_ldflags=list(ldflags), verbose=False)


def extension_build_dir(name: str) -> Path:
    """Where ``name`` is built: under ``TORCH_EXTENSIONS_DIR`` (default torch's cache), per Python and torch
    version, so an upgraded torch never loads a build made against another ABI."""
    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    tag = f"py{sys.version_info.major}{sys.version_info.minor}_torch{torch.__version__.replace('+', '_')}"
    return root / tag / name


@contextmanager
def build_lock(build_dir: Path) -> Iterator[Path]:
    """Hold an exclusive ``flock`` beside ``build_dir`` while torch builds or loads into it.

    torch's own lock is a file that a killed build leaves behind, and every later process then waits on
    it forever (seen: a suite that hung until CI's time limit). The ``flock`` dies with its holder, so
    whoever holds it knows that any torch lock file present is such a leftover, and removes it.
    """
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir.parent / f".{build_dir.name}.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if stale.exists():
            log.warning("removing %s, left by a build that was killed", stale)
            stale.unlink(missing_ok=True)
        try:
            yield build_dir
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class _CpuScan(torch.autograd.Function):
    """Autograd over the C++ forward and backward kernels (core recurrence only)."""

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                C: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ext = cpu_extension()
        args = (u.contiguous(), delta.contiguous(), A.contiguous(),
                B.transpose(1, 2).contiguous(), C.transpose(1, 2).contiguous())  # B, C -> (batch, L, N)
        y, last = ext.forward(*args)
        ctx.save_for_backward(*args)
        ctx.mark_non_differentiable(last)
        return y, last

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor, _dlast: torch.Tensor) -> tuple[torch.Tensor, ...]:
        du, ddelta, dA, dB, dC = cpu_extension().backward(*ctx.saved_tensors, dy)
        return du, ddelta, dA, dB.transpose(1, 2), dC.transpose(1, 2)
