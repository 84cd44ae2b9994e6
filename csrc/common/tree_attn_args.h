// The arguments of verify.tree_attn_out as the backends see them: shapes
// derived from checked tensors, the keyword options, and their checks. The
// schema lives in torch_bindings.cpp; the Python fake kernel
// (verify_ops/ops.py) mirrors these checks message for message.
#pragma once

#include <ATen/ATen.h>

#include <optional>

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

// The op's keyword options; each default keeps plain attention.
struct TreeAttnOptions {
  std::optional<at::Tensor> k_scale;  // [1] fp32: scores are sm_scale * k_scale * q.k
  std::optional<at::Tensor> v_scale;  // [1] fp32: out is v_scale * P.V
  double logit_cap = 0;               // > 0: scores become cap * tanh(score / cap)
  std::optional<at::Tensor> sinks;    // [Hq] fp32 logits in the softmax denominator only
  int64_t sliding_window = -1;        // >= 0: keys at logical positions >= P - W
  std::optional<at::Tensor> lse;      // [bs*D, Hq] fp32 output: natural-log LSE

  bool has_sinks() const { return sinks.has_value() && sinks->defined(); }
  bool has_lse() const { return lse.has_value() && lse->defined(); }
  bool windowed() const { return sliding_window >= 0; }
  bool capped() const { return logit_cap > 0; }
};

// True for the fp8 dtypes a KV cache may have beside q's own.
bool is_fp8_kv(at::ScalarType dtype);

// Checks dtypes, devices, ranks and shapes of the tensors and the options
// (never values, so no device sync). `op` names the op in messages. `out`
// may be undefined (the functional variant checks before it allocates).
TreeAttnShape check_tree_attn_args(const char* op, const at::Tensor& q,
                                   const at::Tensor& k_cache,
                                   const at::Tensor& v_cache,
                                   const at::Tensor& req_to_token,
                                   const at::Tensor& req_pool_indices,
                                   const at::Tensor& seq_lens,
                                   const at::Tensor& tree_mask,
                                   const at::Tensor& out,
                                   const TreeAttnOptions& options);

// Checks request indices, prefix lengths and KV slots against their ranges.
// Reads tensor values, so it synchronizes with the device.
void check_tree_attn_values(const char* op, const TreeAttnShape& shape,
                            const at::Tensor& req_to_token,
                            const at::Tensor& req_pool_indices,
                            const at::Tensor& seq_lens);

}  // namespace verify_ops
