#!/usr/bin/env bash
# One device call: an A/B of two builds of the kernels on the same cases. The
# builds alternate within each round, so that drift of the machine (clock,
# temperature) lands on both; a table of per-case times and ratios prints last.
#   usage: AB_BASE=DIR [AB_ROUNDS=2] [AB_SMOKE=0] bash bench/probes/ab_run.sh CASES
#   DIR: a copy of the baseline's tree (`git archive <commit>`, carried along);
#   the candidate is this tree. CASES: a `--cases` list of bench_tree_attn, or @FILE.
#   Both builds run this tree's bench/, so only the kernels differ. Each build
#   stays in place in its tree for the commands that follow (tests, sanitizers).
#   The candidate first runs graph_tests/sanitize_case.py (AB_SMOKE=0 skips it).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/verify_ops_out}
mkdir -p "$OUT"
base=$(realpath "${AB_BASE:?AB_BASE names the baseline tree}")
cd "$(dirname "$0")/../.."  # the candidate's root, wherever this is called from
cand=$PWD
# A list as is, or @FILE: one case a line, with # comments (restructure_ab_cases.txt).
cases=$(python3 -c 'import sys; from bench.probes.kernel_names import read_cases
print(",".join(read_cases(sys.argv[1])))' "${1:?a --cases list}") || exit 1
mkdir -p "$base/bench" && cp -r bench/. "$base/bench/"
build() {
  (cd "$1" && TORCH_CUDA_ARCH_LIST=9.0a VERIFY_OPS_PTXAS_VERBOSE=1 \
    python3 setup.py build_ext --inplace > "$OUT/build-$2.log" 2>&1)
}
t0=$SECONDS
build "$base" base & pid_base=$!
build "$cand" cand & pid_cand=$!
wait $pid_base || { echo "base build failed"; tail -30 "$OUT/build-base.log"; exit 1; }
wait $pid_cand || { echo "candidate build failed"; tail -30 "$OUT/build-cand.log"; exit 1; }
echo "builds: $((SECONDS - t0)) s"
# A candidate that hangs or computes wrong costs a minute here, not the call.
[ "${AB_SMOKE:-1}" = 0 ] || PYTHONPATH="$cand${PYTHONPATH:+:$PYTHONPATH}" timeout 90 \
  python3 graph_tests/sanitize_case.py > "$OUT/smoke-cand.log" 2>&1 ||
  { echo "candidate smoke failed"; tail -20 "$OUT/smoke-cand.log"; exit 1; }
for round in $(seq 1 "${AB_ROUNDS:-2}"); do
  for name in base cand; do
    dir=$base; [ "$name" = cand ] && dir=$cand
    (cd "$dir" && python3 -m bench.bench_tree_attn --methods verify_ops --cases "$cases" \
      --out "$OUT/ab-$name-r$round.json" --plot '') > "$OUT/ab-$name-r$round.log" 2>&1 ||
      { echo "$name round $round failed"; tail -20 "$OUT/ab-$name-r$round.log"; }
  done
done
echo "a/b: $((SECONDS - t0)) s"
python3 -m bench.probes.ab_table "$OUT"/ab-*.json | tee "$OUT/ab-table.txt"
