"""Packs the wheels that ``live_wheels.sh`` downloaded into parcels for the lent
H200: one installed ``site`` tree (what ``pip install --target`` would make,
less what the live server never loads), xz-compressed and split into chunks
small enough to travel one per device call beside the working tree.

    python bench/device/live_pack.py --wheels .live/wheels --kernel-wheel K.whl --out .live

writes ``.live/parcel-1/``, ``.live/parcel-2/``, ... (``chunk`` + ``manifest.json``)
and ``.live/parcels.json`` (the contents, sizes and what was left out, with why).
``live_server.sh`` joins the chunks on the box once all have arrived.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

# Files of the wheels that the live server never loads, with why: they would
# take a device call of their own.
PRUNED = {
    "sglang/srt/server/_core.*.so":
        "SGLang's Rust HTTP server, used only with SGLANG_RUST_SERVER=1",
    "sglang/srt/grpc/_core.*.so": "SGLang's gRPC server, used only with --grpc-mode",
    "sglang/srt/multimodal/_core.*.so":
        "Rust image preprocessing of one multimodal model (inkling)",
    "sglang/multimodal_gen/*": "SGLang's diffusion runtime (sglang serve of image/video models)",
    "xgrammar/lib/*": "xgrammar's static C++ library, for C++ users; Python loads the bindings",
    "zstandard/_cffi.*.so": "zstandard's CFFI backend; its C backend is the one imported",
    "bin/*": "console scripts, written for this machine's interpreter",
}

# sglang-kernel 0.4.5: what ``import sgl_kernel`` loads on sm_90 is its Python
# files and sm90/common_ops.abi3.so (load_utils.py picks the sm90 build for
# compute capability 9.0); the other libraries load only on first use of the
# kernels they hold.
KERNEL_KEPT = ["sgl_kernel/*.py", "sgl_kernel/*/*.py", "sgl_kernel/sm90/common_ops.abi3.so",
               "sgl_kernel/spatial_ops.abi3.so", "triton_kernels/*",
               "sglang_kernel-*.dist-info/*"]
KERNEL_LEFT_OUT = {
    "sgl_kernel/flash_ops.abi3.so":
        "FlashAttention-3, loaded only by sgl_kernel.flash_attn: SGLang's fa3 backend "
        "(and the dual-chunk, DSA and vision attention that reuse it); not the "
        "triton, flashinfer or verify_ops backends",
    "sgl_kernel/flashmla_ops.abi3.so": "FlashMLA, for MLA models (DeepSeek) only",
    "sgl_kernel/infllm_ops.*.so": "InfLLM-V2 sparse attention, loaded on first call only",
    "sgl_kernel/sm100/common_ops.abi3.so": "the Blackwell (sm_100+) build; sm_90 loads sm90/",
}


def install_wheel(wheel: Path, site: Path) -> None:
    """Unpacks a wheel as ``pip install --no-deps --target`` lays it out (no
    scripts, no byte code): ``*.data/purelib`` and ``platlib`` go to the root."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            name = info.filename
            if info.is_dir():
                continue
            parts = name.split("/")
            if parts[0].endswith(".data"):
                if parts[1] not in ("purelib", "platlib"):
                    continue  # scripts, headers, data: not imported
                name = "/".join(parts[2:])
            target = site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)


def matches(path: str, patterns) -> str | None:
    return next((p for p in patterns if fnmatch.fnmatch(path, p)), None)


def prune(site: Path) -> dict[str, dict]:
    """Deletes the PRUNED files; returns {pattern: {why, bytes}}."""
    left_out: dict[str, dict] = {}
    for path in sorted(site.rglob("*")):
        if not path.is_file():
            continue
        pattern = matches(path.relative_to(site).as_posix(), PRUNED)
        if pattern:
            entry = left_out.setdefault(pattern, {"why": PRUNED[pattern], "bytes": 0})
            entry["bytes"] += path.stat().st_size
            path.unlink()
    for directory in sorted(site.rglob("*"), reverse=True):
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
    return left_out


def add_kernel(kernel_wheel: Path, site: Path) -> dict[str, dict]:
    """Copies the KERNEL_KEPT part of sglang-kernel into the site; returns what
    was left out, with sizes."""
    left_out: dict[str, dict] = {}
    with zipfile.ZipFile(kernel_wheel) as archive:
        for info in archive.infolist():
            name = info.filename
            if info.is_dir():
                continue
            if matches(name, KERNEL_KEPT):
                target = site / name
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(info) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                pattern = matches(name, KERNEL_LEFT_OUT) or "other"
                why = KERNEL_LEFT_OUT.get(pattern, "not loaded by import sgl_kernel")
                entry = left_out.setdefault(pattern, {"why": why, "bytes": 0})
                entry["bytes"] += info.file_size
    return left_out


def pack(site: Path, out: Path, chunk_bytes: int) -> list[dict]:
    """tar.xz of the site, split into parcel-N/chunk with a manifest each."""
    blob_path = out / "site.tar.xz"
    # xz -9e by the command line tool: several times faster than lzma here.
    with open(blob_path, "wb") as blob:
        tar = subprocess.Popen(["tar", "-C", str(site), "--sort=name", "--owner=0", "--group=0",
                                "--mtime=@0", "-cf", "-", "."], stdout=subprocess.PIPE)
        subprocess.run(["xz", "-T0", "-9e", "-c"], stdin=tar.stdout, stdout=blob, check=True)
        if tar.wait() != 0:
            sys.exit("tar failed")
    data = blob_path.read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    parts = -(-len(data) // chunk_bytes)
    for old in out.glob("parcel-*"):
        shutil.rmtree(old)
    parcels = []
    for i in range(parts):
        directory = out / f"parcel-{i + 1}"
        directory.mkdir()
        chunk = data[i * chunk_bytes:(i + 1) * chunk_bytes]
        (directory / "chunk").write_bytes(chunk)
        manifest = {"part": i + 1, "parts": parts, "sha256": sha, "bytes": len(data),
                    "chunk_bytes": len(chunk)}
        (directory / "manifest.json").write_text(json.dumps(manifest) + "\n")
        parcels.append({"path": str(directory), "bytes": len(chunk)})
    blob_path.unlink()
    return parcels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, required=True, help="folder of the wheels")
    parser.add_argument("--kernel-wheel", type=Path, required=True,
                        help="sglang_kernel-0.4.5-*.whl (383 MB)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--chunk-mib", type=int, default=48,
                        help="a parcel's size at most; the tree (about 12 MiB) travels "
                             "beside it, 64 MiB a call in all")
    args = parser.parse_args()
    site = args.out / "stage" / "site"
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    wheels = sorted(args.wheels.glob("*.whl"))
    for wheel in wheels:
        install_wheel(wheel, site)
    left_out = prune(site)
    kernel_left_out = add_kernel(args.kernel_wheel, site)
    installed = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    parcels = pack(site, args.out, args.chunk_mib * 1024 * 1024)
    report = {
        "wheels": [w.name for w in wheels] + [args.kernel_wheel.name + " (part)"],
        "installed_bytes": installed,
        "parcels": parcels,
        "left_out": left_out,
        "kernel_left_out": kernel_left_out,
    }
    (args.out / "parcels.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"{len(wheels)} wheels + sglang-kernel (part): {installed / 2**20:.0f} MiB installed")
    for pattern, entry in {**left_out, **kernel_left_out}.items():
        print(f"  left out {pattern}: {entry['bytes'] / 2**20:.1f} MiB ({entry['why']})")
    for parcel in parcels:
        print(f"  {parcel['path']}: {parcel['bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
