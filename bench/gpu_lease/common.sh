#!/bin/bash
# Sourced THERE by check.sh and encoder.sh: the repository root as the working directory, $OUT, `stage` (a line with
# the seconds since the start), `install_wheels` (the wheels prepare.sh fetched, into /tmp/site, on PYTHONPATH) and
# `build_mamba` (mamba-ssm from its sm_90 sdist into /tmp/mamba, ~90-140 s on 16 cores; its log and rc in
# $OUT/mamba_build.log).
export PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-/tmp/gpu-check}; mkdir -p "$OUT"
T0=$(date +%s); stage() { echo "== $(( $(date +%s) - T0 )) s: $*"; }
install_wheels() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .gpu/whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
}
build_mamba() {
  (cd .gpu/src/mamba_ssm-2.3.2.post1 && MAMBA_FORCE_BUILD=TRUE MAX_JOBS=16 timeout 300 python3 -m pip install \
    --no-build-isolation --no-deps --no-index --upgrade --target /tmp/mamba . >"$OUT/mamba_build.log" 2>&1;
    echo "rc=$?" >>"$OUT/mamba_build.log")
}
