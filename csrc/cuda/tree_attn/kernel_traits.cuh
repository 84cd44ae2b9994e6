// What a tile configuration makes of the attention kernel on the device it
// is compiled for: which mainloop runs, how far the pipeline runs ahead, and
// the named barriers its roles meet at.
#pragma once

#include "cuda/ptx/wgmma.cuh"

namespace verify_ops {

// Named barrier ids (0 is __syncthreads): the producer's threads before each
// tile's copies, the hand-over of the stage that held Q, per consumer
// warpgroup g its turn on the tensor cores (kTurnBarrier + g), the consumers
// once Q has landed, and the cluster merge's row holders.
constexpr int kProducerBarrier = 1;
constexpr int kQReadBarrier = 2;
constexpr int kTurnBarrier = 3;
constexpr int kQLandedBarrier = 5;
constexpr int kClusterMergeBarrier = 6;

template <typename Cfg>
struct KernelTraits {
  static constexpr int kHeadDim = Cfg::kHeadDim;
  static constexpr int kKSteps = kHeadDim / 16;
  static constexpr int kNTiles = Cfg::kKeysPerWarp / 8;  // score tiles of 8 keys, per warp
  static constexpr int kDTiles = kHeadDim / 8;           // output tiles of 8 dims
  // The warpgroup MMA needs all four warps, padding rows or not.
  static constexpr bool kWgmma = VERIFY_OPS_HAS_WGMMA && Cfg::kWarpgroupMma;
  // Pipeline: KV tiles run kPrefetch tiles ahead of the one consumed. The
  // group committed at step t holds KV tile t + kPrefetch and the slots of
  // tile t + kPrefetch + kStages (the first group also Q), so slot indices
  // are in shared memory well before the KV copies that need them are
  // issued. Two warpgroups refill only the stage both left a step earlier:
  // one warpgroup may still run its P V on the stage the other has just
  // finished. They also compute the next tile's scores during this one's
  // softmax (kScoresAhead), except at head_dim 256 without a producer
  // warpgroup, where the two sets of score registers spilled: the producer
  // takes the copies' registers. Other devices never launch the producer kernel.
  static constexpr bool kWarpSpecialized = Cfg::kProducerWarps > 0;
  static constexpr bool kTwoWarpgroups = kWgmma && Cfg::kRowWarps == 8;
  static constexpr bool kScoresAhead =
      kTwoWarpgroups && (kHeadDim <= 128 || kWarpSpecialized);
  static constexpr int kPrefetch = kTwoWarpgroups ? Cfg::kStages - 2 : Cfg::kStages - 1;
  static_assert(!kWarpSpecialized || !VERIFY_OPS_HAS_WGMMA || kScoresAhead,
                "the producer feeds the scores-ahead loop only");
  // Slot indices reach shared memory this many tiles before the KV copies
  // that read them (one ring of kSlotRingTiles holds them).
  static constexpr int kSlotLead = kPrefetch + Cfg::kStages;
  static_assert(kSlotLead < Cfg::kSlotRingTiles, "the slot ring is too short");
  // Q held in registers was staged in the last stage: the consumers arrive
  // at kQReadBarrier once they have read it, and the producer waits there
  // before it refills that stage (or at its end, so that the barrier completes).
  static constexpr bool kQStageHandover = kWarpSpecialized && Cfg::kQInLastStage;
};

}  // namespace verify_ops
