// Every kernel entry point of the verify ops, in one place. The schemas live
// in torch_bindings.cpp; each backend registers these with its own
// TORCH_LIBRARY_IMPL (cpu/, cuda/, or cuda_unavailable/ in CPU-only builds).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace verify_ops {

// verify.tree_attn_out: tree attention into a preallocated out (and lse).
// The functional verify.tree_attn is a composite over it (torch_bindings.cpp).
void tree_attn_out_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& req_to_token,
                       const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                       const at::Tensor& tree_mask, double sm_scale, const at::Tensor& out,
                       const std::optional<at::Tensor>& k_scale,
                       const std::optional<at::Tensor>& v_scale, double logit_cap,
                       const std::optional<at::Tensor>& sinks, int64_t sliding_window,
                       const std::optional<at::Tensor>& lse);
void tree_attn_out_cuda(const at::Tensor& q, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& req_to_token,
                        const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                        const at::Tensor& tree_mask, double sm_scale, const at::Tensor& out,
                        const std::optional<at::Tensor>& k_scale,
                        const std::optional<at::Tensor>& v_scale, double logit_cap,
                        const std::optional<at::Tensor>& sinks, int64_t sliding_window,
                        const std::optional<at::Tensor>& lse);

// verify.relocate_kv: copies slot src_slots[i] to dst_slots[i] in every
// layer's K and V cache.
void relocate_kv_cpu(at::TensorList k_caches, at::TensorList v_caches,
                     const at::Tensor& src_slots, const at::Tensor& dst_slots);
void relocate_kv_cuda(at::TensorList k_caches, at::TensorList v_caches,
                      const at::Tensor& src_slots, const at::Tensor& dst_slots);

}  // namespace verify_ops
