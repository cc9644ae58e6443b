#!/usr/bin/env bash
# Make .venv-trl: TRL's vLLM client (trl 1.16.0), from the package index, unmodified, beside
# the torch and vLLM of a given environment (tests/test_peer_trl.py runs its driver there).
#
# Usage: bash scripts/install-trl.sh PYTHON
#   e.g. bash scripts/install-trl.sh .venv/bin/python   (the vLLM lane's environment)
#
# Steps (idempotent: does nothing if .venv-trl already imports trl's client module):
#   1. a venv .venv-trl with the same base Python as PYTHON's environment;
#   2. a .pth file in it naming PYTHON's site-packages, so torch and vLLM import from there
#      without a second ~3.4 GB install (and PYTHON's environment is never written to);
#   3. pip install --no-deps trl==1.16.0 accelerate (TRL's full dependency set pulls
#      datasets and pandas for its trainers; the client module needs torch, vLLM, requests
#      and accelerate alone, docs/clients.md).
# Exits non-zero, leaving no .venv-trl, if any step fails; setup.sh then only skips the test.
set -euo pipefail
cd "$(dirname "$0")/.."

TRL_SPEC="trl==1.16.0"

die() {
    rm -rf .venv-trl
    echo "install-trl: ERROR: $*" >&2
    exit 1
}

[ $# -eq 1 ] || { echo "usage: bash $0 PYTHON" >&2; exit 2; }
PY="$1"
probe='import importlib.metadata as m, importlib.util as u; import vllm, torch
assert m.version("trl") == "1.16.0" and u.find_spec("accelerate")'
if [ -x .venv-trl/bin/python ] && .venv-trl/bin/python -c "$probe" 2>/dev/null; then
    echo "install-trl: .venv-trl already has trl 1.16.0 beside torch and vLLM"
    exit 0
fi
"$PY" -c 'import vllm, torch' || die "$PY cannot import vllm and torch"
base=$("$PY" -c 'import sys; print(sys._base_executable)')
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf .venv-trl
"$base" -m venv .venv-trl || die "could not create .venv-trl with $base"
own=$(.venv-trl/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" > "$own/kvfence-vllm-lane.pth"
.venv-trl/bin/python -m pip install -q --no-deps "$TRL_SPEC" accelerate \
    || die "pip could not install $TRL_SPEC accelerate"
.venv-trl/bin/python -c "$probe" || die ".venv-trl cannot import trl, torch and vLLM"
echo "install-trl: .venv-trl has $TRL_SPEC and accelerate beside $PY's torch and vLLM"
