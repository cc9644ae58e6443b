#!/usr/bin/env bash
# kvfence's first command: install everything into .venv, then run the main job.
#
#   bash scripts/setup.sh
#
# 1. .venv with kvfence (editable) and its dev tools;
# 2. the main job, in the background from here on: the pass matrix (both reference systems
#    and every correct design of adapters/designs.py PASS, and the product explorer finds
#    nothing on each to depth 3, 2 on two endpoints: --designs-explored) at the ci budget,
#    and the kill matrix (every mutant killed by its rule), from one `kvfence mutants` on
#    every core, with the four allowance designs at ten times the ci budget, those runs
#    first (`--designs-times 10 --designs-times-only`; with KVFENCE_DESIGNS_TIMES=N, every
#    design at N times the budget); its output is printed when it ends;
# 3. meanwhile the engines and the peers' clients install: vLLM on CPU
#    (scripts/install-vllm.sh; skip with KVFENCE_SKIP_VLLM=1), .venv-trl, TRL's client
#    beside that vLLM, for tests/test_peer_trl.py (scripts/install-trl.sh), and the other
#    frameworks' clients, .venv-NAME for tests/test_peer_NAME.py (scripts/install-peer.sh;
#    both skipped with KVFENCE_SKIP_VLLM=1 or KVFENCE_SKIP_PEER=1); SGLang 0.5.23's
#    scheduler on CPU (scripts/install-sglang.sh into .sglang/0.5.23, ~2 min, after vLLM's
#    torch), then 0.5.17 and 0.5.22 beside it, source only, for the version table's tests
#    (KVFENCE_SGLANG_VERSIONS), then .venv-verl, verl's SGLang client, for
#    tests/test_peer_verl.py (scripts/install-peer.sh verl); skip with KVFENCE_SKIP_SGLANG=1;
# 4. once the main job has ended, the live checks: vLLM's reference client PASSES, a client
#    that never flushes FAILS with NoStalePrefixReuse (scripts/check-vllm.sh; its vllm-lora
#    and vllm-rl checks only with KVFENCE_VLLM_LORA=1 / KVFENCE_VLLM_RL=1 here: the suite
#    checks vllm-rl itself, tests/vllm/test_vllm_engine.py); SGLang 0.5.23 FAILS
#    ExactLaneGuardFlushes (scripts/check-sglang.sh).
# Results (verdict tables, JUnit XML, JSON, counterexamples) land in kvfence-results/.
# Exits non-zero if any verdict is not the expected one.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q -e '.[dev]'
echo "setup: kvfence installed in .venv"

# The shared fuzz database test (tests/test_fuzz_database.py) starts a real redis-server:
# installed from the system packages where apt-get may run (as root, at most 3 min, the
# package lists fetched first: a fresh machine has none), else
# left out, and that test skips saying why. Skip with KVFENCE_SKIP_REDIS=1.
if [ "${KVFENCE_SKIP_REDIS:-0}" != 1 ] && ! command -v redis-server >/dev/null; then
    if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ] \
        && timeout 180 sh -c 'apt-get update -q && apt-get install -y -q redis-server' \
            >/dev/null 2>&1; then
        echo "setup: redis-server installed (tests/test_fuzz_database.py)"
    else
        echo "setup: redis-server not installed: the Redis fuzz-database test will skip"
    fi
fi

# Peer check (tests/test_peer.py): SkyRL's HTTP weight-sync client, from the package index,
# unmodified, in its own .venv-peer (~45 s). --no-deps: its full dependency set pulls torch
# through peft; the client module needs only aiohttp and pydantic (docs/clients.md).
# Skip with KVFENCE_SKIP_PEER=1; a failed install only skips the peer test.
if [ "${KVFENCE_SKIP_PEER:-0}" != 1 ] && [ ! -x .venv-peer/bin/python ]; then
    if "$PYTHON" -m venv .venv-peer \
        && .venv-peer/bin/python -m pip install -q --no-deps skyrl==0.3.0 \
        && .venv-peer/bin/python -m pip install -q aiohttp pydantic; then
        echo "setup: SkyRL 0.3.0's client installed in .venv-peer (tests/test_peer.py)"
    else
        rm -rf .venv-peer
        echo "setup: could not install SkyRL into .venv-peer: tests/test_peer.py will skip"
    fi
fi

mkdir -p kvfence-results
# The pass matrix at ten times the ci budget: the four allowance designs of docs/spec.md
# (adapters/designs.py ALLOWANCES; tests/test_designs_budget.py reads them), about 15 min
# of CPU, most of it while the engines below install; with KVFENCE_DESIGNS_TIMES=N, every
# design at N times (10: about an hour of CPU more; not in CI: docs/budget.md)
read -ra allowances < <(.venv/bin/python -c \
    'from kvfence.adapters.designs import ALLOWANCES; print(*ALLOWANCES)')
times=(--designs-times 10 --designs-times-only "${allowances[@]}")
[ -n "${KVFENCE_DESIGNS_TIMES:-}" ] && times=(--designs-times "$KVFENCE_DESIGNS_TIMES")
# The main job computes while the engines and peers below download and install (network
# and disk, mostly): its output goes to kvfence-results/main-job.log and is printed, and
# its exit code kept, once they are in; the live engine checks run after it, on idle cores.
echo "setup: main job started (kvfence mutants; its output: kvfence-results/main-job.log)"
.venv/bin/kvfence mutants --designs-explored "${times[@]}" --out kvfence-results \
    --junit kvfence-results/matrices.xml --json kvfence-results/matrices.json \
    >kvfence-results/main-job.log 2>&1 &
main_job=$!
trap 'kill "$main_job" 2>/dev/null || true' EXIT  # setup stopped: the main job stops too

if [ "${KVFENCE_SKIP_VLLM:-0}" = 1 ]; then
    echo "setup: KVFENCE_SKIP_VLLM=1: not installing or checking vLLM"
else
    bash scripts/install-vllm.sh .venv/bin/python
    # Peer check (tests/test_peer_trl.py): TRL 1.16.0's VLLMClient, unmodified, in .venv-trl
    # beside this torch and vLLM (scripts/install-trl.sh, ~70 s). Skip with
    # KVFENCE_SKIP_PEER=1; a failed install only skips the test.
    if [ "${KVFENCE_SKIP_PEER:-0}" != 1 ]; then
        if bash scripts/install-trl.sh .venv/bin/python; then
            echo "setup: TRL 1.16.0's client installed in .venv-trl (tests/test_peer_trl.py)"
        else
            echo "setup: could not install TRL into .venv-trl: tests/test_peer_trl.py will skip"
        fi
        # The other frameworks' clients, each in .venv-NAME (scripts/install-peer.sh):
        # AReaL beside the same torch (~40 s), SkyRL 0.4.0 on a Python >= 3.12 (~20 s),
        # Trinity-RFT beside the same torch and vLLM (~75 s, most of it ray's wheel and the
        # import check). A failed install only skips its test.
        for peer in areal skyrl4 trinity; do
            if bash scripts/install-peer.sh "$peer" .venv/bin/python; then
                echo "setup: $peer's client installed in .venv-$peer (tests/test_peer_$peer.py)"
            else
                echo "setup: could not install $peer: tests/test_peer_$peer.py will skip"
            fi
        done
    fi
fi

if [ "${KVFENCE_SKIP_SGLANG:-0}" = 1 ]; then
    echo "setup: KVFENCE_SKIP_SGLANG=1: not installing or checking SGLang"
else
    bash scripts/install-sglang.sh 0.5.23 .venv/bin/python  # checked below
    # The other versions of docs/engines.md's table (tests/sglang/test_sglang_versions.py:
    # 0.5.17, the base most forks sit on, and 0.5.22), source only, ~30 s each; a failed
    # install only skips those tests, naming the install command.
    for v in ${KVFENCE_SGLANG_VERSIONS:-0.5.17 0.5.22}; do
        bash scripts/install-sglang.sh "$v" .venv/bin/python ||
            echo "setup: could not install SGLang $v: its version tests will skip"
    done
    # Peer check (tests/test_peer_verl.py): verl 0.9.1's SGLang HTTP adapter in .venv-verl
    # beside the vLLM lane's torch and SGLang's light dependencies, now installed, naming
    # the .sglang/0.5.17 just installed (scripts/install-peer.sh verl, ~70 s). A failed
    # install only skips the test.
    if [ "${KVFENCE_SKIP_PEER:-0}" != 1 ] && [ "${KVFENCE_SKIP_VLLM:-0}" != 1 ]; then
        if bash scripts/install-peer.sh verl .venv/bin/python; then
            echo "setup: verl's client installed in .venv-verl (tests/test_peer_verl.py)"
        else
            echo "setup: could not install verl: tests/test_peer_verl.py will skip"
        fi
    fi
fi

main=0
wait "$main_job" || main=$?
trap - EXIT
cat kvfence-results/main-job.log
if [ "$main" -ne 0 ]; then
    echo "setup: the main job exited $main (kvfence-results/main-job.log)" >&2
    exit "$main"
fi

if [ "${KVFENCE_SKIP_VLLM:-0}" != 1 ]; then
    KVFENCE_VLLM_LORA=${KVFENCE_VLLM_LORA:-0} KVFENCE_VLLM_RL=${KVFENCE_VLLM_RL:-0} \
        bash scripts/check-vllm.sh .venv/bin/python
fi
if [ "${KVFENCE_SKIP_SGLANG:-0}" != 1 ]; then
    bash scripts/check-sglang.sh .venv/bin/python 0.5.23
fi
