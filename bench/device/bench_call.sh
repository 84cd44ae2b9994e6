#!/usr/bin/env bash
# One device call of the benchmark, from the repository root:
#   bash bench/device/bench_call.sh setup         # carry .whl: SGLang's wheels; builds verify_ops
#   bash bench/device/bench_call.sh flashinfer    # carry .devdeps/payload; JIT-builds FlashInfer's
#                                                 # prefill at head dims 64, 128, 256 and checks it
#   bash bench/device/bench_call.sh part N        # part N of python -m bench.full_run
#   bash bench/device/bench_call.sh model [ARGS]  # python -m bench.model_step ARGS
# Whatever the call carried is installed first (bench/device/env.sh) and stays
# on the machine, with the in-place build, while it is warm: after `setup` and
# `flashinfer` (two calls: the payloads pass 64 MiB together) a call carries
# nothing. Full logs and JSON go to $OUT; a short table prints last.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/verify_ops_out}
mkdir -p "$OUT"
what=${1:?setup, flashinfer, part N or model}
shift
source bench/device/env.sh
t0=$SECONDS
# Incremental: only what changed since the last call on this machine rebuilds.
TORCH_CUDA_ARCH_LIST=9.0a python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 ||
  { echo "build failed"; tail -30 "$OUT/build.log"; exit 1; }
echo "build: $((SECONDS - t0)) s"
case $what in
  setup)
    python3 -c "import verify_ops; print('verify_ops CUDA kernel:', verify_ops.has_cuda_kernel())"
    ;;
  flashinfer)
    # Tiny cases, one per head dim: the first plan of each compiles its module.
    python3 -m bench.bench_tree_attn --methods verify_ops,flashinfer --plot '' \
      --cases 1/64/8/8/1/128/fragmented,1/64/8/32/4/64/fragmented,1/64/8/16/2/256/fragmented \
      --out "$OUT/flashinfer-check.json" 2>&1 | tee "$OUT/flashinfer.log" | tail -8
    ;;
  part)
    python3 -m bench.full_run --part "${1:?part number}" --out-dir "$OUT" > "$OUT/part.log" 2>&1
    rc=$?
    sed -n '/^case /,$p' "$OUT/part.log" | tail -n 90
    [ $rc = 0 ] || { echo "part failed (rc $rc)"; tail -20 "$OUT/part.log"; }
    ;;
  model)
    python3 -m bench.model_step --out "$OUT/model_step.json" "$@" > "$OUT/model.log" 2>&1
    rc=$?
    sed -n '/^model /,$p' "$OUT/model.log" | tail -n 80
    [ $rc = 0 ] || { echo "model_step failed (rc $rc)"; tail -20 "$OUT/model.log"; }
    ;;
  *) echo "unknown call: $what"; exit 2 ;;
esac
echo "call: $((SECONDS - t0)) s"
