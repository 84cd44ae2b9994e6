// The one place that defines verify's op schemas. Backends register kernels
// with TORCH_LIBRARY_IMPL in their own files; fake kernels live in
// verify_ops/ops.py. (Probing builds, VERIFY_OPS_CTA_STAMPS=1, also define
// verify_stamps in tree_attn_cuda.cu.)
#include <Python.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>

#include <vector>

extern "C" {
// Importing verify_ops._C loads this library, which runs the registrations
// below; the module itself only says whether the CUDA kernels were built.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr,
                                          -1, nullptr};
  PyObject* module = PyModule_Create(&module_def);
#ifdef VERIFY_OPS_WITH_CUDA
  const long built_with_cuda = 1;
#else
  const long built_with_cuda = 0;
#endif
  if (module != nullptr &&
      PyModule_AddIntConstant(module, "built_with_cuda", built_with_cuda) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
}

TORCH_LIBRARY(verify, m) {
  m.def(
      "tree_attn(Tensor q, Tensor k_cache, Tensor v_cache, "
      "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
      "Tensor tree_mask, float sm_scale) -> Tensor");
  m.def(
      "tree_attn_out(Tensor q, Tensor k_cache, Tensor v_cache, "
      "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
      "Tensor tree_mask, float sm_scale, Tensor(a!) out) -> ()");
  // Copies slot src_slots[i] to dst_slots[i] in every layer's K and V cache.
  m.def(
      "relocate_kv(Tensor(a!)[] k_caches, Tensor(b!)[] v_caches, "
      "Tensor src_slots, Tensor dst_slots) -> ()");
}

namespace {

// ADInplaceOrView kernel of the ops that write into their arguments: runs
// the op, then bumps the version counter of every argument the schema marks
// as written (Tensor(a!), Tensor(a!)[]), as ATen's in-place ops do, so that
// autograd refuses a tensor saved for backward and overwritten since.
void bump_written_arguments(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                            torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  std::vector<at::Tensor> written;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const auto* alias = arguments[i].alias_info();
    if (alias == nullptr || !alias->isWrite()) continue;
    const c10::IValue& value = (*stack)[first + i];
    if (value.isTensor()) written.push_back(value.toTensor());
    if (value.isTensorList())
      for (const at::Tensor& t : value.toTensorList()) written.push_back(t);
  }
  {
    const at::AutoDispatchBelowADInplaceOrView guard;
    op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
  }
  // Inference tensors have no version to bump; the op writes them as it did
  // before it bumped any (ATen's in-place ops refuse them outside inference mode).
  for (const at::Tensor& t : written)
    if (!t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
}

}  // namespace

TORCH_LIBRARY_IMPL(verify, ADInplaceOrView, m) {
  m.impl("tree_attn_out", torch::CppFunction::makeFromBoxedFunction<&bump_written_arguments>());
  m.impl("relocate_kv", torch::CppFunction::makeFromBoxedFunction<&bump_written_arguments>());
}
