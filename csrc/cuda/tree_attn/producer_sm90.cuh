// The producer warpgroup of the warp-specialized kernel (sm_90a): it issues
// every K/V copy, and the two consumer warpgroups only compute.
#pragma once

#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/tree_attn/kernel_traits.cuh"
#include "cuda/tree_attn/kv_loader.cuh"
#include "cuda/tree_attn/smem_layout.cuh"

namespace verify_ops {

// Tile t's copies go out once both warpgroups have left the tile kStages
// before it in that stage, and each thread's arrival on the stage's full
// barrier lands with its copies (no wait here, so a tile is never held
// behind a later one). The slot ring is shared among the producer's
// threads: each waits for the group that holds tile t's slots (one group per
// slot tile, from the prologue on), then they meet.
template <typename T, typename Cfg>
__device__ inline void run_producer(const KvLoader<T, Cfg, true>& loader,
                                    const SmemLayout<Cfg>& layout, int num_tiles) {
  using Traits = KernelTraits<Cfg>;
  shrink_registers<Cfg::kProducerRegisters>();
  for (int tile = 0; tile < num_tiles; ++tile) {
    if (tile >= Cfg::kStages)
      mbarrier_wait(layout.empty_barrier(tile), (tile / Cfg::kStages - 1) & 1);
    if (Traits::kQStageHandover && tile == Cfg::kStages - 1)
      named_barrier_sync<kQReadBarrier, Cfg::kThreads>();
    cp_async_wait<Traits::kSlotLead - 1>();  // this tile's slots
    named_barrier_sync<kProducerBarrier, Cfg::kLoadThreads>();
    loader.issue_tile(tile);
    cp_async_mbarrier_arrive(layout.full_barrier(tile));
    loader.load_slots(tile + Traits::kSlotLead);
    cp_async_commit();
  }
  cp_async_wait<0>();  // no copy outlives its thread
  if (Traits::kQStageHandover && num_tiles < Cfg::kStages)
    named_barrier_sync<kQReadBarrier, Cfg::kThreads>();
}

}  // namespace verify_ops
