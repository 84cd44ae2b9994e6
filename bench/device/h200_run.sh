#!/usr/bin/env bash
# One device call: build for sm_90a, run the test suites, the sanitizers, the
# SASS hazard scan and the benchmark; full logs go to $OUT, a short summary
# prints last.
#   usage: bash bench/device/h200_run.sh [bench args...]
#   (needs $OUT; installs what bench/device/env.sh finds carried: SGLang's
#   wheels in .whl/, FlashInfer in .devdeps/payload/). The SKIP_* variables and
#   the others below fit a run into one 10-minute call, or split it over two.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/verify_ops_out}
mkdir -p "$OUT"
summary=()
step() {  # step NAME TIMEOUT CMD...: run, log to $OUT/NAME.log, remember the exit code
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-12s rc=%-3s %4ss  %s' "$name" "$rc" $((SECONDS - t0)) "$(tail -n 1 "$OUT/$name.log" | cut -c1-110)")")
  return $rc
}

cd "$(dirname "$0")/../.."
source bench/device/env.sh
# SKIP_BUILD=1: a later call on the same warm machine keeps the last call's build
# (pip's editable build starts afresh each time: minutes).
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  step build 400 env TORCH_CUDA_ARCH_LIST=9.0a VERIFY_OPS_PTXAS_VERBOSE=1 \
    python3 -m pip install --no-build-isolation --no-deps -v -e . || { printf '%s\n' "${summary[@]}"; tail -40 "$OUT/build.log"; exit 1; }
fi
# A kernel that hangs costs a minute here, not the rest of the device call.
step smoke 90 python3 graph_tests/sanitize_case.py || { printf '%s\n' "${summary[@]}"; tail -20 "$OUT/smoke.log"; exit 1; }
# PYTEST_PATHS narrows the suites when the device call's time is short; SKIP_PYTEST=1 skips them.
[ "${SKIP_PYTEST:-0}" = 1 ] || step pytest "${PYTEST_TIMEOUT:-420}" python3 -m pytest \
  ${PYTEST_PATHS:-tests compile_tests graph_tests bench/probes/tests} \
  -q -rs -p no:cacheprovider --continue-on-collection-errors
# SKIP_SANITIZERS=1 leaves memcheck, synccheck, racecheck and the SASS scan to a later call;
# SANITIZE_CASES (indices of sanitize_case.py's CASES) narrows the three, and
# RACECHECK_CASES racecheck alone, the slowest of them.
SANITIZE_CASES=${SANITIZE_CASES:-}
RACECHECK_CASES=${RACECHECK_CASES:-$SANITIZE_CASES}
if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  step memcheck 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 graph_tests/sanitize_case.py $SANITIZE_CASES
  # Barriers and warpgroup instructions reached by only some of their threads.
  step synccheck 200 compute-sanitizer --tool synccheck --error-exitcode 9 python3 graph_tests/sanitize_case.py $SANITIZE_CASES
  step sass 120 python3 graph_tests/wgmma_sass_check.py
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  step bench "${BENCH_TIMEOUT:-1200}" python3 -m bench.bench_tree_attn --out "$OUT/bench.json" \
    --plot "$OUT/bench.png" "$@"
fi
[ "${SKIP_SGLANG_BENCH:-0}" = 1 ] || step sglang_bench 300 python3 -m bench.sglang_backend_bench \
  --out "$OUT/sglang_backend_bench.json"
[ "${SKIP_RACECHECK:-0}" = 1 ] || [ "${SKIP_SANITIZERS:-0}" = 1 ] || step racecheck "${RACECHECK_TIMEOUT:-300}" compute-sanitizer --tool racecheck --error-exitcode 9 python3 graph_tests/sanitize_case.py $RACECHECK_CASES
if [ -n "${EXTRA:-}" ]; then step extra 400 bash -c "$EXTRA"; fi
echo "=== gpu ==="; nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
echo "=== pytest failures ==="; grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" 2>/dev/null | head -20
echo "=== sanitizer ==="; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^relative error" "$OUT"/*check.log 2>/dev/null
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  echo "=== ptxas ==="; grep -A2 "tree_attn_kernel" "$OUT/build.log" | grep -E "registers|spill" | sort | uniq -c | head
fi
echo "=== bench ==="; tail -n 60 "$OUT/bench.log" 2>/dev/null
echo "=== sglang backend bench ==="; tail -n 12 "$OUT/sglang_bench.log" 2>/dev/null
echo "=== steps ==="; printf '%s\n' "${summary[@]}"
