#!/bin/bash
# Run HERE (a machine with pip access) before a GPU lease: fills .gpu/ (git-ignored) with what the lent
# machine lacks, for `device run --carry .gpu 'bash bench/gpu_lease/check.sh'`.
#   bash bench/gpu_lease/prepare.sh [WHEEL]
# WHEEL: the mamba_ssm-*.whl an earlier lease built and brought back (common.sh's build_mamba leaves it in $OUT), kept
# in .gpu/built/ from then on: the next lease installs it in seconds instead of building (~2 of its 15 minutes), and
# builds again only where it does not import (another image or torch).
#  - cp312 wheels of trustbeam's dependencies that the lent image ('cuda', read 2026-11-17) does not hold
#    (it has torch 2.11+cu130, torch-geometric, pyarrow, scipy, onnx, onnxruntime, pytest; not Beam or Kafka);
#  - mamba-ssm's sdist, its setup.py restricted to the H100/H200's sm_90 (every architecture outruns a lease).
# About 43 MB, and the built wheel where there is one; the device tool carries at most 64 MiB.
set -euo pipefail
BUILT=${1:+$(realpath "$1")}  # before the cd: a path given from anywhere
cd "$(git rev-parse --show-toplevel)"
PY=${PYTHON:-.venv/bin/python}
MISSING="apache-beam==2.77.0 kafka-python==3.0.12 crc32c==2.9.post0 confluent-kafka==2.16.1 beartype fastavro fasteners
httplib2 jsonpickle objsize proto-plus pymongo dnspython pytz zstandard cryptography cffi pycparser"
PLATFORMS=""
for p in manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do PLATFORMS+=" --platform $p"; done
rm -rf .gpu/whl .gpu/src && mkdir -p .gpu/whl .gpu/src .gpu/built
if [ -n "$BUILT" ]; then
  case "${BUILT##*/}" in mamba_ssm-*.whl) rm -f .gpu/built/*.whl && cp "$BUILT" .gpu/built/ ;;
    *) echo "prepare.sh: not a mamba_ssm wheel: $BUILT" >&2; exit 2 ;; esac
fi
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLATFORMS -d .gpu/whl $MISSING
MAMBA_SKIP_CUDA_BUILD=TRUE "$PY" -m pip download -q --no-deps --no-build-isolation --no-binary=:all: -d .gpu/src \
  mamba-ssm==2.3.2.post1
tar xzf .gpu/src/mamba_ssm-2.3.2.post1.tar.gz -C .gpu/src && rm .gpu/src/mamba_ssm-2.3.2.post1.tar.gz
"$PY" - <<'PATCH'
from pathlib import Path
setup = Path(".gpu/src/mamba_ssm-2.3.2.post1/setup.py")
text = setup.read_text()
anchor = "    # HACK: The compiler flag -D_GLIBCXX_USE_CXX11_ABI"
assert text.count(anchor) == 1, "mamba-ssm's setup.py changed: restrict its architectures by hand"
only_sm90 = ("    cc_flag = [f for f in cc_flag if f != '-gencode' and not f.startswith('arch=')]"
             " + ['-gencode', 'arch=compute_90,code=sm_90']\n")
setup.write_text(text.replace(anchor, only_sm90 + anchor))
PATCH
du -sh .gpu
