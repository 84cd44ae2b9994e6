// The two-warpgroup wgmma mainloop (sm_90a, 128-row CTAs), fed by cp.async
// from every thread or, in the warp-specialized kernel, by a producer
// warpgroup (producer_sm90.cuh) through mbarriers. Each warpgroup scores the
// next tile while it does this tile's softmax.
#pragma once

#include <cstdint>

#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/tree_attn/kernel_traits.cuh"
#include "cuda/tree_attn/smem_layout.cuh"
#include "cuda/tree_attn/softmax.cuh"
#include "cuda/tree_attn/wgmma_tile.cuh"

namespace verify_ops {

// Inputs as mainloop_sm90's; with a producer warpgroup, refill is never
// called (the producer copies) and the stages' mbarriers hand tiles over.
template <typename T, typename Cfg, typename QFrag, typename FoldTile, typename Refill>
__device__ inline void mainloop_sm90_two_warpgroups(float (&o)[KernelTraits<Cfg>::kDTiles][4],
                                                    const SmemLayout<Cfg>& layout,
                                                    const QFrag& q_frag, int warp, int num_tiles,
                                                    FoldTile&& fold_tile, Refill&& refill) {
  using Traits = KernelTraits<Cfg>;
  using Mma = WgmmaTile<T, Cfg>;
  using PFrag = uint32_t[Traits::kNTiles / 2][4];
  constexpr int kNTiles = Traits::kNTiles;
  constexpr bool kWarpSpecialized = Traits::kWarpSpecialized;
  // Step t: the scores of tile t + 1 and P V of tile t - 1 run on the tensor
  // cores while the warpgroup does tile t's softmax; then it waits for both,
  // rescales O where a reference max moved, and P V of tile t goes out.
  // Score and P registers alternate between even and odd tiles.
  // The last step also scores a tile past the end, from a stage no copy is
  // writing, and drops it: no branch between the MMAs.
  float s_even[kNTiles][4], s_odd[kNTiles][4];
  PFrag p_even, p_odd;
  // The two warpgroups take turns on the tensor cores (FA3's ping-pong): a
  // turn issues P V of tile t and the scores of tile t + 2, so that one
  // warpgroup's MMAs run while the other does its softmax. Warpgroup 0 goes
  // first; named barrier kTurnBarrier + g is warpgroup g's turn. Each
  // warpgroup drains its wgmmas before its P V, so without turns both would
  // leave the tensor cores idle at once: with the producer at head_dim 128
  // the turns win 1.05x (H200). At head_dim 256, where each warpgroup reads
  // Q from shared memory, they lost 2.6 %.
  constexpr bool kPingPong = kWarpSpecialized && Traits::kHeadDim <= 128;
  const bool first_warpgroup = warp / 4 == 0;
  auto wait_turn = [&]() {
    if constexpr (kPingPong) {
      if (first_warpgroup) named_barrier_sync<kTurnBarrier, Cfg::kConsumerThreads>();
      else named_barrier_sync<kTurnBarrier + 1, Cfg::kConsumerThreads>();
    }
  };
  auto pass_turn = [&]() {
    if constexpr (kPingPong) {
      if (first_warpgroup) named_barrier_arrive<kTurnBarrier + 1, Cfg::kConsumerThreads>();
      else named_barrier_arrive<kTurnBarrier, Cfg::kConsumerThreads>();
    }
  };
  auto step = [&](int tile, float (&s_now)[kNTiles][4], float (&s_next)[kNTiles][4],
                  PFrag& p_now) {
    if constexpr (kWarpSpecialized) {
      if (tile + 1 < num_tiles)
        mbarrier_wait(layout.full_barrier(tile + 1), (tile + 1) / Cfg::kStages & 1);
      fence_shared_for_wgmma();  // the producer's copies, for wgmma's reads
    } else {
      cp_async_wait<Cfg::kStages - 4>();  // tile + 1 has landed
      fence_shared_for_wgmma();
      __syncthreads();  // ... for every thread; both warpgroups left tile - 2
      refill(tile);   // into the stage of tile - 2
    }
    Mma::issue_qk(s_next, layout, q_frag, warp, (tile + 1) % Cfg::kStages);
    if (tile > 0) pass_turn();
    const Fold fold = fold_tile(s_now, p_now, tile);
    // Then wait for the scores of tile + 1 and P V of tile - 1, so that a
    // warp whose rows moved their max can rescale O. A wgmma wait is a
    // warpgroup instruction: waiting only where a max moved needed a vote of
    // the warpgroup's warps, a barrier per step that cost 2-3 % at head_dim
    // 64 and as much as it saved at 128 (H200). ptxas serializes every
    // wgmma (C7514) where O is rescaled with any wgmma in flight. P is
    // pinned first, or ptxas hoists the wait above the exponentials.
    pin_registers(p_now);
    wgmma_wait<0>();
    pin_registers(o);
    pin_registers(s_next);
    if constexpr (kWarpSpecialized) {
      if (tile > 0) mbarrier_arrive_once_per_warp(layout.empty_barrier(tile - 1));
    }
    rescale_o(o, fold);
    wait_turn();
    Mma::issue_pv(o, layout, tile % Cfg::kStages, p_now);
  };
  if (num_tiles > 0) {
    if constexpr (kWarpSpecialized) {
      mbarrier_wait(layout.full_barrier(0), 0);
      fence_shared_for_wgmma();
    } else {
      cp_async_wait<Cfg::kStages - 3>();  // tile 0
      fence_shared_for_wgmma();
      __syncthreads();
    }
    Mma::issue_qk(s_even, layout, q_frag, warp, 0);
    wgmma_wait<0>();
    if (!first_warpgroup) pass_turn();
  }
  // No branch inside the pair: ptxas serializes wgmma (C7513) where register
  // copies at a join touch the P of a P V in flight.
  int tile = 0;
  for (; tile + 1 < num_tiles; tile += 2) {
    step(tile, s_even, s_odd, p_even);
    step(tile + 1, s_odd, s_even, p_odd);
  }
  if (tile < num_tiles) step(tile, s_even, s_odd, p_even);
  // Warpgroup 1's last turn waits for warpgroup 0's last one to end.
  if (num_tiles > 0 && first_warpgroup) pass_turn();
  wgmma_wait<0>();
  pin_registers(o);
}

}  // namespace verify_ops
