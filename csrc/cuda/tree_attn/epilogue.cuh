// The attention kernel's epilogue: each thread's two rows, normalized, go to
// out when the request's KV is one split, else to the split's partials (in T,
// with their LSEs) for a merge kernel, or merge in their cluster.
#pragma once

#include <cstdint>

#include "cuda/cta_stamps.cuh"
#include "cuda/ptx/intrinsics.cuh"
#include "cuda/tree_attn/cluster_merge.cuh"
#include "cuda/tree_attn/numeric.cuh"
#include "cuda/tree_attn/options.cuh"
#include "cuda/tree_attn/params.h"
#include "cuda/tree_attn/split_plan.cuh"

namespace verify_ops {

// With OPTIONS, a row written directly takes its sink, v_scale and LSE here;
// split rows take them in the merge kernel. SPLIT_DIMS: O is in the fp8
// mainloop's order (tile 2c + q holds dims 16c + 2j + q).
template <typename T, typename Cfg, bool CLUSTER_MERGE, bool OPTIONS, bool SPLIT_DIMS,
          int D_TILES>
__device__ inline void store_rows(const TreeAttnParams& p, const float (&o)[D_TILES][4],
                                  const float (&row_max)[2], const float (&row_sum)[2],
                                  uint32_t exchange_smem, int active_splits) {
  const bool direct = active_splits == 1;
  // Where the CTA and the thread are, read again: kept from the start, these
  // values took registers from the loop (the two-warpgroup kernel spilled).
  const uint32_t cta_x = special_register_ctaid_x(), cta_y = special_register_ctaid_y();
  const int out_split = split_of<CLUSTER_MERGE>(p, static_cast<int>(cta_x));
  const int out_b = static_cast<int>(cta_y) / p.num_kv_heads;
  const int out_kv_head = static_cast<int>(cta_y) % p.num_kv_heads;
  const uint32_t out_tid = special_register_tid_x();
  const int out_m_tile = m_tile_of<CLUSTER_MERGE>(p, static_cast<int>(cta_x));
  if constexpr (CLUSTER_MERGE) {
    if (!direct) {
      merge_splits_in_cluster<T, Cfg::kHeadDim, Cfg::kBlockM>(
          p, o, row_max, row_sum, exchange_smem, active_splits, out_split, out_b, out_kv_head,
          out_m_tile * Cfg::kBlockM,
          static_cast<int>(out_tid / 32 % Cfg::kRowWarps * 32 + out_tid % 32));
      VERIFY_OPS_STAMP(kStampEnd);
      return;
    }
  }
  const int quad_lane = static_cast<int>(out_tid % 4);
  const int out_row0 = out_m_tile * Cfg::kBlockM +
                       static_cast<int>(out_tid / 32 % Cfg::kRowWarps) * 16 +
                       static_cast<int>(out_tid % 32 / 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_sum(row_sum[h]);
    // A row that sees no key outputs zeros.
    float inv = sum > 0.f ? 1.f / sum : 0.f;
    T* dst = nullptr;
    const int row = out_row0 + 8 * h;
    if (row < p.rows_per_kv_head) {
      uint32_t draft, head_in_group;
      p.group_div.divmod(row, draft, head_in_group);
      const int64_t token = static_cast<int64_t>(out_b) * p.num_drafts + draft;
      const int head = out_kv_head * p.group + static_cast<int>(head_in_group);
      if (direct) {
        dst = static_cast<T*>(p.out) + token * p.out_stride_token + head * p.out_stride_head;
        if constexpr (OPTIONS) {
          const RowTotal total = row_total(sum, row_max[h], p, head);
          inv = total.inv;
          if (p.lse && quad_lane == 0)
            p.lse[token * p.lse_stride_token + head * p.lse_stride_head] = total.lse;
        }
      } else {
        const int64_t partial = (token * p.num_q_heads + head) * p.num_splits + out_split;
        dst = static_cast<T*>(p.partial_out) + partial * Cfg::kHeadDim;
        if (quad_lane == 0)
          p.partial_lse[partial] = sum > 0.f ? row_max[h] + log2f(sum) : -INFINITY;
      }
    }
    if constexpr (SPLIT_DIMS) {
      // Each lane holds dims 16c + 4 lane .. + 3 of chunk c: whole 32-byte
      // sectors per quad with no exchange.
#pragma unroll
      for (int c = 0; c < D_TILES / 2; ++c)
        if (dst)
          *reinterpret_cast<uint2*>(dst + 16 * c + 4 * quad_lane) =
              make_uint2(pack_pair<T>(o[2 * c][2 * h] * inv, o[2 * c + 1][2 * h] * inv),
                         pack_pair<T>(o[2 * c][2 * h + 1] * inv, o[2 * c + 1][2 * h + 1] * inv));
      continue;
    }
    // A quad holds a row's 16 columns of tiles 2j and 2j + 1 as 4-byte pairs.
    // Two exchanges give each lane 4 adjacent columns, so that the quad writes
    // whole 32-byte sectors: the L2 merges 16-byte pieces with a
    // read-modify-write each: with 2-byte partials, 1.04x over 100 cases (H200).
    const int odd_tile = quad_lane >> 1, high_cols = quad_lane & 1;
#pragma unroll
    for (int j = 0; j < D_TILES / 2; ++j) {
      const uint32_t even = pack_pair<T>(o[2 * j][2 * h] * inv, o[2 * j][2 * h + 1] * inv);
      const uint32_t odd =
          pack_pair<T>(o[2 * j + 1][2 * h] * inv, o[2 * j + 1][2 * h + 1] * inv);
      // Lanes 0-1 gather tile 2j, lanes 2-3 tile 2j + 1: each keeps its own
      // pair of that tile and takes its partner's (lane ^ 2).
      const uint32_t kept = odd_tile ? odd : even;
      const uint32_t taken = __shfl_xor_sync(0xffffffff, odd_tile ? even : odd, 2);
      const uint32_t low = odd_tile ? taken : kept, high = odd_tile ? kept : taken;
      // Then lanes 0 and 2 keep columns 0-3 of their tile, lanes 1 and 3 columns 4-7.
      const uint32_t other = __shfl_xor_sync(0xffffffff, high_cols ? low : high, 1);
      if (dst)
        *reinterpret_cast<uint2*>(dst + (2 * j + odd_tile) * 8 + 4 * high_cols) =
            high_cols ? make_uint2(other, high) : make_uint2(low, other);
    }
  }
  VERIFY_OPS_STAMP(kStampEnd);
}

}  // namespace verify_ops
