// The epilogue's cluster merge: a few splits of one (request, KV head, row
// tile) launched as one thread-block cluster merge their rows through
// distributed shared memory, with no partials in global memory and no merge
// kernel.
#pragma once

#include <cstdint>

#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/intrinsics.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/tree_attn/numeric.cuh"
#include "cuda/tree_attn/params.h"
#include "cuda/tree_attn/kernel_traits.cuh"
#include "cuda/tree_attn/merge_limits.h"
#include "cuda/tree_attn/smem_layout.cuh"

namespace verify_ops {

// The splits of one (request, KV head, row tile), as one cluster
// (CLUSTER_MERGE), merge here instead of through global partials and a
// merge kernel. Each CTA leaves its normalized rows (in T, as the partials
// would hold them) and their LSEs in its own K/V stages; after a cluster
// barrier, CTA `split` reduces its share of the tile's rows, reading every
// active split's through distributed shared memory, and writes them to out.
// The second barrier keeps each CTA's shared memory until the others have
// read it. Called by the threads that hold rows, whole warps: `thread` is
// warp * 32 + lane among them, 32 per 16 rows of the tile that exist; the
// splits past `active` have exited.

template <typename T, int HEAD_DIM, int BLOCK_M, int D_TILES>
__device__ __forceinline__ void merge_splits_in_cluster(
    const TreeAttnParams& p, const float (&o)[D_TILES][4], const float (&row_max)[2],
    const float (&row_sum)[2], uint32_t exchange_smem, int active, int split, int b,
    int kv_head, int row0, int thread) {
  constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row
  const int rows_here = min(BLOCK_M, p.rows_per_kv_head - row0);
  const uint32_t lse_smem = exchange_smem + BLOCK_M * HEAD_DIM * 2;
  const int g = thread % 32 / 4, t4 = thread % 4;
  const int threads = (rows_here + 15) / 16 * 32;
  named_barrier_sync<kClusterMergeBarrier>(threads);  // every warp has left the K/V stages
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = thread / 32 * 16 + g + 8 * h;
    const float sum = quad_sum(row_sum[h]);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;  // a row that sees no key: zeros
    if (row < rows_here) {
      if (t4 == 0)
        store_shared(lse_smem + row * 4, sum > 0.f ? row_max[h] + log2f(sum) : -INFINITY);
      // Swizzled 16-byte chunks: a warp's 32 stores hit 32 banks.
#pragma unroll
      for (int j = 0; j < D_TILES; ++j)
        store_shared(exchange_smem + swizzled_rows<HEAD_DIM>(row, j) + t4 * 4,
                     pack_pair<T>(o[j][2 * h] * inv, o[j][2 * h + 1] * inv));
    }
  }
  cluster_barrier();

  const int rows_per_split = (rows_here + active - 1) / active;
  const int first_row = split * rows_per_split;
  const int units = max(0, min(rows_here - first_row, rows_per_split)) * kChunks;
  for (int u = thread; u < units; u += threads) {
    const int row = first_row + u / kChunks, chunk = u % kChunks;
    const uint32_t lse_at = lse_smem + row * 4;
    const uint32_t rows_at = exchange_smem + swizzled_rows<HEAD_DIM>(row, chunk);
    float lse[kMaxClusterSplits];
    uint4 part[kMaxClusterSplits];
    // Every load issues before any is used: one round trip for all splits.
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      const bool in = s < active;
      lse[s] = in ? load_cluster_f32(cluster_address(lse_at, s)) : -INFINITY;
      part[s] = in ? load_cluster_16(cluster_address(rows_at, s)) : make_uint4(0, 0, 0, 0);
    }
    float max_lse = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) max_lse = fmaxf(max_lse, lse[s]);
    float4 low = make_float4(0.f, 0.f, 0.f, 0.f), high = low;
    float total_weight = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      // Splits where the row sees no key, and all of them: weight 0.
      const float w = max_lse == -INFINITY ? 0.f : fast_exp2(lse[s] - max_lse);
      total_weight += w;
      add_scaled(low, w, four_as_floats<T>(make_uint2(part[s].x, part[s].y)));
      add_scaled(high, w, four_as_floats<T>(make_uint2(part[s].z, part[s].w)));
    }
    const float inv = total_weight > 0.f ? 1.f / total_weight : 0.f;
    uint32_t draft, head_in_group;
    p.group_div.divmod(row0 + row, draft, head_in_group);
    const int64_t token = static_cast<int64_t>(b) * p.num_drafts + draft;
    const int head = kv_head * p.group + static_cast<int>(head_in_group);
    T* dst = static_cast<T*>(p.out) + token * p.out_stride_token + head * p.out_stride_head +
             chunk * 8;
    *reinterpret_cast<uint4*>(dst) =
        make_uint4(pack_pair<T>(low.x * inv, low.y * inv), pack_pair<T>(low.z * inv, low.w * inv),
                   pack_pair<T>(high.x * inv, high.y * inv),
                   pack_pair<T>(high.z * inv, high.w * inv));
  }
  cluster_barrier();
}

}  // namespace verify_ops
