#!/bin/bash
# Sourced THERE by check.sh, encoder.sh and profile.sh: the repository root as the working directory, $OUT, `stage`
# (a line with the seconds since the start), `install_wheels` (the wheels prepare.sh fetched, into /tmp/site, on
# PYTHONPATH) and `build_mamba` (mamba-ssm into /tmp/mamba: from the wheel an earlier lease built, when prepare.sh
# carried one and it imports, in seconds; else from its sm_90 sdist, ~90-140 s on 16 cores, leaving the wheel it
# built in $OUT for prepare.sh to carry next time; its log and rc in $OUT/mamba_build.log).
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
  local built log="$OUT/mamba_build.log"
  built=$(ls .gpu/built/mamba_ssm-*.whl 2>/dev/null | head -1)
  if [ -n "$built" ] && python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/mamba "$built" >"$log" 2>&1 && PYTHONPATH=/tmp/mamba:$PYTHONPATH python3 -c "import torch
import selective_scan_cuda" >>"$log" 2>&1; then
    echo "rc=0 (installed ${built##*/}, built by an earlier lease)" >>"$log"
    return
  fi
  rm -rf /tmp/mamba /tmp/mamba-wheel
  (cd .gpu/src/mamba_ssm-2.3.2.post1 && MAMBA_FORCE_BUILD=TRUE MAX_JOBS=16 timeout 300 python3 -m pip wheel \
    --no-build-isolation --no-deps --no-index -w /tmp/mamba-wheel . >>"$log" 2>&1) &&
    python3 -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/mamba /tmp/mamba-wheel/*.whl >>"$log" 2>&1
  echo "rc=$?" >>"$log"
  # the tool brings back files of up to 16 MiB: the wheel comes back when it fits, for prepare.sh to carry
  find /tmp/mamba-wheel -name 'mamba_ssm-*.whl' -size -16M -exec cp {} "$OUT/" \; 2>/dev/null
}
