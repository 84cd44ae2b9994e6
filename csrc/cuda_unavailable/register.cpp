// Linked only into CPU-only builds: CUDA tensors get a clear error instead of
// the dispatcher's generic "no kernel for backend" message.
#include <torch/library.h>

#include <optional>

namespace {

[[noreturn]] void cuda_not_built(const char* op) {
  TORCH_CHECK(false, op,
              ": this build of verify_ops has no CUDA kernel. "
              "Rebuild with a CUDA build of torch and a CUDA toolkit "
              "(CUDA_HOME), or set VERIFY_OPS_BUILD_CUDA=1 to require it.");
}

void tree_attn_out_unavailable(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, const at::Tensor&, const at::Tensor&,
                               const at::Tensor&, double, const at::Tensor&,
                               const std::optional<at::Tensor>&,
                               const std::optional<at::Tensor>&, double,
                               const std::optional<at::Tensor>&, int64_t,
                               const std::optional<at::Tensor>&) {
  cuda_not_built("verify.tree_attn");
}

void relocate_kv_unavailable(at::TensorList, at::TensorList, const at::Tensor&,
                             const at::Tensor&) {
  cuda_not_built("verify.relocate_kv");
}

}  // namespace

TORCH_LIBRARY_IMPL(verify, CUDA, m) {
  m.impl("tree_attn_out", &tree_attn_out_unavailable);
  m.impl("relocate_kv", &relocate_kv_unavailable);
}
