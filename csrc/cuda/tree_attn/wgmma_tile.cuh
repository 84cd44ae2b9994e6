// A tile's two products on the warpgroup's tensor cores (sm_90a): S = Q K^T
// and O += P V, issued and committed, not waited for.
#pragma once

#include <cstdint>

#include "cuda/ptx/wgmma.cuh"
#include "cuda/tree_attn/kernel_traits.cuh"
#include "cuda/tree_attn/smem_layout.cuh"

namespace verify_ops {

template <typename T, typename Cfg>
struct WgmmaTile {
  using Traits = KernelTraits<Cfg>;
  static constexpr int kNTiles = Traits::kNTiles;
  using QFrag = uint32_t[Cfg::kQRegisterSteps > 0 ? Cfg::kQRegisterSteps : 1][4];
  using PFrag = uint32_t[kNTiles / 2][4];

  // S = Q K^T of the tile in `stage`: K-major B, A from registers for the
  // first kQRegisterSteps steps of 16 dims and from shared memory past them,
  // each step within a 128-byte swizzle row. `warp` picks the warpgroup's 64
  // rows of Q in shared memory.
  __device__ static void issue_qk(float (&s)[kNTiles][4], const SmemLayout<Cfg>& layout,
                                  const QFrag& q_frag, int warp, int stage) {
    if constexpr (Cfg::kWarpgroupMma) {
      // Offsets within a tile are compile-time constants past its descriptor.
      const uint64_t k_tile_desc = sw128_descriptor(layout.k_stage(stage));
      const uint64_t q_tile_desc =
          sw128_descriptor(layout.q() + SmemLayout<Cfg>::q_offset(warp / 4 * 64, 0));
      wgmma_fence();
      auto k_desc = [&](int ks) {
        return advance_descriptor(k_tile_desc, SmemLayout<Cfg>::tile_offset(0, 2 * ks));
      };
#pragma unroll
      for (int ks = 0; ks < Cfg::kQRegisterSteps; ++ks) {
        if constexpr (Cfg::kBlockN == 64)
          wgmma_m64n64k16<T, false>(s, q_frag[ks], k_desc(ks), ks > 0);
        else
          wgmma_m64n32k16<T>(s, q_frag[ks], k_desc(ks), ks > 0);
      }
      if constexpr (!Cfg::kQAllInRegisters) {
#pragma unroll
        for (int ks = Cfg::kQRegisterSteps; ks < Traits::kKSteps; ++ks)
          wgmma_m64n32k16_ss<T>(
              s, advance_descriptor(q_tile_desc, SmemLayout<Cfg>::q_offset(0, 2 * ks)),
              k_desc(ks), ks > 0);
      }
      wgmma_commit();
    }
  }

  // O += P V of the tile in `stage`, P from registers as 16-bit pairs.
  __device__ static void issue_pv(float (&o)[Traits::kDTiles][4], const SmemLayout<Cfg>& layout,
                                  int stage, const PFrag& p_frag) {
    if constexpr (Cfg::kWarpgroupMma) {
      const uint64_t v_tile_desc = sw128_descriptor(layout.v_stage(stage));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kNTiles / 2; ++kk)
#pragma unroll
        for (int slab = 0; slab < Traits::kHeadDim / 64; ++slab)  // V is MN-major B
          wgmma_m64n64k16<T, true>(
              reinterpret_cast<float(&)[8][4]>(o[8 * slab]), p_frag[kk],
              advance_descriptor(v_tile_desc, SmemLayout<Cfg>::tile_offset(kk * 16, 8 * slab)),
              true);
      wgmma_commit();
    }
  }
};

}  // namespace verify_ops
