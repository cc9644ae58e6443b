#!/usr/bin/env bash
# Make .venv-NAME: one RL framework's client, from the package index, unmodified, beside the
# torch (and vLLM) of a given environment (tests/test_peer_NAME.py runs its driver there).
#
# Usage: bash scripts/install-peer.sh NAME PYTHON
#   e.g. bash scripts/install-peer.sh areal .venv/bin/python   (the vLLM lane's environment)
#
# NAME and what it installs (each pinned where the framework is; --no-deps: the frameworks'
# declared dependencies pull trainers, agents and CUDA stacks far over the install budget,
# while the client modules import with torch and the small packages named here):
#   areal   areal==1.0.4 and what areal.engine.sglang_remote imports beyond torch
#           (colorlog, tenacity, flask and its werkzeug/blinker/itsdangerous, torchdata,
#           hydra-core, omegaconf, antlr4 4.9.3, ray, msgpack, aiofiles, and uvloop, orjson,
#           zstandard, which PYTHON's environment has only once SGLang's install ran)
#   verl    verl==0.9.1 and what its SGLang HTTP adapter's import chain needs beyond torch
#           and SGLang's light dependencies (ray, msgpack, tensordict, pyvers, omegaconf,
#           codetiming, soundfile), plus sglang==0.5.17's source (--no-deps): the 0.5.12
#           verl pins imports CUDA-only sgl_kernel, and 0.5.23's EngineBase has abstract
#           methods verl 0.9.1 lacks. Run after scripts/install-sglang.sh has put SGLang's
#           light dependencies into PYTHON's environment (the import check needs them).
#           Where install-sglang.sh already put 0.5.17's source in .sglang/0.5.17
#           ($KVFENCE_SGLANG_HOME/0.5.17), a .pth file names that folder instead of a
#           second download.
#   trinity trinity-rft==0.6.0 and what trinity.common.models.sglang_model imports beyond
#           torch and vLLM's dependencies (ray, msgpack, omegaconf, antlr4 4.9.3); its module
#           imports vllm.entrypoints.chat_utils, which vLLM 0.32 serves as
#           vllm.renderers.chat_utils (the import check aliases it, as the driver does)
#   skyrl4  skyrl==0.4.0 (Requires-Python >=3.12) on a Python 3.12 or 3.13 (on PATH, or
#           pyenv's), not PYTHON's (3.11); its weight-sync client needs requests, and its
#           package imports cloudpathlib and pydantic; no torch, no .pth file
#
# Steps (idempotent: does nothing if .venv-NAME already imports the client module):
#   1. a venv .venv-NAME with the same base Python as PYTHON's environment (skyrl4: its
#      own Python >= 3.12, and no step 2);
#   2. a .pth file in it naming PYTHON's site-packages, so torch and vLLM import from there
#      without a second ~3.4 GB install (and PYTHON's environment is never written to);
#   3. pip install --no-deps of NAME's packages (skyrl4's few dependencies with theirs).
# Exits non-zero, leaving no .venv-NAME, if any step fails; setup.sh then only skips the test.
set -euo pipefail
cd "$(dirname "$0")/.."

[ $# -eq 2 ] || { echo "usage: bash $0 NAME PYTHON" >&2; exit 2; }
NAME="$1"
PY="$2"
# A Python >= 3.12: python3.12 or python3.13 on PATH (a pyenv shim counts only if it runs),
# else a pyenv-installed 3.12 or 3.13; empty if none.
python_312() {
    local c
    for c in python3.12 python3.13 "$(pyenv root 2>/dev/null)"/versions/3.1[23]*/bin/python; do
        if "$c" -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null; then
            "$c" -c 'import sys; print(sys.executable)'
            return
        fi
    done
}

case "$NAME" in
    areal)
        SPECS=(areal==1.0.4 colorlog tenacity flask werkzeug blinker itsdangerous torchdata
            hydra-core omegaconf antlr4-python3-runtime==4.9.3 ray msgpack aiofiles uvloop
            orjson zstandard)
        probe='import importlib.metadata as m; import areal.engine.sglang_remote
assert m.version("areal") == "1.0.4"'
        ;;
    verl)
        SPECS=(verl==0.9.1 sglang==0.5.17 ray msgpack tensordict pyvers omegaconf codetiming
            soundfile)
        SOURCE="${KVFENCE_SGLANG_HOME:-.sglang}/0.5.17"
        if [ -d "$SOURCE/sglang" ] && [ -d "$SOURCE/sglang-0.5.17.dist-info" ]; then
            SHARED=$(cd "$SOURCE" && pwd)  # install-sglang.sh's copy: no second download
            SPECS=(verl==0.9.1 ray msgpack tensordict pyvers omegaconf codetiming soundfile)
        fi
        probe='import importlib.metadata as m, importlib.util as u
spec = u.spec_from_file_location("stubs", "adapters/sglang_stubs.py")
stubs = u.module_from_spec(spec); spec.loader.exec_module(stubs)
stubs.install_torchvision_stub(); stubs.tolerate_config_reregistration()
import verl.workers.rollout.sglang_rollout.http_server_engine
assert m.version("verl") == "0.9.1" and m.version("sglang") == "0.5.17"'
        ;;
    trinity)
        SPECS=(trinity-rft==0.6.0 ray msgpack omegaconf antlr4-python3-runtime==4.9.3)
        probe='import importlib, importlib.metadata as m, sys
sys.modules["vllm.entrypoints.chat_utils"] = importlib.import_module("vllm.renderers.chat_utils")
import trinity.common.models.sglang_model
assert m.version("trinity-rft") == "0.6.0"'
        ;;
    skyrl4)
        SPECS=(skyrl==0.4.0)
        DEPS=(requests cloudpathlib pydantic)
        probe='import importlib.metadata as m
from skyrl.backends.skyrl_train.weight_sync.control_plane import SkyrlWeightSyncClient
assert m.version("skyrl") == "0.4.0"'
        BASE=$(python_312)
        ;;
    *)
        echo "install-peer: unknown framework $NAME (one of: areal, verl, skyrl4, trinity)" >&2
        exit 2
        ;;
esac
VENV=".venv-$NAME"

die() {
    rm -rf "$VENV"
    echo "install-peer: ERROR: $*" >&2
    exit 1
}

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$probe" 2>/dev/null; then
    echo "install-peer: $VENV already has $NAME's client"
    exit 0
fi
if [ -n "${BASE+set}" ]; then  # its own Python: nothing shared with PYTHON's environment
    [ -n "$BASE" ] || die "no Python 3.12 or 3.13 (on PATH or pyenv's)"
    rm -rf "$VENV"
    "$BASE" -m venv "$VENV" || die "could not create $VENV with $BASE"
else
    "$PY" -c 'import torch' || die "$PY cannot import torch"
    base=$("$PY" -c 'import sys; print(sys._base_executable)')
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf "$VENV"
    "$base" -m venv "$VENV" || die "could not create $VENV with $base"
    own=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$site" > "$own/kvfence-vllm-lane.pth"
    if [ -n "${SHARED+set}" ]; then
        echo "$SHARED" > "$own/kvfence-sglang.pth"
    fi
fi
"$VENV/bin/python" -m pip install -q --no-deps "${SPECS[@]}" \
    || die "pip could not install ${SPECS[*]}"
if [ -n "${DEPS+set}" ]; then
    # (pip warns that the --no-deps package's declared set is not installed: by design)
    "$VENV/bin/python" -m pip install -q "${DEPS[@]}" || die "pip could not install ${DEPS[*]}"
fi
"$VENV/bin/python" -c "$probe" || die "$VENV cannot import $NAME's client"
echo "install-peer: $VENV has ${SPECS[0]}"
