# Sourced at the start of every device call (from the repository root):
#   source bench/device/env.sh
# Installs what the call carried into .devdeps/site, which stays on the lent
# machine between calls while it is warm, so that each payload travels once:
#   .whl/*.whl          SGLang and the wheels its Triton baseline and tests need
#                       (bench/device/device_wheels.sh)
#   .devdeps/payload/   FlashInfer (bench/device/flashinfer_wheels.sh)
#   .devdeps/fa3-N/     a chunk of FA3 (bench/device/fa3_payload.sh), one a call;
#                       joined into .devdeps/fa3/ once all chunks are here
# Each travels in a call of its own (64 MiB a call). Then
# puts .devdeps/site on PYTHONPATH, keeps FlashInfer's JIT cache in .devdeps
# (its prefill modules compile once per head dim), and lets SGLang import
# without sgl_kernel through graph_tests/stubs where that wheel is absent.
export PYTHONUNBUFFERED=1
_devdeps=$PWD/.devdeps
mkdir -p "$_devdeps/site"
# A payload is installed once: a stamp of its files' names and sizes says which.
_stamp() { ls -l "$@" 2>/dev/null | awk '{print $5, $NF}'; }
if compgen -G ".whl/*.whl" > /dev/null &&
   [ "$(_stamp .whl/*.whl)" != "$(cat "$_devdeps/site/.whl-stamp" 2>/dev/null)" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$_devdeps/site" .whl/*.whl &&
    _stamp .whl/*.whl > "$_devdeps/site/.whl-stamp" &&
    echo "env.sh: installed .whl/ into .devdeps/site"
fi
if compgen -G ".devdeps/payload/flashinfer_python-*.tar.gz" > /dev/null &&
   [ "$(_stamp .devdeps/payload/*)" != "$(cat "$_devdeps/site/.flashinfer-stamp" 2>/dev/null)" ]; then
  rm -rf "$_devdeps/site/flashinfer" "$_devdeps"/site/flashinfer_python-*.dist-info
  tar xzf .devdeps/payload/flashinfer_python-*.tar.gz -C "$_devdeps/site" &&
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$_devdeps/site" .devdeps/payload/apache_tvm_ffi-*.whl &&
    _stamp .devdeps/payload/* > "$_devdeps/site/.flashinfer-stamp" &&
    echo "env.sh: unpacked FlashInfer into .devdeps/site"
fi
if [ ! -e "$_devdeps/fa3/flash_ops.abi3.so" ] &&
   compgen -G ".devdeps/fa3-[0-9]*/manifest.json" > /dev/null; then
  python3 - "$_devdeps" <<'EOF'
import glob, hashlib, io, json, os, sys, tarfile

root = sys.argv[1]
manifests = [json.load(open(p)) for p in glob.glob(f"{root}/fa3-[0-9]*/manifest.json")]
parts = manifests[0]["parts"]
here = sorted(m["part"] for m in manifests)
if here != list(range(1, parts + 1)):
    print(f"env.sh: FA3 chunks {here} of {parts} here; carry the rest")
    sys.exit(0)
blob = b"".join(open(f"{root}/fa3-{i}/chunk", "rb").read() for i in range(1, parts + 1))
if hashlib.sha256(blob).hexdigest() != manifests[0]["sha256"]:
    sys.exit("env.sh: the FA3 chunks do not add up to their SHA-256; carry them again")
with tarfile.open(fileobj=io.BytesIO(blob), mode="r:xz") as tar:
    tar.extractall(f"{root}/fa3")
print(f"env.sh: joined {parts} chunks into {root}/fa3: {sorted(os.listdir(root + '/fa3'))}")
EOF
fi
export PYTHONPATH="$PWD:$_devdeps/site${PYTHONPATH:+:$PYTHONPATH}"
export FLASHINFER_WORKSPACE_BASE=$_devdeps  # JIT cache: .devdeps/.cache/flashinfer
export MAX_JOBS=${MAX_JOBS:-16}
# SGLang imports sgl_kernel on CUDA; where that 1.2 GB wheel is absent, an
# import-only stand-in (graph_tests/stubs) lets its modules import.
python3 -c "import sgl_kernel" 2>/dev/null ||
  export PYTHONPATH="$PYTHONPATH:$PWD/graph_tests/stubs"
python3 - <<'EOF'
import importlib
found = []
for name in ("sglang", "flashinfer", "sgl_kernel"):
    try:
        module = importlib.import_module(name)
        found.append(f"{name} {getattr(module, '__version__', '?')}")
    except Exception as exc:
        found.append(f"{name} absent ({type(exc).__name__})")
print("env.sh:", ", ".join(found))
EOF
unset _devdeps
unset -f _stamp
