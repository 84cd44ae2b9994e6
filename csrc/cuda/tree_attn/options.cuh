// The op's options in the option kernels: the sliding window by logical
// position, the logit soft-cap, and the row totals with sinks, v_scale and
// the LSE output. The plain kernels compile none of this.
#pragma once

#include <cstdint>

#include "cuda/ptx/intrinsics.cuh"
#include "cuda/tree_attn/params.h"

namespace verify_ops {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// The first position of a request's KV that any of its drafts sees: the
// root (depth 0) sees from prefix - W. Tiles before it are never read.
__device__ inline int64_t kv_window_start(const TreeAttnParams& p, int64_t prefix) {
  return p.sliding_window >= 0 ? max(int64_t{0}, prefix - p.sliding_window) : 0;
}

// A draft's depth in its tree: the other drafts its mask row shows (its
// ancestors). Draft i sits at position prefix + depth(i), not prefix + i.
__device__ inline int draft_depth(const unsigned char* mask_row, int draft,
                                  const TreeAttnParams& p) {
  int depth = 0;
  for (int j = 0; j < p.num_drafts; ++j)
    depth += j != draft && load_mask_byte(mask_row + j * p.mask_stride_col) != 0;
  return depth;
}

// Soft-caps raw scores in place: s becomes cap * tanh(s * scale / cap) in
// log2 units (so the fold then scales by 1). tanh(x) = 1 - 2 / (e^2x + 1)
// with ex2 and an approximate reciprocal: absolute error ~1e-7, where
// tanh.approx's 2^-11 relative error would move a cap-30 logit by 0.015.
// No division here: one in the loop made the two-warpgroup kernels spill.
template <int N_TILES>
__device__ inline void soft_cap(float (&s)[N_TILES][4], float scale_log2, const TreeAttnParams& p) {
  const float to_exponent = 2.f * scale_log2 * p.logit_cap_inverse;  // 2 x log2(e)
  const float to_log2 = p.logit_cap * kLog2e;
#pragma unroll
  for (int n = 0; n < N_TILES; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float t = fast_exp2(s[n][e] * to_exponent);
      s[n][e] = fmaf(-2.f * to_log2, fast_reciprocal(t + 1.f), to_log2);
    }
}

// The window's mask over a tile (offsets from the split's first token),
// after apply_tree_mask. A row of depth d sees the prefix from offset
// window_shift + d on (window_shift = prefix - W - kv_begin); window_split
// says the split begins before the deepest row's first key. Where the window is shorter than the tree is
// deep, a row also sees only the drafts whose depth is at least its own
// minus W. The depths are counted here, on the few tiles that need them,
// rather than held in registers through the loop.
template <int BLOCK_N, int N_TILES>
__device__ inline void apply_window(float (&s)[N_TILES][4], int tile, int split_prefix,
                                    bool window_split, int window_shift,
                                    const int (&row_draft)[2], const unsigned char* mask_base,
                                    int key0, int t4, const TreeAttnParams& p) {
  const int tile_first = tile * BLOCK_N;
  const int draft_begin = split_prefix - tile_first;
  const bool drafts_limited = p.sliding_window < p.num_drafts - 1;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int depth =
        draft_depth(mask_base + row_draft[h] * p.mask_stride_row, row_draft[h], p);
    const int row_first = window_split ? window_shift + depth : INT32_MIN;
#pragma unroll
    for (int n = 0; n < N_TILES; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + n * 8 + 2 * t4 + e;
        bool visible = key >= draft_begin || tile_first + key >= row_first;
        if (drafts_limited && key >= draft_begin && key - draft_begin < p.num_drafts) {
          const int draft = key - draft_begin;
          visible = draft_depth(mask_base + draft * p.mask_stride_row, draft, p) >=
                    depth - p.sliding_window;
        }
        if (!visible) s[n][2 * h + e] = -INFINITY;
      }
  }
}

// The denominator and LSE of a row whose scores summed to `sum` against
// `row_max` (log2 units), with the row's sink: sum + 2^(sink - max). A row
// that saw no key has sum 0: its output is 0 and its LSE the sink (or -inf).
struct RowTotal {
  float inv;  // v_scale / denominator, or 0
  float lse;  // natural log
};

__device__ inline RowTotal row_total(float sum, float row_max, const TreeAttnParams& p,
                                     int head) {
  const float sink = p.sinks ? p.sinks[head * p.sinks_stride] : -INFINITY;
  const float v_scale = p.v_scale ? *p.v_scale : 1.f;
  RowTotal total;
  if (sum > 0.f) {
    const float denominator = sum + fast_exp2(sink * kLog2e - row_max);
    total.inv = v_scale / denominator;
    total.lse = (row_max + log2f(denominator)) * kLn2;
  } else {
    total.inv = 0.f;
    total.lse = sink;
  }
  return total;
}

}  // namespace verify_ops
