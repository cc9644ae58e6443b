#!/usr/bin/env bash
# Live check of upstream SGLang's scheduler control plane on CPU with kvfence.
#
# Usage: bash scripts/check-sglang.sh [PYTHON] [VERSION]
#                                  (defaults: .venv/bin/python, 0.5.23)
#
# 1. installs SGLang VERSION side by side (scripts/install-sglang.sh; a no-op when it is
#    already in .sglang/VERSION) and kvfence itself if that Python lacks it;
# 2. kvfence check --engine sglang@VERSION --client reference --focus ENG-001 -> expects
#    FAIL (exit 1) with ExactLaneGuardFlushes (ENG-001) among the broken rules (the search
#    goes on until ENG-001 is shown; other rules broken on the way, such as FC-004 for a
#    distributed update that fails midway, FAIL too): on an exact lane
#    (rl_on_policy_target set) an update sent with flush_cache=false succeeds and leaves the
#    old prefix matchable in the radix tree. Upstream has no such guard (0.5.17-0.5.23).
# The verdict table is printed; results (table, JUnit XML, JSON, counterexample JSONL) go
# to kvfence-results/ (override with KVFENCE_OUT). SGLang's own log goes to a file per
# endpoint, not to this output. Takes ~1 min (~20-40 s of it: two processes import SGLang).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${1:-$ROOT/.venv/bin/python}"
VERSION="${2:-0.5.23}"
OUT="${KVFENCE_OUT:-kvfence-results}"
TIMEOUT="${KVFENCE_TIMEOUT:-300}"

die() {
    echo "check-sglang: ERROR: $*" >&2
    exit 1
}

command -v "$PY" >/dev/null 2>&1 || [ -x "$PY" ] || die "python executable not found: $PY"
bash "$ROOT/scripts/install-sglang.sh" "$VERSION" "$PY" || die "installing SGLang failed"
if ! "$PY" -c 'import kvfence.conformance.cli' >/dev/null 2>&1; then
    echo "check-sglang: installing kvfence (editable) into $PY"
    "$PY" -m pip install -q -e "$ROOT" || die "pip install -e $ROOT failed"
fi
mkdir -p "$OUT"

echo
echo "check-sglang: kvfence check --engine sglang@$VERSION --client reference --profile ci" \
    "--focus ENG-001 (expect FAIL with ENG-001, exit 1)"
rc=0
"$PY" -m kvfence.conformance.cli check --engine "sglang@$VERSION" --client reference \
    --profile ci --focus ENG-001 --timeout "$TIMEOUT" --out "$OUT" \
    --junit "$OUT/sglang-$VERSION.xml" --json "$OUT/sglang-$VERSION.json" || rc=$?
if [ "$rc" -ne 1 ]; then
    die "sglang@$VERSION exited $rc, expected 1 (FAIL); results in $OUT/"
fi
"$PY" - "$OUT/sglang-$VERSION.json" <<'PYEOF' || die "ENG-001 was not among the broken rules"
import json, sys
results = json.load(open(sys.argv[1]))
sys.exit(0 if any(v["rule"] == "ENG-001" for r in results for v in r["violations"]) else 1)
PYEOF
echo "check-sglang: OK: sglang@$VERSION FAILS ExactLaneGuardFlushes (ENG-001) as expected;" \
    "results in $OUT/"
