// The merge kernels: they combine the normalized split outputs of each
// (token, q head) row with their LSEs (log2 units of the scaled scores) when
// the splits did not merge in their cluster. partial_out is
// [bs*D*Hq, num_splits, head_dim] in T, partial_lse [bs*D*Hq, num_splits]
// fp32. Few splits take the one-latency kernel; more, the split-parallel one.
#pragma once

#include <cstdint>

#include "cuda/ptx/intrinsics.cuh"
#include "cuda/ptx/pdl.cuh"
#include "cuda/tree_attn/index_loads.cuh"
#include "cuda/tree_attn/merge_limits.h"
#include "cuda/tree_attn/numeric.cuh"
#include "cuda/tree_attn/options.cuh"
#include "cuda/tree_attn/params.h"
#include "cuda/tree_attn/split_plan.cuh"
#include "cuda/tree_attn/tile_config.h"

namespace verify_ops {

// The (token, q head) row a merge warp or CTA owns, and how many splits hold
// partials for it; returns once the attention grid's partials are visible.
struct MergeRow {
  int64_t token;
  int head;
  int active_splits;  // 1: the attention kernel wrote the row itself
};

// The row's coordinates and split count, from the op's inputs only, so that
// a merge kernel may compute them before it waits for the attention grid
// (wait_for_primary_grid). Every merge CTA waits, so that a merge grid never
// completes before the attention grid.
template <int HEAD_DIM, bool OPTIONS>
__device__ inline MergeRow merge_row(const TreeAttnParams& p, int64_t q_row) {
  allow_dependent_launch();  // what the stream runs next may queue behind this grid
  MergeRow row;
  // q_row < 2^31 (the host checks the row count).
  uint32_t token, head;
  p.q_heads_div.divmod(static_cast<uint32_t>(q_row), token, head);
  row.token = token;
  row.head = static_cast<int>(head);
  const int b = static_cast<int>(p.drafts_div.div(token));
  const int64_t prefix = load_index(p.seq_lens, p.lens_is_int64, b * p.lens_stride);
  // The attention kernel's split of the same tokens (with a window, from its start).
  const int64_t total = prefix + p.num_drafts - (OPTIONS ? kv_window_start(p, prefix) : 0);
  row.active_splits =
      plan_splits(total, p.num_splits, p.split_min_tokens, TileConfig<HEAD_DIM>::kBlockN).active;
  return row;
}

// Merges the normalized split outputs of each (token, q head) row with their
// LSEs when one CTA's threads hold a row's splits (few_splits_capacity: 256
// at head_dim 64, 128 at 128, 64 at 256). A row's threads, whole warps, each own
// four of its dims for splits lane_split, lane_split + split lanes, ...
// (at most kFewSplitsPerThread), and load those partials and their LSEs at
// once: the merge costs one L2 latency however many splits there are. Each
// split lane weighs its splits against its own LSE max, so no thread waits
// on another before its sums; with more than one split lane, they combine
// through shared memory.
// With OPTIONS the merged row takes its sink, v_scale and LSE (options.cuh).
template <typename T, int HEAD_DIM, bool OPTIONS = false>
__global__ void __launch_bounds__(kFewSplitThreads)
    merge_few_splits_kernel(const TreeAttnParams p) {
  constexpr int kColumns = HEAD_DIM / 4;  // float4s per row
  static_assert(few_split_lanes(few_splits_capacity(HEAD_DIM), HEAD_DIM) * kColumns <=
                    kFewSplitThreads,
                "a CTA must hold the splits of one row");
  __shared__ float4 lane_acc[kFewSplitThreads];
  __shared__ float2 lane_max_and_sum[kFewSplitThreads];
  const int split_lanes = few_split_lanes(p.num_splits, HEAD_DIM);
  const int row_threads = split_lanes * kColumns;
  const int tid = threadIdx.x;
  const int column = tid % kColumns;
  const int lane_split = tid % row_threads / kColumns;
  const int64_t n_rows = static_cast<int64_t>(p.batch) * p.num_drafts * p.num_q_heads;
  const int64_t q_row = static_cast<int64_t>(blockIdx.x) * (kFewSplitThreads / row_threads) +
                        tid / row_threads;
  MergeRow row{};
  if (q_row < n_rows) row = merge_row<HEAD_DIM, OPTIONS>(p, q_row);
  // Uniform per warp: a warp holds threads of one row only.
  const bool merging = q_row < n_rows && row.active_splits > 1;
  const int active = merging ? row.active_splits : 0;
  // This thread's first split; the next are split_lanes apart.
  const int64_t first = q_row * p.num_splits + lane_split;
  const float* lse = p.partial_lse + first;
  const T* part = static_cast<const T*>(p.partial_out) + first * HEAD_DIM + column * 4;
  // Every CTA has a row (the grid is rounded up by rows), so every CTA waits.
  wait_for_primary_grid();

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float max_lse = -INFINITY, total_weight = 0.f;
  if (merging) {
    uint2 x[kFewSplitsPerThread];
    float split_lse[kFewSplitsPerThread];
    // Running pointers: one 64-bit add per split, no address rebuilt per load.
    const T* part_k = part;
    const float* lse_k = lse;
    const int part_step = split_lanes * HEAD_DIM;
#pragma unroll
    for (int k = 0; k < kFewSplitsPerThread; ++k) {
      // Predicated, not branched: every load issues before any lands.
      const bool in = lane_split + k * split_lanes < active;
      x[k] = in ? load_four(part_k) : make_uint2(0, 0);  // +0.0
      split_lse[k] = in ? *lse_k : -INFINITY;
      part_k += part_step;
      lse_k += split_lanes;
    }
#pragma unroll
    for (int k = 0; k < kFewSplitsPerThread; ++k) max_lse = fmaxf(max_lse, split_lse[k]);
#pragma unroll
    for (int k = 0; k < kFewSplitsPerThread; ++k) {
      if (k * split_lanes >= active) break;
      // Splits where the row sees no key, and all of them: weight 0.
      const float w = max_lse == -INFINITY ? 0.f : fast_exp2(split_lse[k] - max_lse);
      total_weight += w;
      add_scaled(acc, w, four_as_floats<T>(x[k]));
    }
  }
  float reference = max_lse;  // what acc and total_weight are relative to
  if (split_lanes > 1) {  // the same for the whole grid
    lane_acc[tid] = acc;
    lane_max_and_sum[tid] = make_float2(max_lse, total_weight);
    __syncthreads();
    if (!merging || lane_split != 0) return;
    float row_max = max_lse;
    for (int l = 1; l < split_lanes; ++l)
      row_max = fmaxf(row_max, lane_max_and_sum[tid + l * kColumns].x);
    // A split lane without a finite LSE (nor one at all) holds zeros.
    auto scale_to_row = [&](float lane_max) {
      return lane_max == -INFINITY ? 0.f : fast_exp2(lane_max - row_max);
    };
    const float own = scale_to_row(max_lse);
    acc = make_float4(acc.x * own, acc.y * own, acc.z * own, acc.w * own);
    total_weight *= own;
    for (int l = 1; l < split_lanes; ++l) {
      const float2 lane = lane_max_and_sum[tid + l * kColumns];
      const float w = scale_to_row(lane.x);
      add_scaled(acc, w, lane_acc[tid + l * kColumns]);
      total_weight += w * lane.y;
    }
    reference = row_max;
  }
  if (!merging) return;
  float inv = total_weight > 0.f ? 1.f / total_weight : 0.f;
  if constexpr (OPTIONS) {
    const RowTotal total = row_total(total_weight, reference, p, row.head);
    inv = total.inv;
    if (p.lse && column == 0)
      p.lse[row.token * p.lse_stride_token + row.head * p.lse_stride_head] = total.lse;
  }
  T* dst = static_cast<T*>(p.out) + row.token * p.out_stride_token +
           row.head * p.out_stride_head + column * 4;
  *reinterpret_cast<uint2*>(dst) =
      make_uint2(pack_pair<T>(acc.x * inv, acc.y * inv), pack_pair<T>(acc.z * inv, acc.w * inv));
}

// The same for more splits than few_splits_capacity. CTA (row, chunk) owns kMergeDims dims of
// the row; its threads read all splits at once (kSplitLanes splits side by
// side, kMergeUnroll deep), so the partials, which sit in L2, stream at the
// memory's rate rather than its latency.
constexpr int kMergeThreads = 256;
constexpr int kMergeDims = 32;
constexpr int kMergeChunks = kMergeDims / 4;  // float4 per split and CTA
constexpr int kSplitLanes = kMergeThreads / kMergeChunks;
constexpr int kMergeUnroll = 8;
constexpr int kLsePerThread = kMaxSplits / kMergeThreads;

__device__ inline float block_reduce(float x, bool is_max, float* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float y = __shfl_xor_sync(0xffffffff, x, off);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
#pragma unroll
  for (int w = 1; w < kMergeThreads / 32; ++w) x = is_max ? fmaxf(x, scratch[w]) : x + scratch[w];
  __syncthreads();  // scratch is reused by the next reduction
  return x;
}

template <typename T, int HEAD_DIM, bool OPTIONS = false>
__global__ void __launch_bounds__(kMergeThreads)
    merge_splits_kernel(const TreeAttnParams p) {
  const int64_t q_row = blockIdx.x;
  const int dim0 = blockIdx.y * kMergeDims;
  const int tid = threadIdx.x;
  const MergeRow row = merge_row<HEAD_DIM, OPTIONS>(p, q_row);
  wait_for_primary_grid();
  const int active = row.active_splits;
  if (active == 1) return;

  __shared__ float weight[kMaxSplits];
  __shared__ float scratch[kMergeThreads / 32];
  __shared__ __align__(16) float lane_acc[kSplitLanes * kMergeDims];

  const float* lse = p.partial_lse + q_row * p.num_splits;
  float my_lse[kLsePerThread];
  float max_lse = -INFINITY;
#pragma unroll
  for (int i = 0; i < kLsePerThread; ++i) {
    const int s = tid + i * kMergeThreads;
    my_lse[i] = s < active ? lse[s] : -INFINITY;
    max_lse = fmaxf(max_lse, my_lse[i]);
  }
  max_lse = block_reduce(max_lse, true, scratch);
  float my_weight = 0.f;
#pragma unroll
  for (int i = 0; i < kLsePerThread; ++i) {
    const int s = tid + i * kMergeThreads;
    // All splits empty (a row that sees no key): every weight 0, output 0.
    const float w = max_lse == -INFINITY ? 0.f : fast_exp2(my_lse[i] - max_lse);
    if (s < active) weight[s] = w;
    my_weight += w;
  }
  const float total_weight = block_reduce(my_weight, false, scratch);  // also syncs weight[]

  const int chunk = tid % kMergeChunks, lane_split = tid / kMergeChunks;
  const T* part =
      static_cast<const T*>(p.partial_out) + q_row * p.num_splits * HEAD_DIM + dim0 + chunk * 4;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = lane_split; s0 < active; s0 += kSplitLanes * kMergeUnroll) {
    uint2 x[kMergeUnroll];
    float w[kMergeUnroll];
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      const int s = s0 + u * kSplitLanes;
      const bool in = s < active;
      w[u] = in ? weight[s] : 0.f;
      x[u] = in ? load_four(part + static_cast<int64_t>(s) * HEAD_DIM) : make_uint2(0, 0);
    }
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) add_scaled(acc, w[u], four_as_floats<T>(x[u]));
  }
  *reinterpret_cast<float4*>(lane_acc + lane_split * kMergeDims + chunk * 4) = acc;
  __syncthreads();
  if (tid >= kMergeDims) return;
  float sum = 0.f;
#pragma unroll 8
  for (int l = 0; l < kSplitLanes; ++l) sum += lane_acc[l * kMergeDims + tid];
  float inv = total_weight > 0.f ? 1.f / total_weight : 0.f;
  if constexpr (OPTIONS) {
    const RowTotal total = row_total(total_weight, max_lse, p, row.head);
    inv = total.inv;
    if (p.lse && blockIdx.y == 0 && tid == 0)
      p.lse[row.token * p.lse_stride_token + row.head * p.lse_stride_head] = total.lse;
  }
  T* dst = static_cast<T*>(p.out) + row.token * p.out_stride_token + row.head * p.out_stride_head;
  dst[dim0 + tid] = Vec2<T>::one(sum * inv);
}

}  // namespace verify_ops
