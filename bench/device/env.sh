# Sourced at the start of every device call (from the repository root):
#   source bench/device/env.sh
# Installs what the call carried into .devdeps/site, which stays on the lent
# machine between calls while it is warm, so that each payload travels once:
#   .whl/*.whl          SGLang and the wheels its Triton baseline and tests need
#                       (bench/device/device_wheels.sh)
#   .devdeps/payload/   FlashInfer (bench/device/flashinfer_wheels.sh)
# The two do not fit one call's 64 MiB together: carry them in two calls. Then
# puts .devdeps/site on PYTHONPATH, keeps FlashInfer's JIT cache in .devdeps
# (its prefill modules compile once per head dim), and lets SGLang import
# without sgl_kernel through graph_tests/stubs where that wheel is absent.
export PYTHONUNBUFFERED=1
_devdeps=$PWD/.devdeps
mkdir -p "$_devdeps/site"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$_devdeps/site" .whl/*.whl && echo "env.sh: installed .whl/ into .devdeps/site"
fi
if compgen -G ".devdeps/payload/flashinfer_python-*.tar.gz" > /dev/null; then
  rm -rf "$_devdeps/site/flashinfer" "$_devdeps"/site/flashinfer_python-*.dist-info
  tar xzf .devdeps/payload/flashinfer_python-*.tar.gz -C "$_devdeps/site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$_devdeps/site" .devdeps/payload/apache_tvm_ffi-*.whl
  echo "env.sh: unpacked FlashInfer into .devdeps/site"
fi
export PYTHONPATH="$PWD:$_devdeps/site${PYTHONPATH:+:$PYTHONPATH}"
export FLASHINFER_WORKSPACE_BASE=$_devdeps  # JIT cache: .devdeps/.cache/flashinfer
export FLASHINFER_CUDA_ARCH_LIST=${FLASHINFER_CUDA_ARCH_LIST:-9.0a}
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
