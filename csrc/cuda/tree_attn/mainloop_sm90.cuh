// The one-warpgroup wgmma mainloop (sm_90a, 64-row CTAs): per tile, the
// scores go out on the tensor cores together with the last tile's P V, and
// the softmax of this tile overlaps that P V.
#pragma once

#include <cstdint>

#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/tree_attn/kernel_traits.cuh"
#include "cuda/tree_attn/smem_layout.cuh"
#include "cuda/tree_attn/softmax.cuh"
#include "cuda/tree_attn/wgmma_tile.cuh"

namespace verify_ops {

// Inputs: this thread's O and Q fragments, its warp, the split's tiles;
// fold_tile(s, p_frag, tile) is the softmax of a tile (it returns the Fold
// that O takes), refill(tile) the copies issued once the tile is scored.
template <typename T, typename Cfg, typename QFrag, typename FoldTile, typename Refill>
__device__ inline void mainloop_sm90(float (&o)[KernelTraits<Cfg>::kDTiles][4],
                                     const SmemLayout<Cfg>& layout, const QFrag& q_frag, int warp,
                                     int num_tiles, FoldTile&& fold_tile, Refill&& refill) {
  using Traits = KernelTraits<Cfg>;
  using Mma = WgmmaTile<T, Cfg>;
  using PFrag = uint32_t[Traits::kNTiles / 2][4];
  constexpr int kNTiles = Traits::kNTiles;
  // P V of the last tile is issued with this tile's scores.
  PFrag p_frag;
  for (int tile = 0; tile < num_tiles; ++tile) {
    cp_async_wait<Traits::kPrefetch - 1>();  // tile has landed
    fence_shared_for_wgmma();
    __syncthreads();
    float s[kNTiles][4];
    Mma::issue_qk(s, layout, q_frag, warp, tile % Cfg::kStages);
    if (tile > 0) {
      Mma::issue_pv(o, layout, (tile - 1) % Cfg::kStages, p_frag);
      wgmma_wait<1>();  // S is done; the last tile's P V may still run
    } else {
      wgmma_wait<0>();
    }
    pin_registers(s);
    // P goes to registers of its own: the last tile's P V may still read p_frag.
    PFrag p_tile;
    const Fold fold = fold_tile(s, p_tile, tile);
    // The last tile's P V: O may be rescaled, a stage refilled (ptxas 13.0
    // leaves this wait after the softmax, which overlaps that P V).
    wgmma_wait<0>();
    pin_registers(o);
    refill(tile);  // into the stage of tile - 1, or tile - 2 with two warpgroups
    rescale_o(o, fold);
#pragma unroll
    for (int kk = 0; kk < kNTiles / 2; ++kk)
#pragma unroll
      for (int i = 0; i < 4; ++i) p_frag[kk][i] = p_tile[kk][i];
  }
  if (num_tiles > 0) {
    Mma::issue_pv(o, layout, (num_tiles - 1) % Cfg::kStages, p_frag);
    wgmma_wait<0>();
    pin_registers(o);
  }
}

}  // namespace verify_ops
