// How a request's KV sequence is cut into splits, and which row tile and
// split each CTA of a grid row owns. Computed on the device from seq_lens, so
// that the grid depends only on shapes (capture-safe).
#pragma once

#include <cstdint>

#include "cuda/tree_attn/params.h"

namespace verify_ops {

__host__ __device__ inline int64_t ceil_div64(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// ceil(a / b) for a >= 0 and b > 0, in 32 bits where both fit: a 64-bit
// division is a call of ~70 instructions on the kernels' critical path.
__device__ inline int64_t ceil_div_nonnegative(int64_t a, int64_t b) {
  if (a <= INT32_MAX && b <= INT32_MAX)
    return (static_cast<uint32_t>(a) + static_cast<uint32_t>(b) - 1) / static_cast<uint32_t>(b);
  return ceil_div64(a, b);
}

// How request b's KV sequence of `total` tokens is cut into splits. Both
// kernels compute this from seq_lens on the device, so the grid stays fixed.
struct SplitPlan {
  int64_t chunk;  // tokens per split, a multiple of the tile size
  int active;     // splits that hold tokens; the rest of the grid exits
};

__device__ inline SplitPlan plan_splits(int64_t total, int num_splits,
                                        int min_tokens, int granularity) {
  int64_t chunk = ceil_div_nonnegative(total, num_splits);
  chunk = ceil_div64(chunk, granularity) * granularity;
  if (chunk < min_tokens) chunk = min_tokens;
  SplitPlan plan;
  plan.chunk = chunk;
  plan.active = static_cast<int>(ceil_div_nonnegative(total, chunk));
  return plan;
}

// The row tile and the split of CTA x of a grid row: the splits of a row
// tile are adjacent where they form a cluster, else the row tiles of a split.
// (X is the caller's integer type, which sets the division's code.)
template <bool CLUSTER_MERGE, typename X>
__device__ inline int m_tile_of(const TreeAttnParams& p, X x) {
  return static_cast<int>(CLUSTER_MERGE ? x / p.num_splits : x % p.num_m_tiles);
}
template <bool CLUSTER_MERGE, typename X>
__device__ inline int split_of(const TreeAttnParams& p, X x) {
  return static_cast<int>(CLUSTER_MERGE ? x % p.num_splits : x / p.num_m_tiles);
}

}  // namespace verify_ops
