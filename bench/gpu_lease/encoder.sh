#!/bin/bash
# Run THERE when a lease has too little time left for check.sh (~3-4 min): the encoder's 1M-device row at S = 32
# through mamba-ssm's kernels alone (the target: 1M devices in < 3 s), after prepare.sh here:
#   device run --carry .gpu --timeout_s 250 'bash bench/gpu_lease/encoder.sh'
source "$(dirname "$0")/common.sh"
stage environment; install_wheels
stage building mamba-ssm; build_mamba; tail -1 "$OUT/mamba_build.log"
export PYTHONPATH=/tmp/mamba:$PYTHONPATH
stage "benchmark: 1M devices, S = 32, mamba-ssm"
timeout "${BENCH_S:-120}" python3 -m bench.gpu_bench --lengths 32 --devices "${DEVICES:-1000000}" --repeats 3 \
  --backends "torch cuda mamba-ssm" --slot-sizes >"$OUT/gpu_bench_1m.txt" 2>"$OUT/gpu_bench_1m.err"
stage "rc=$?"; cat "$OUT/gpu_bench_1m.err"; tail -4 "$OUT/gpu_bench_1m.txt"
