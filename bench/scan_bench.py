"""Selective scan on the CPU: trustbeam's C++ backend against a plain PyTorch loop and mambapy's pscan.

Batch 512, d_model 32 (d_inner 64), d_state 16, L in {16, 64, 256}; forward
(no grad) and forward+backward; median wall time; peak RSS growth of a process
that runs only that case. The "plain loop" and "pscan" rows are mambapy 1.2.0's
``selective_scan_seq`` and ``selective_scan`` (the peers of the issue), called
on the same tensors. Run: ``python -m bench.scan_bench [--lengths 16 64 256]``
(needs the ``bench`` extra for mambapy).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

from bench.report import emit

BATCH, D_MODEL, EXPAND, D_STATE = 512, 32, 2, 16
METHODS = ("plain loop (mambapy seq)", "pscan (mambapy)", "trustbeam cpu")


def _case(method: str, length: int, mode: str, repeats: int) -> dict:
    import torch

    from model.scan import selective_scan

    torch.manual_seed(0)
    d_inner = EXPAND * D_MODEL
    x = torch.randn(BATCH, length, d_inner)  # mambapy layout (B, L, ED)
    delta = torch.nn.functional.softplus(torch.randn(BATCH, length, d_inner))
    A = -torch.rand(d_inner, D_STATE) * 4
    B, C = torch.randn(BATCH, length, D_STATE), torch.randn(BATCH, length, D_STATE)
    D = torch.randn(d_inner)
    leaves = [x, delta, A, B, C, D]
    if mode == "fwd+bwd":
        leaves = [t.requires_grad_() for t in leaves]

    if method == "trustbeam cpu":
        def run() -> torch.Tensor:  # our layout: (B, ED, L) and (B, N, L)
            return selective_scan(x.transpose(1, 2), delta.transpose(1, 2), A, B.transpose(1, 2),
                                  C.transpose(1, 2), D, backend="cpu")
    else:
        from mambapy.mamba import MambaBlock, MambaConfig

        block = MambaBlock(MambaConfig(d_model=D_MODEL, n_layers=1, d_state=D_STATE, expand_factor=EXPAND))
        scan = block.selective_scan_seq if method.startswith("plain") else block.selective_scan

        def run() -> torch.Tensor:
            return scan(x, delta, A, B, C, D)

    def once() -> None:
        if mode == "fwd":
            with torch.no_grad():
                run()
        else:
            run().sum().backward()

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    once()  # warm-up (and the one-time extension load)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        once()
        times.append(time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"ms": round(statistics.median(times) * 1000, 1), "peak_rss_growth_mb": round((peak - base) / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if importlib.util.find_spec("mambapy") is None:
        parser.error("the peers' rows need mambapy: pip install -e '.[bench]'")
    if args.case:
        print(json.dumps(_case(**json.loads(args.case))))
        return
    rows = []
    for length in args.lengths:
        for mode in ("fwd", "fwd+bwd"):
            row: dict = {"L": length, "mode": mode}
            for method in METHODS:
                case = {"method": method, "length": length, "mode": mode, "repeats": args.repeats}
                child = subprocess.run([sys.executable, "-m", "bench.scan_bench", "--case", json.dumps(case)],
                                       capture_output=True, text=True, check=True)
                result = json.loads(child.stdout.strip().splitlines()[-1])
                row[f"{method} ms"] = result["ms"]
                row[f"{method} MB"] = result["peak_rss_growth_mb"]
            ours = row["trustbeam cpu ms"]
            row["x vs loop"] = round(row[f"{METHODS[0]} ms"] / ours, 2)
            row["x vs pscan"] = round(row[f"{METHODS[1]} ms"] / ours, 2)
            rows.append(row)
    import torch

    emit("selective_scan_cpu", rows, {"batch": BATCH, "d_model": D_MODEL, "d_inner": EXPAND * D_MODEL,
                                      "d_state": D_STATE, "torch": torch.__version__,
                                      "threads": torch.get_num_threads(), "cores": os.cpu_count(),
                                      "python": platform.python_version()})


if __name__ == "__main__":
    main()
