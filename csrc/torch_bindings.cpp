// The one place that defines verify's op schemas (ops.h declares every
// kernel entry point). Backends register kernels with TORCH_LIBRARY_IMPL in
// their own files; fake kernels live in verify_ops/ops.py. (Probing builds,
// VERIFY_OPS_CTA_STAMPS=1, also define verify_stamps in tree_attn_cuda.cu.)
#include <Python.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
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
  // The keyword options default to plain attention: fp8 pools take k_scale /
  // v_scale ([1] fp32; None is 1.0), logit_cap > 0 soft-caps the scores,
  // sinks ([Hq] fp32) enter the softmax denominator, sliding_window >= 0
  // limits keys to logical positions P - W .. P, and lse ([bs*D, Hq] fp32)
  // receives the natural-log log-sum-exp of each row.
  m.def(
      "tree_attn(Tensor q, Tensor k_cache, Tensor v_cache, "
      "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
      "Tensor tree_mask, float sm_scale, *, Tensor? k_scale=None, Tensor? v_scale=None, "
      "float logit_cap=0., Tensor? sinks=None, int sliding_window=-1) -> Tensor");
  m.def(
      "tree_attn_out(Tensor q, Tensor k_cache, Tensor v_cache, "
      "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
      "Tensor tree_mask, float sm_scale, Tensor(a!) out, *, Tensor? k_scale=None, "
      "Tensor? v_scale=None, float logit_cap=0., Tensor? sinks=None, int sliding_window=-1, "
      "Tensor(b!)? lse=None) -> ()");
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

// verify.tree_attn, written once for every backend: q-shaped out from the
// caching allocator, then verify.tree_attn_out through the dispatcher (so
// torch.compile traces it as the out variant, which it functionalizes).
at::Tensor tree_attn(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                     const at::Tensor& seq_lens, const at::Tensor& tree_mask, double sm_scale,
                     const std::optional<at::Tensor>& k_scale,
                     const std::optional<at::Tensor>& v_scale, double logit_cap,
                     const std::optional<at::Tensor>& sinks, int64_t sliding_window) {
  static const auto tree_attn_out =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("verify::tree_attn_out", "")
          .typed<void(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                      const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                      const at::Tensor&, const std::optional<at::Tensor>&,
                      const std::optional<at::Tensor>&, double, const std::optional<at::Tensor>&,
                      int64_t, const std::optional<at::Tensor>&)>();
  at::Tensor out = at::empty(q.sizes(), q.options());
  tree_attn_out.call(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, tree_mask,
                     sm_scale, out, k_scale, v_scale, logit_cap, sinks, sliding_window,
                     std::nullopt);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(verify, CompositeImplicitAutograd, m) { m.impl("tree_attn", &tree_attn); }

TORCH_LIBRARY_IMPL(verify, ADInplaceOrView, m) {
  m.impl("tree_attn_out", torch::CppFunction::makeFromBoxedFunction<&bump_written_arguments>());
  m.impl("relocate_kv", torch::CppFunction::makeFromBoxedFunction<&bump_written_arguments>());
}
