"""Simulator speed and memory: the paper's default setting, and 100k devices up to 10M tasks.

Each case runs in its own process so its peak RSS is its own. Run:
``python -m bench.simulator_bench [--large]`` (``--large`` adds 100k devices x 10M tasks).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.report import emit

CASES = {
    "paper default": dict(devices=500, tasks=10_000, slots=100, status_every=1),
    "100k dev x 1M tasks": dict(devices=100_000, tasks=1_000_000, slots=500, status_every=100),
    "100k dev x 10M tasks": dict(devices=100_000, tasks=10_000_000, slots=500, status_every=100),
}


def run_case(settings: dict) -> dict:
    """Child process: simulate into a temporary directory, report time, rate, peak RSS, bytes written."""
    from simulator.config import SimConfig
    from simulator.engine import Simulator
    from simulator.parquet_sink import ParquetSink

    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        summary = Simulator(SimConfig(**settings)).run([ParquetSink(out)])
        seconds = time.perf_counter() - started
        written = sum(p.stat().st_size for p in Path(out).iterdir())
    return {"events": summary.events, "status_rows": summary.status, "seconds": round(seconds, 3),
            "events_per_s": int(summary.events / seconds),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "parquet_mb": round(written / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--large", action="store_true", help="include 100k devices x 10M tasks")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))))
        return
    names = [n for n in CASES if args.large or "10M" not in n]
    rows = []
    for name in names:
        child = subprocess.run([sys.executable, "-m", "bench.simulator_bench", "--case", json.dumps(CASES[name])],
                               capture_output=True, text=True, check=True)
        rows.append({"case": name, **CASES[name], **json.loads(child.stdout.strip().splitlines()[-1])})
    emit("simulator", rows, {"python": platform.python_version(), "cores": os.cpu_count()})


if __name__ == "__main__":
    main()
