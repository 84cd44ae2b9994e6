#!/usr/bin/env bash
# Builds, on a machine with PyPI access, the payload that brings FlashInfer to
# the lent H200 (Python 3.12, torch 2.11, no network, 64 MiB a call):
#   .devdeps/payload/flashinfer_python-0.7.2.post1-pruned.tar.gz  (23 MB)
#   .devdeps/payload/apache_tvm_ffi-0.1.11-*.whl                    (2.7 MB)
# Carry `.devdeps/payload` in one device call; bench/device/env.sh unpacks it
# into .devdeps/site, which stays on the machine while it is warm.
#   usage: bash bench/device/flashinfer_wheels.sh
# The wheel (62 MB, 421 MB unpacked) is cut to what `import flashinfer` and its
# paged prefill need: the sources of the other JIT modules under
# flashinfer/data/csrc/*/ go, except nv_internal (headers the prefill build
# includes), and so does flashinfer/experimental/b12x. Import needs neither
# nvidia-cutlass-dsl, cudnn, cuda-python nor cuda-tile; the prefill module is
# JIT-compiled there per head dim (about a minute each with MAX_JOBS=16).
set -euo pipefail
cd "$(dirname "$0")/../.."
FLASHINFER=flashinfer-python==0.7.2.post1
TVM_FFI=apache-tvm-ffi==0.1.11
payload=.devdeps/payload
download=.devdeps/download
rm -rf "$payload" "$download"
mkdir -p "$payload" "$download"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 -d "$download" "$FLASHINFER" "$TVM_FFI"
cp "$download"/apache_tvm_ffi-*.whl "$payload/"
python3 - "$download" "$payload" <<'EOF'
import glob, io, sys, tarfile, zipfile

download, payload = sys.argv[1:]
wheel = glob.glob(f"{download}/flashinfer_python-*.whl")[0]
version = wheel.split("-")[1]


def kept(name: str) -> bool:
    parts = name.split("/")
    if name.startswith("flashinfer/data/csrc/") and len(parts) > 4:  # in a subfolder
        return parts[3] == "nv_internal"
    return not name.startswith("flashinfer/experimental/b12x/")


out = f"{payload}/flashinfer_python-{version}-pruned.tar.gz"
with zipfile.ZipFile(wheel) as src, tarfile.open(out, "w:gz", compresslevel=9) as dst:
    for info in src.infolist():
        if info.is_dir() or not kept(info.filename):
            continue
        data = src.read(info.filename)
        entry = tarfile.TarInfo(info.filename)
        entry.size = len(data)
        entry.mode = 0o644
        dst.addfile(entry, io.BytesIO(data))
EOF
rm -rf "$download"
du -ab "$payload" | sort -n
total=$(du -sb "$payload" | cut -f1)
limit=$((60 * 1024 * 1024))  # leaves the tree a few MiB of the call's 64
if [ "$total" -gt "$limit" ]; then
  echo "payload is $total bytes, over $limit: it will not travel in one call" >&2
  exit 1
fi
echo "payload: $total bytes in $payload (carry it: \".devdeps/payload\")"
