#!/usr/bin/env bash
# One device call of the benchmark, from the repository root: one or more steps,
#   bash bench/device/bench_call.sh STEP [STEP ...]
# each of them
#   setup           the in-place build alone (carry .whl: SGLang's wheels, device_wheels.sh)
#   flashinfer      JIT-builds FlashInfer's prefill at head dims 64, 128 and 256 and checks
#                   it on tiny cases (carry .devdeps/payload: flashinfer_wheels.sh), ~1 min each
#   part N          part N of python -m bench.full_run (--list names them)
#   model [ARGS]    python -m bench.model_step ARGS (the rest of the line)
# e.g. `bash bench/device/bench_call.sh flashinfer part 1`. Whatever the call carried
# is installed first (bench/device/env.sh) and stays on the machine, with the in-place
# build and FlashInfer's JIT cache, while it is warm: a later call on the same machine
# carries nothing. Each payload needs a call of its own (64 MiB a call). Logs and JSON
# go to $OUT; each step prints a short table.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/verify_ops_out}
mkdir -p "$OUT"
[ $# -gt 0 ] || { echo "usage: bench_call.sh setup|flashinfer|part N|model [ARGS] ..."; exit 2; }
source bench/device/env.sh
t0=$SECONDS
# Incremental: only what changed since the last call on this machine rebuilds.
TORCH_CUDA_ARCH_LIST=9.0a python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 ||
  { echo "build failed"; tail -30 "$OUT/build.log"; exit 1; }
python3 -c "import verify_ops; print('build:', $((SECONDS - t0)), 's; CUDA kernel:',
            verify_ops.has_cuda_kernel())"
status=0
while [ $# -gt 0 ]; do
  step=$1; shift
  t1=$SECONDS
  case $step in
    setup) ;;
    flashinfer)
      # Tiny cases, one per head dim: the first plan of each compiles its module.
      python3 -m bench.bench_tree_attn --methods verify_ops,flashinfer --plot '' \
        --cases 1/64/8/8/1/128/fragmented,1/64/8/32/4/64/fragmented,1/64/8/16/2/256/fragmented \
        --out "$OUT/flashinfer-check.json" > "$OUT/flashinfer.log" 2>&1 || status=1
      sed -n '/^case /,$p' "$OUT/flashinfer.log"
      ;;
    part)
      part=${1:?part N}; shift
      python3 -m bench.full_run --part "$part" --out-dir "$OUT" > "$OUT/part$part.log" 2>&1 ||
        { status=1; echo "part $part failed"; tail -20 "$OUT/part$part.log"; }
      sed -n '/^case /,$p' "$OUT/part$part.log" | tail -n 90
      ;;
    model)
      python3 -m bench.model_step --out "$OUT/model_step.json" "$@" > "$OUT/model.log" 2>&1 ||
        { status=1; echo "model_step failed"; tail -20 "$OUT/model.log"; }
      sed -n '/^model case/,$p' "$OUT/model.log" | tail -n 60
      set --
      ;;
    *) echo "unknown step: $step"; exit 2 ;;
  esac
  echo "=== $step: $((SECONDS - t1)) s"
done
echo "call: $((SECONDS - t0)) s"
exit $status
