#!/usr/bin/env bash
# Fetches into .whl/ the wheels that the lent H200 (Python 3.12, no network)
# lacks for SGLang's Triton baseline and the SGLang tests; bench/device/env.sh
# installs whatever .whl/ holds. Run on a machine with PyPI access; carry .whl
# with one device call (FlashInfer's payload, bench/device/flashinfer_wheels.sh,
# travels in another: the two pass 64 MiB together).
#   usage: bash bench/device/device_wheels.sh
# The set was found by importing, on that machine, what the tests and the
# benchmark import (2026-11-30). SGLang's Rust server extensions and its
# multimodal test data are left out of its wheel (nothing here imports them),
# which keeps the set near 48 MB, under the device call's 64 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEELS=(
  sglang==0.5.23 annotated_types==0.8.0 apache_tvm_ffi==0.1.11 compressed_tensors==0.18.0
  dill==0.4.1 distro==1.9.0 expecttest==0.3.0 fastapi==0.165.0 gguf==0.19.0 ipython==9.18.1
  jiter==0.19.0 jsonschema==4.26.0 jsonschema_specifications==2025.9.1 loguru==0.7.3
  mistral_common==1.13.1 msgspec==0.23.0 openai==2.8.0 opentelemetry_api==1.45.2
  orjson==3.13.0 partial_json_parser==0.2.1.1.post7 pybase64==1.5.1 pycountry==26.2.16
  pydantic==2.14.4 pydantic_core==2.50.5 pydantic_extra_types==2.11.1
  python_multipart==0.0.34 pyzmq==27.3.0 referencing==0.37.0 rpds_py==2026.9.1
  setproctitle==1.3.8 sniffio==1.3.1 starlette==1.10.0 traitlets==5.16.1
  typing_extensions==4.16.0 typing_inspection==0.4.5 uvicorn==0.54.0 zstandard==0.25.0
)
PLATFORMS=()
for p in manylinux_2_34 manylinux_2_28 manylinux_2_27 manylinux_2_26 manylinux_2_24 \
         manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLATFORMS[@]}" -d .whl "${WHEELS[@]}"
python3 - <<'EOF'
import glob, os, zipfile

def unused(name):
    return name.startswith("sglang/srt/rust_extensions/_") or name.startswith(
        "sglang/multimodal_gen/test/")

for path in glob.glob(".whl/sglang-*.whl"):
    with zipfile.ZipFile(path) as src:
        if not any(unused(i.filename) for i in src.infolist()):
            continue
        with zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if unused(info.filename):
                    continue
                data = src.read(info.filename)
                if info.filename.endswith(".dist-info/RECORD"):
                    data = b"\n".join(line for line in data.split(b"\n")
                                      if not unused(line.decode().split(",")[0]))
                dst.writestr(info, data)
    os.replace(path + ".tmp", path)
EOF
du -sh .whl
