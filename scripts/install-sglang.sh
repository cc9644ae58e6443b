#!/usr/bin/env bash
# Install one SGLang release for kvfence's SGLang lane, side by side with others.
#
# Usage: bash scripts/install-sglang.sh [VERSION] [PYTHON]
#   VERSION  default 0.5.23; PYTHON  default .venv/bin/python
#
# 1. the shared CPU environment, once, into PYTHON's environment: torch 2.13.0 (the same
#    CPU wheel the vLLM lane uses) and the light packages SGLang imports at module level
#    (pinned by scripts/sglang-constraints.txt). pip may report that sglang wants other
#    versions (it pins a CUDA torch): harmless here, only its scheduler code runs;
# 2. `pip install --no-deps --target $KVFENCE_SGLANG_HOME/VERSION sglang==VERSION`
#    (default folder .sglang/VERSION, ~220 MB): each version in its own folder, so
#    `kvfence check --engine sglang@VERSION` picks one without touching the others.
# Idempotent: each step is skipped when already done. Prints progress, not pip's noise.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VERSION="${1:-0.5.23}"
PY="${2:-$ROOT/.venv/bin/python}"
HOME_DIR="${KVFENCE_SGLANG_HOME:-.sglang}"
DEST="$HOME_DIR/$VERSION"
DEPS=(numpy orjson psutil pybase64 requests triton packaging pillow starlette msgspec
    pydantic pyzmq tqdm ipython aiohttp transformers dill apache-tvm-ffi sentencepiece
    compressed-tensors gguf openai partial-json-parser setproctitle xxhash zstandard
    prometheus-client fastapi uvicorn uvloop python-multipart interegular regex einops
    xgrammar)

die() {
    echo "install-sglang: ERROR: $*" >&2
    exit 1
}
[[ "$VERSION" =~ ^[0-9]+\.[0-9]+\.[0-9]+(\.post[0-9]+)?$ ]] || die "not a version: $VERSION"
[ -x "$PY" ] || command -v "$PY" >/dev/null 2>&1 || die "python not found: $PY"
start=$(date +%s)

if "$PY" -c 'import torch, triton, msgspec, transformers, zmq, orjson, pybase64' 2>/dev/null \
    && "$PY" -c 'import torch; assert torch.__version__.startswith("2.13.0")' 2>/dev/null; then
    echo "install-sglang: shared CPU environment already in place"
else
    echo "install-sglang: installing torch 2.13.0 and SGLang's light dependencies into $PY"
    "$PY" -m pip install -q torch==2.13.0 2>&1 | grep -v "is ignored" || true
    "$PY" -m pip install -q -c "$ROOT/scripts/sglang-constraints.txt" "${DEPS[@]}" 2>&1 |
        grep -v "is ignored" || true
    "$PY" -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__' ||
        die "torch is not 2.13.0 after install"
    "$PY" -c 'import triton, msgspec, transformers, zmq' || die "a light dependency is missing"
fi

if [ -d "$DEST/sglang" ]; then
    echo "install-sglang: SGLang $VERSION already in $DEST"
else
    echo "install-sglang: installing sglang==$VERSION into $DEST"
    "$PY" -m pip install -q --no-deps --target "$DEST" "sglang==$VERSION" 2>&1 |
        grep -v "is ignored" || true
    [ -d "$DEST/sglang" ] || die "pip did not install sglang==$VERSION into $DEST"
fi
echo "install-sglang: done: SGLang $VERSION in $DEST, $(($(date +%s) - start)) s"
