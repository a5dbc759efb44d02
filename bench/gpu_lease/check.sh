#!/bin/bash
# Run THERE, on a lent GPU machine, after prepare.sh here:
#   device run --carry .gpu --timeout_s 560 'bash bench/gpu_lease/check.sh'
# Each stage has its own time limit and writes under $OUT (7 files: the tool returns at most 8), so a stage that
# overruns still returns the others.
# Stages: wheels (~8 s), mamba-ssm's build in the background (~90-140 s on 16 cores) while the tests that need
# no mamba-ssm run (~65 s), then the `gpu`-marked tests with mamba-ssm (~20 s), then bench.gpu_bench in two
# parts (encoder rows, slot rows; rows stream to *.err as they finish; BENCH_S, default 150 s, bounds each part),
# then 3 epochs of training on the paper setting on cuda and on the cpu (TRAIN_S, default 150 s, each; ~37 s on
# 2 cores here).
source "$(dirname "$0")/common.sh"
stage environment; install_wheels
build_mamba &
BUILD=$!
stage tests without mamba-ssm
timeout 240 python3 -m pytest -q -p no:cacheprovider -o addopts="" --timeout=200 -rs \
  tests/test_device.py tests/test_gpu_bench.py tests/test_scan.py -k "not portable" 2>&1 | tee "$OUT/tests.log" | tail -8
stage waiting for mamba-ssm; wait $BUILD; tail -1 "$OUT/mamba_build.log"
export PYTHONPATH=/tmp/mamba:$PYTHONPATH
stage gpu tests with mamba-ssm
timeout 150 python3 -m pytest -q -p no:cacheprovider -o addopts="" --timeout=140 -m gpu -rA \
  tests/test_device.py tests/test_scan.py 2>&1 | tee -a "$OUT/tests.log" | tail -8
stage benchmark: encoder rows
timeout "${BENCH_S:-150}" python3 -m bench.gpu_bench --lengths 32 256 --devices 1000000 20000 --cpu-devices 20000 \
  --onnx-cpu-devices 500 --repeats 2 --slot-sizes >"$OUT/gpu_bench_encoder.txt" 2>"$OUT/gpu_bench_encoder.err"
stage "rc=$?"; tail -20 "$OUT/gpu_bench_encoder.txt"
stage benchmark: slot rows
timeout "${BENCH_S:-150}" python3 -m bench.gpu_bench --lengths 32 --devices 512 --cpu-devices 512 --repeats 1 \
  --slot-sizes 100000 --slot-devices cuda cpu >"$OUT/gpu_bench_slot.txt" 2>"$OUT/gpu_bench_slot.err"
stage "rc=$?"; tail -8 "$OUT/gpu_bench_slot.txt"
stage "training: the paper setting (trustbeam simulate's defaults), 3 epochs, on cuda then on the cpu"
python3 -m trustbeam.cli simulate --out /tmp/sim >/tmp/simulate.txt 2>&1
for device in cuda cpu; do
  started=$(date +%s)
  timeout "${TRAIN_S:-150}" python3 -m trustbeam.cli train --events /tmp/sim/events.parquet --out "/tmp/model-$device" \
    --epochs 3 --device "$device" >>"$OUT/train.txt" 2>&1
  echo "train --device $device: rc=$?, $(( $(date +%s) - started )) s"
done
stage done
