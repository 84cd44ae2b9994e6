#!/usr/bin/env bash
# Builds, on a machine with PyPI access, the payload that brings SGLang's FA3 (the
# `fa3` attention backend's kernels) to the lent H200, in chunks that travel one
# device call each while the machine stays warm:
#   .devdeps/fa3-1/ ... .devdeps/fa3-4/   (chunk + manifest, <= 44 MiB each)
# Carry `.devdeps/fa3-1` in one call, `.devdeps/fa3-2` in the next, and so on (a
# call may carry one beside other small paths); bench/device/env.sh joins them into
# .devdeps/fa3/ once all are there and checks the whole against its SHA-256.
#   usage: bash bench/device/fa3_payload.sh
# What: sglang-kernel 0.4.5 (a 383 MB wheel; its README says it requires torch
# 2.11.0, the box's, and it links CUDA 13 as the box's torch does): only
# sgl_kernel/flash_ops.abi3.so (FA3, 1.12 GB, every instantiation) and
# sgl_kernel/sm90/common_ops.abi3.so (merge_state_v2, which SGLang runs after the
# cascade's two passes), xz-compressed to about 160 MB. Every libtorch and c10
# symbol the two import is exported by torch 2.11.0+cu130 (checked with nm).
set -euo pipefail
cd "$(dirname "$0")/../.."
WHEEL=sglang-kernel==0.4.5
CHUNK_BYTES=$((44 * 1024 * 1024))  # the tree travels too (12 MB): 64 MiB a call in all
work=.devdeps/fa3-build
rm -rf "$work" .devdeps/fa3-[0-9]*
mkdir -p "$work"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 -d "$work" "$WHEEL"
python3 - "$work" <<'EOF'
import glob, sys, zipfile

work = sys.argv[1]
wheel = zipfile.ZipFile(glob.glob(f"{work}/sglang_kernel-*.whl")[0])
for member, name in (("sgl_kernel/flash_ops.abi3.so", "flash_ops.abi3.so"),
                     ("sgl_kernel/sm90/common_ops.abi3.so", "common_ops.abi3.so")):
    with open(f"{work}/{name}", "wb") as out:
        out.write(wheel.read(member))
EOF
tar -C "$work" -cf - flash_ops.abi3.so common_ops.abi3.so | xz -T0 -6 > "$work/fa3.tar.xz"
split -b "$CHUNK_BYTES" -d -a 1 "$work/fa3.tar.xz" "$work/chunk."
parts=$(ls "$work"/chunk.* | wc -l)
sha=$(sha256sum "$work/fa3.tar.xz" | cut -d' ' -f1)
i=0
for chunk in "$work"/chunk.*; do
  i=$((i + 1))
  mkdir -p ".devdeps/fa3-$i"
  mv "$chunk" ".devdeps/fa3-$i/chunk"
  printf '{"part": %d, "parts": %d, "sha256": "%s", "source": "%s"}\n' \
    "$i" "$parts" "$sha" "$WHEEL" > ".devdeps/fa3-$i/manifest.json"
done
rm -rf "$work"
du -sh .devdeps/fa3-[0-9]*
echo "carry .devdeps/fa3-1 ... .devdeps/fa3-$parts, one per device call"
