#!/bin/bash
# Run THERE when a lease has too little time left for check.sh (~5-8 min): the `gpu`-marked tests (while mamba-ssm
# builds, then with it), the encoder's 1M-device row at S = 32 through mamba-ssm's kernels with inputs through
# pinned staging buffers and straight from pageable memory, side by side (the target: 1M devices in < 3 s), then
# a 1M-device slot scored on cuda (the target: < 30 s), after prepare.sh here:
#   device run --carry .gpu --timeout_s 560 'bash bench/gpu_lease/encoder.sh'
# BENCH_S (default 150 s) bounds the encoder rows, SLOT_S (default 200 s) the slot rows (a 1M-device slot took 66 s
# with --score_pieces 16 and 87 s with 1 on an H100, stop 47, with a head that reads Y); SLOT_PIECES (default "16 1")
# their pieces; SLOT_MODELS (default "head encoder") their models, the head kept from the warm-up first (what training
# has kept in every evaluation: no slot GNN, no BiMamba), then one that reads Y; SLOT_ON (default cuda) the devices that
# score it ("cuda cpu": the same slot on the machine's 16 cores too, side by side).
source "$(dirname "$0")/common.sh"
stage environment; install_wheels
build_mamba &
BUILD=$!
stage "gpu tests with the reference scan, while mamba-ssm builds"
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" --timeout=140 -m gpu -rA \
  tests/test_device.py tests/test_scan.py 2>&1 | tee "$OUT/tests.log" | tail -8
stage waiting for mamba-ssm; wait $BUILD; tail -1 "$OUT/mamba_build.log"
export PYTHONPATH=/tmp/mamba:$PYTHONPATH
stage gpu tests with mamba-ssm
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" --timeout=140 -m gpu -rA \
  tests/test_device.py tests/test_scan.py 2>&1 | tee -a "$OUT/tests.log" | tail -8
stage "benchmark: ${DEVICES:-1000000} devices, S = 32, mamba-ssm, pinned and pageable copies"
timeout "${BENCH_S:-150}" python3 -m bench.gpu_bench --lengths 32 --devices "${DEVICES:-1000000}" --repeats 3 \
  --backends "torch cuda mamba-ssm" "torch cuda mamba-ssm pageable" --slot-sizes \
  >"$OUT/gpu_bench_1m.txt" 2>"$OUT/gpu_bench_1m.err"
stage "rc=$?"; cat "$OUT/gpu_bench_1m.err"; tail -5 "$OUT/gpu_bench_1m.txt"
stage "benchmark: one slot of a ${SLOT_DEVICES:-1000000}-device fleet, trustbeam score --device ${SLOT_ON:-cuda}"
# shellcheck disable=SC2086
timeout "${SLOT_S:-200}" python3 -m bench.gpu_bench --lengths 32 --devices 512 --repeats 1 \
  --backends "torch cuda mamba-ssm" --slot-sizes "${SLOT_DEVICES:-1000000}" --slot-devices ${SLOT_ON:-cuda} \
  --slot-pieces ${SLOT_PIECES:-16 1} --slot-models ${SLOT_MODELS:-head encoder} >"$OUT/gpu_bench_slot.txt" \
  2>"$OUT/gpu_bench_slot.err"
stage "rc=$?"; tail -4 "$OUT/gpu_bench_slot.err"
stage done
