// Every argument of the CUDA tree-attention kernels, in one struct.
#pragma once

#include <cstdint>

#include "common/fast_divmod.h"

namespace verify_ops {

// The pool's element type, beside q's own.
enum class KvDtype { kSameAsQ, kFp8E4m3, kFp8E5m2 };

// Which of the op's options a kernel serves. kTotals: the scales, sinks and
// LSE output, which touch only the prologue and the row totals, so the plain
// mainloop runs; the soft-cap and the window change every score and cost the
// other options 7 % when compiled in (sinks and LSE at D16, 64/8/128, 64k,
// H100): kAll. fp8 KV runs kAll (its own mainloop).
enum class OptionSet { kNone, kTotals, kAll };

struct TreeAttnParams {
  // Element strides; the last dim of q, k, v and out is contiguous.
  const void* q;
  int64_t q_stride_token, q_stride_head;
  const void* k;
  const void* v;
  // Bytes from one pool slot to the next: the kernel multiplies a 32-bit slot
  // by them into a 64-bit offset (the host checks that both fit).
  uint32_t k_slot_bytes, v_slot_bytes;
  int64_t k_stride_head, v_stride_head;
  void* out;
  int64_t out_stride_token, out_stride_head;

  // Index tensors are int32 or int64; the flags say which.
  const void* req_to_token;
  int64_t r2t_stride_row, r2t_stride_pos;
  const void* req_pool_indices;
  int64_t rpi_stride;
  const void* seq_lens;
  int64_t lens_stride;
  bool r2t_is_int64, rpi_is_int64, lens_is_int64;

  const bool* tree_mask;
  int64_t mask_stride_batch, mask_stride_row, mask_stride_col;

  // Split-KV partials: the normalized outputs [bs*D*Hq, num_splits, head_dim]
  // in q's dtype, and their LSEs [bs*D*Hq, num_splits] in fp32, in log2 units
  // of the scaled scores. Unused when num_splits == 1 or the splits
  // merge in their cluster (merge_splits_in_cluster).
  void* partial_out;
  float* partial_lse;

  int batch, num_drafts, num_q_heads, num_kv_heads, group;
  int rows_per_kv_head;  // D * group: query rows that share one KV head
  FastDivmod group_div;     // row of a KV head -> (draft, q head within the group)
  FastDivmod q_heads_div;   // q row (token * Hq + head) -> (token, head)
  FastDivmod drafts_div;    // token -> request
  int num_m_tiles;
  int num_splits;        // grid size along the KV sequence (shape-derived)
  int split_min_tokens;  // a split never covers fewer tokens than this
  float scale_log2;      // sm_scale * log2(e), made positive by the host

  // The op's options, read by the option kernels only (OptionSet kTotals or
  // kAll; the plain kernels serve calls that use none). Last, so that the plain
  // kernels' fields keep their offsets.
  const float* k_scale;  // [1] or null (1): scores are scaled by it too
  const float* v_scale;  // [1] or null (1): the output is
  const float* sinks;    // [Hq] natural-log logits in the denominator, or null
  int64_t sinks_stride;
  float* lse;            // [bs*D, Hq] natural-log LSE out, or null
  int64_t lse_stride_token, lse_stride_head;
  float logit_cap;       // > 0: scores become cap * tanh(score / cap); 0: off
  float logit_cap_inverse;  // 1 / logit_cap
  int sliding_window;    // >= 0: keys at logical positions P - W .. P; -1: off
};

}  // namespace verify_ops
