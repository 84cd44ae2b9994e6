#!/usr/bin/env bash
# Builds, on a machine with PyPI access, the parcels that bring SGLang 0.5.17 to
# the lent GPU for bench/device/live_server.sh (issue 43, part 3):
#   .live/parcel-1/ [, parcel-2/ ...]  chunk + manifest, at most 48 MiB each
#   .live/parcels.json                 what is in them and what was left out, why
# Carry .live/parcel-1 in the first call (and parcel-N in the N-th, if there are
# more); live_server.sh unpacks them into .live/site once all are on the box.
#   usage: bash bench/device/live_wheels.sh      (about 10 minutes: xz -9e on 2 cores)
# The box (Python 3.12, torch 2.11.0+cu130, no network) lacks these; the set was
# found by importing, with torch made to report one sm_90 device, every module
# that launch_server, its scheduler, a Llama forward with STANDALONE/EAGLE and
# the triton, flashinfer and verify_ops backends import
# (bench/device/live_import_probe.py; 2026-12-05). Of the box's own packages three
# are carried anyway: transformers 5.17.0 there clashes with sglang 0.5.17's own
# config registry ("'qwen3_asr' is already used by a Transformers config"), so
# 0.5.17's pin 5.12.1 comes, with the tokenizers it accepts (<= 0.23.0; the box
# has 0.23.2) and a typing_extensions recent enough for pydantic 2.14.
# sglang-kernel 0.4.5 (383 MB) is cut to what `import sgl_kernel` loads on sm_90
# (bench/device/live_pack.py says what is left out and why); set SGL_KERNEL_WHEEL
# to a copy of that wheel to skip its download.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=(
  sglang==0.5.17 flashinfer_python==0.6.15.post1 apache_tvm_ffi==0.1.11
  transformers==5.12.1 tokenizers==0.22.2 typing_extensions==4.16.0 xgrammar==0.2.1
  annotated_types==0.8.0 cffi==2.1.1 compressed_tensors==0.20.1 dill==0.4.1 distro==1.9.0
  fastapi==0.165.0 gguf==0.19.0 ipython==9.18.1 jiter==0.19.0 jsonschema==4.26.0
  jsonschema_specifications==2025.9.1 loguru==0.7.3 msgspec==0.23.0 openai==2.6.1
  opentelemetry_api==1.45.2 orjson==3.13.0 partial_json_parser==0.2.1.1.post7
  pybase64==1.5.1 pycparser==3.12 pydantic==2.14.4 pydantic_core==2.50.5
  python_multipart==0.0.34 pyzmq==27.3.0 referencing==0.37.0 rpds_py==2026.9.1
  setproctitle==1.3.8 sniffio==1.3.1 soundfile==0.13.1 starlette==1.10.0
  traitlets==5.16.1 typing_inspection==0.4.5 uvicorn==0.54.0 zstandard==0.25.0
)
PLATFORMS=()
for p in manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
         manylinux_2_26 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
DOWNLOAD=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12
          --implementation cp "${PLATFORMS[@]}")
mkdir -p .live/wheels .live/kernel
"${DOWNLOAD[@]}" -d .live/wheels "${WHEELS[@]}"
kernel=${SGL_KERNEL_WHEEL:-}
if [ -z "$kernel" ]; then
  "${DOWNLOAD[@]}" -d .live/kernel sglang-kernel==0.4.5
  kernel=$(ls .live/kernel/sglang_kernel-0.4.5-*.whl)
fi
# One version of each: a wheel left from another list would be packed too.
expected=${#WHEELS[@]}
found=$(ls .live/wheels/*.whl | wc -l)
[ "$found" -eq "$expected" ] ||
  { echo "live_wheels.sh: .live/wheels has $found wheels, expected $expected: clear it" >&2; exit 1; }
python3 bench/device/live_pack.py --wheels .live/wheels --kernel-wheel "$kernel" --out .live
