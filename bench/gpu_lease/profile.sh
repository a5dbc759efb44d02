#!/bin/bash
# Run THERE, after prepare.sh here: one slot of a ${SLOT_DEVICES:-1000000}-device fleet (bench.fleet_bench's) scored by
# `trustbeam score --device cuda` under cProfile, so the stages that run on the main thread (statuses, slot part,
# frame, publishing, JSON) show where their time goes. The slot's pieces run on threads: Python 3.12's cProfile (the
# lent image's) sees them too, their times overlapping, so read a function that runs in the pieces as a share.
#   device run --carry .gpu --timeout_s 400 'bash bench/gpu_lease/profile.sh'
# Writes $OUT/score.json (the command's own summary), $OUT/profile.txt (cumulative and own time, this repository's
# functions first) and $OUT/score.prof.
source "$(dirname "$0")/common.sh"; export OUT
stage environment; install_wheels
# the wheels go in uncompiled (--no-compile): compiled here, or the profile shows the first import compiling Beam's
# modules (~6 s), which an installed job never pays
python3 -m compileall -q -j 0 /tmp/site beam_pipeline bench exporters model schemas simulator trustbeam >/dev/null
build_mamba &
BUILD=$!
stage "fleet and model, while mamba-ssm builds"
python3 - <<'PY'
from pathlib import Path
from bench.fault_harness import untrained_checkpoint
from bench.fleet_bench import write_fleet
from simulator.config import SimConfig
import os
work = Path("/tmp/fleet"); work.mkdir(exist_ok=True)
devices = int(os.environ.get("SLOT_DEVICES", 1_000_000))
print("events", write_fleet(devices, 1, work))
untrained_checkpoint(work / "model", SimConfig(devices=500), window=32, small=False, reads_y=os.environ.get("HEAD") is None)
PY
stage waiting for mamba-ssm; wait $BUILD; tail -1 "$OUT/mamba_build.log"
export PYTHONPATH=/tmp/mamba:$PYTHONPATH
N=${SLOT_DEVICES:-1000000}
stage "trustbeam score under cProfile, $N devices, ${PIECES:-16} pieces"
timeout "${SLOT_S:-240}" python3 -m cProfile -o "$OUT/score.prof" -m trustbeam.cli score --events "/tmp/fleet/events-$N.parquet" \
  --status "/tmp/fleet/status-$N.parquet" --out /tmp/fleet/out --checkpoint=/tmp/fleet/model --device=cuda \
  --score_pieces="${PIECES:-16}" >"$OUT/score.json" 2>"$OUT/score.err"
stage "rc=$?"; cat "$OUT/score.json"
python3 - >"$OUT/profile.txt" <<'PY'
import os, pstats, re
mine = re.escape(os.getcwd()) + r"/(model|schemas|exporters|beam_pipeline|trustbeam)/"
stats = pstats.Stats(os.environ["OUT"] + "/score.prof")
stats.sort_stats("cumulative").print_stats(mine, 60)
stats.sort_stats("tottime").print_stats(40)
PY
stage done
