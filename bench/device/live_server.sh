#!/usr/bin/env bash
# One device call of the live-server run (issue 43, part 3), from the repository root:
#   bash bench/device/live_server.sh SHAPES BACKENDS      e.g. chain triton,verify_ops
#   bash bench/device/live_server.sh setup                 (parcels, build, probe only)
#   bash bench/device/live_server.sh report                (the table of all runs so far)
# SHAPES: chain (3/1/4), tree (3/4/8), or both comma-separated; BACKENDS: triton,
# verify_ops, flashinfer. What the call carried (.live/parcel-N, from
# bench/device/live_wheels.sh) is stashed and, once every parcel is here, unpacked
# into .live/site; the in-place build, the model folders, the JIT caches (~/.cache,
# ~/.triton) and the results (.live/results) stay on the machine while it is warm,
# so later calls carry nothing. Logs, JSON and the table go to $OUT.
# LIVE_BUDGET_S (default 560) is the seconds this call may use: no server starts
# when less than 150 s of it are left.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$SECONDS
OUT=${OUT:-/tmp/live_out}
LIVE=$PWD/.live
mkdir -p "$OUT" "$LIVE/box" "$LIVE/logs"  # setup logs stay in .live/logs (8 files come back a call)
export PYTHONUNBUFFERED=1
# FlashInfer's and SGLang's JIT kernels build with nvcc (once per machine, cached
# under ~/.cache while it is warm).
[ -z "${CUDA_HOME:-}" ] && [ -x /usr/local/cuda/bin/nvcc ] && export CUDA_HOME=/usr/local/cuda
export MAX_JOBS=${MAX_JOBS:-16}
deadline=$(( $(date +%s) + ${LIVE_BUDGET_S:-560} ))
note() { echo "[$(date +%T)] live_server.sh: $*"; }

# 1. Parcels: each carried chunk is kept in .live/box; the whole is checked and
#    unpacked into .live/site once every part is here.
python3 bench/device/live_unpack.py "$LIVE"
case $? in
  0) ;;
  3) note "waiting for more parcels"; exit 0 ;;
  *) exit 1 ;;
esac

# 2. verify_ops, built in place for sm_90a (incremental: a warm machine rebuilds
#    only what changed), before the parcels' packages go on the path.
t1=$SECONDS
TORCH_CUDA_ARCH_LIST=9.0a python3 setup.py build_ext --inplace > "$LIVE/logs/build.log" 2>&1 ||
  { note "build failed"; tail -30 "$LIVE/logs/build.log"; exit 1; }
python3 -c "import verify_ops; assert verify_ops.has_cuda_kernel(), 'no CUDA kernel in the build'" ||
  exit 1
note "verify_ops built in $((SECONDS - t1)) s"

# 3. Entry points: SGLang loads its plugins by entry point, so the verify_ops
#    plugin (an in-place build has no dist-info) and the live weights fill
#    (bench/device/live_dummy_init.py) get one here.
ep=$LIVE/site/verify_ops_live-0.dist-info
mkdir -p "$ep"
printf 'Metadata-Version: 2.1\nName: verify-ops-live\nVersion: 0\n' > "$ep/METADATA"
printf '[sglang.srt.plugins]\nverify_ops = verify_ops.sglang.plugin:register\nlive_dummy_init = bench.device.live_dummy_init:register\n' > "$ep/entry_points.txt"
export PYTHONPATH="$PWD:$LIVE/site${PYTHONPATH:+:$PYTHONPATH}"
# DeepGEMM has no wheel here; SGLang imports it when capturing the draft's graphs,
# and uses it only when SGLANG_ENABLE_JIT_DEEPGEMM is on.
python3 -c "import deep_gemm" 2> /dev/null || {
  export PYTHONPATH="$PYTHONPATH:$PWD/bench/device/live_stubs" SGLANG_ENABLE_JIT_DEEPGEMM=0; }

# 4. sgl_kernel's sm90 library links CUDA 13's cuBLAS and NVRTC by soname; where
#    torch has not loaded them globally, the pip packages' folders are searched.
if ! python3 -c "import torch, sgl_kernel" > "$LIVE/logs/sgl_kernel.log" 2>&1; then
  nv=$(python3 -c "import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))" 2>/dev/null)
  for d in "$nv"/nvidia/*/lib "$nv"/nvidia/cu13/lib /usr/local/cuda/lib64; do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  export LD_LIBRARY_PATH
  python3 -c "import torch, sgl_kernel" > "$LIVE/logs/sgl_kernel.log" 2>&1 ||
    { note "import sgl_kernel failed:"; tail -15 "$LIVE/logs/sgl_kernel.log"; exit 1; }
fi

# 5. Every module the server imports, in one pass (once per unpacked site). A
#    failure is shown but does not stop the call: the servers' own logs then say
#    whether it mattered.
if [ ! -e "$LIVE/site/.probed" ]; then
  if python3 bench/device/live_import_probe.py --flashinfer > "$LIVE/logs/probe.log" 2>&1; then
    touch "$LIVE/site/.probed"
  else
    note "import probe found problems:"; grep -vE "^\s" "$LIVE/logs/probe.log" | tail -30
  fi
  note "$(tail -n 1 "$LIVE/logs/probe.log")"
fi

# 6. The model folders: configs and a tokenizer, no weights.
[ -e "$LIVE/models/draft/tokenizer.json" ] ||
  python3 bench/device/live_model.py --out "$LIVE/models" || exit 1

case "${1:-}" in
  setup) note "setup done in $((SECONDS - t0)) s"; exit 0 ;;
  report) python3 bench/device/live_server.py report --results "$LIVE/results" --out "$OUT"; exit ;;
  "") echo "usage: live_server.sh SHAPES BACKENDS | setup | report"; exit 2 ;;
esac
shapes=$1
backends=${2:-triton,verify_ops}
note "setup done in $((SECONDS - t0)) s; running $shapes x $backends"
python3 bench/device/live_server.py run --shapes "$shapes" --backends "$backends" \
  --models "$LIVE/models" --results "$LIVE/results" --out "$OUT" --deadline "$deadline" \
  ${LIVE_RUN_ARGS:-}
status=$?
python3 bench/device/live_server.py report --results "$LIVE/results" --out "$OUT"
note "call: $((SECONDS - t0)) s"
exit $status
