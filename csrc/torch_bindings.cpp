// The one place that defines verify's op schemas. Backends register kernels
// with TORCH_LIBRARY_IMPL in their own files; fake kernels live in
// verify_ops/ops.py.
#include <Python.h>
#include <torch/library.h>

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
