// Shared declarations for the tree-attention verify op: argument checks and
// the per-backend entry points. The schema itself lives in torch_bindings.cpp.
#pragma once

#include <ATen/ATen.h>

namespace verify_ops {

// Shapes derived from validated arguments.
struct TreeAttnShape {
  int64_t batch;        // bs
  int64_t num_drafts;   // D
  int64_t num_q_heads;  // Hq
  int64_t num_kv_heads; // Hkv
  int64_t head_dim;     // d
  int64_t pool_size;    // tokens in the KV pool
  int64_t max_context;  // req_to_token.size(1)
  int64_t num_req_rows; // req_to_token.size(0)
};

// Checks dtypes, devices, ranks and shapes (never values, so no device sync).
// `op` names the op in messages. `out` may be undefined (functional variant).
TreeAttnShape check_tree_attn_args(const char* op, const at::Tensor& q,
                                   const at::Tensor& k_cache,
                                   const at::Tensor& v_cache,
                                   const at::Tensor& req_to_token,
                                   const at::Tensor& req_pool_indices,
                                   const at::Tensor& seq_lens,
                                   const at::Tensor& tree_mask,
                                   const at::Tensor& out);

// True when VERIFY_OPS_DEBUG=1: enables the CUDA kernels' checks on index
// values, which sync (the CPU kernels always run them).
bool debug_checks_enabled();

// Checks request indices, prefix lengths and KV slots against their ranges.
// Reads tensor values, so it synchronizes with the device.
void check_tree_attn_values(const char* op, const TreeAttnShape& shape,
                            const at::Tensor& req_to_token,
                            const at::Tensor& req_pool_indices,
                            const at::Tensor& seq_lens);

void tree_attn_out_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                       const at::Tensor& v_cache,
                       const at::Tensor& req_to_token,
                       const at::Tensor& req_pool_indices,
                       const at::Tensor& seq_lens, const at::Tensor& tree_mask,
                       double sm_scale, const at::Tensor& out);

}  // namespace verify_ops
