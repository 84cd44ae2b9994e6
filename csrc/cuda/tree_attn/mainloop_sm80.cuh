// The mma.sync mainloop (sm_80+, and every kernel whose warps split each KV
// tile's keys): per tile, S = Q K^T from ldmatrix fragments, the softmax, and
// O += P V, with K/V stages refilled by all threads through cp.async. Then
// the key groups' partial softmax states fold into key group 0.
#pragma once

#include <cstdint>

#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/intrinsics.cuh"
#include "cuda/ptx/mma.cuh"
#include "cuda/tree_attn/kernel_traits.cuh"
#include "cuda/tree_attn/smem_layout.cuh"

namespace verify_ops {

// Inputs: this thread's O, Q fragments (or, where Q stays in shared memory,
// q_frag_address(ks) for ldmatrix), the warp's first key of each tile and its
// lane; fold_tile(s, p_frag, tile) is the softmax of a tile, refill(tile) the
// copies issued at its start. Warps whose rows are all padding skip the math.
template <typename T, typename Cfg, typename QFrag, typename QFragAddress, typename FoldTile,
          typename Refill>
__device__ inline void mainloop_sm80(float (&o)[KernelTraits<Cfg>::kDTiles][4],
                                     const SmemLayout<Cfg>& layout, const QFrag& q_frag,
                                     QFragAddress&& q_frag_address, int key0, int lane,
                                     bool warp_active, int num_tiles, FoldTile&& fold_tile,
                                     Refill&& refill) {
  using Traits = KernelTraits<Cfg>;
  constexpr int kNTiles = Traits::kNTiles, kDTiles = Traits::kDTiles;
  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % Cfg::kStages;
    refill(tile);  // into the stage consumed last step
    cp_async_wait<Cfg::kStages - 1>();
    __syncthreads();
    if (warp_active) {
      const uint32_t k_stage = layout.k_stage(stage);
      const uint32_t v_stage = layout.v_stage(stage);
      float s[kNTiles][4];
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < Traits::kKSteps; ++ks) {
        uint32_t a_reg[4];
        if constexpr (Cfg::kQAllInRegisters) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a_reg[i] = q_frag[ks][i];
        } else {
          ldmatrix_x4(a_reg, q_frag_address(ks));
        }
#pragma unroll
        for (int n2 = 0; n2 < kNTiles / 2; ++n2) {
          uint32_t kb[4];
          const int krow = key0 + n2 * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(kb, k_stage + SmemLayout<Cfg>::tile_offset(krow, ks * 2 + ((lane >> 3) & 1)));
          mma_16816<T>(s[2 * n2], a_reg, kb[0], kb[1]);
          mma_16816<T>(s[2 * n2 + 1], a_reg, kb[2], kb[3]);
        }
      }
      uint32_t p_frag[kNTiles / 2][4];
      fold_tile(s, p_frag, tile);
#pragma unroll
      for (int kk = 0; kk < kNTiles / 2; ++kk) {
        const int vrow = key0 + kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
        for (int d2 = 0; d2 < kDTiles / 2; ++d2) {
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_stage + SmemLayout<Cfg>::tile_offset(vrow, d2 * 2 + (lane >> 4)));
          mma_16816<T>(o[2 * d2], p_frag[kk], vb[0], vb[1]);
          mma_16816<T>(o[2 * d2 + 1], p_frag[kk], vb[2], vb[3]);
        }
      }
    }
    __syncthreads();  // the stage is refilled next iteration
  }
}

// Folds the other key groups' softmax state (O, max, sum) into key group 0,
// lane by lane (same fragment layout), through the now idle K/V stages at
// `exchange`. Returns false for the threads of other key groups, which are done.
template <typename Cfg>
__device__ inline bool combine_key_groups(float (&o)[KernelTraits<Cfg>::kDTiles][4],
                                          float (&row_max)[2], float (&row_sum)[2],
                                          float* exchange, int row_warp, int lane, int key_group,
                                          bool warp_active) {
  constexpr int kDTiles = KernelTraits<Cfg>::kDTiles;
  __syncthreads();  // the last slot copies have landed; smem is free
  constexpr int kLaneFloats = Cfg::kStateFloats;
  auto state_of = [&](int group) {
    return exchange + ((group - 1) * Cfg::kRowWarps + row_warp) * 32 * kLaneFloats + lane;
  };
  if (key_group > 0 && warp_active) {
    float* mine = state_of(key_group);
#pragma unroll
    for (int i = 0; i < kDTiles; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) mine[(i * 4 + j) * 32] = o[i][j];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mine[(kDTiles * 4 + h) * 32] = row_max[h];
      mine[(kDTiles * 4 + 2 + h) * 32] = row_sum[h];
    }
  }
  __syncthreads();
  if (key_group > 0) return false;
  if (warp_active) {
#pragma unroll
    for (int group = 1; group < Cfg::kKeySplit; ++group) {
      const float* theirs = state_of(group);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float their_max = theirs[(kDTiles * 4 + h) * 32];
        const float both = fmaxf(row_max[h], their_max);
        const float ref = both == -INFINITY ? 0.f : both;
        const float mine_scale = fast_exp2(row_max[h] - ref);
        const float their_scale = fast_exp2(their_max - ref);
        row_max[h] = both;
        row_sum[h] = row_sum[h] * mine_scale + theirs[(kDTiles * 4 + 2 + h) * 32] * their_scale;
#pragma unroll
        for (int i = 0; i < kDTiles; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            o[i][2 * h + e] = o[i][2 * h + e] * mine_scale + theirs[(i * 4 + 2 * h + e) * 32] * their_scale;
      }
    }
  }
  return true;
}

}  // namespace verify_ops
