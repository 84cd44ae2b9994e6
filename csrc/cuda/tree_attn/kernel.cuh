// Split-KV tree-attention kernel on tensor cores: warpgroup MMA (wgmma) on
// sm_90a for 64-row warpgroups, mma.sync m16n8k16 elsewhere.
//
// One CTA owns (request b, KV head h, a tile of up to 64 or 128 of the D*group
// query rows that share h, one split of the KV sequence). Each KV token of the
// split is read once into shared memory and used for all rows of the tile; KV
// tokens are prefix tokens 0..L-1 then draft tokens L..L+D-1, each at the slot
// req_to_token[req_pool_indices[b], pos]. Draft tokens are masked per row by
// tree_mask. Splits write partials (outputs in T, LSEs in fp32) that a merge
// kernel combines (merge_kernels.cuh), or, a few splits to a cluster, merge in
// distributed shared memory (cluster_merge.cuh).
//
// The kernel is a prologue (Q, the split, the pipeline's first copies), one of
// three mainloops (mainloop_sm80, mainloop_sm90, mainloop_sm90_two_warpgroups,
// the last with an optional producer warpgroup, producer_sm90) and the
// epilogue (epilogue.cuh).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/cta_stamps.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/mma.cuh"
#include "cuda/ptx/pdl.cuh"
#include "cuda/tree_attn/epilogue.cuh"
#include "cuda/tree_attn/index_loads.cuh"
#include "cuda/tree_attn/kernel_traits.cuh"
#include "cuda/tree_attn/kv_loader.cuh"
#include "cuda/tree_attn/mainloop_sm80.cuh"
#include "cuda/tree_attn/mainloop_sm80_fp8.cuh"
#include "cuda/tree_attn/mainloop_sm90.cuh"
#include "cuda/tree_attn/mainloop_sm90_two_warpgroups.cuh"
#include "cuda/tree_attn/options.cuh"
#include "cuda/tree_attn/params.h"
#include "cuda/tree_attn/producer_sm90.cuh"
#include "cuda/tree_attn/smem_layout.cuh"
#include "cuda/tree_attn/softmax.cuh"
#include "cuda/tree_attn/split_plan.cuh"
#include "cuda/tree_attn/tile_config.h"

namespace verify_ops {

// OPTIONS: which of the op's options the kernel serves (params.h); kNone is
// the plain kernel, whose code none of them touches.
// KV: the pool's element type, T or an fp8 type (kAll only), whose tiles run
// the fp8 mainloop in fp16 (mainloop_sm80_fp8.cuh).
template <typename T, int HEAD_DIM, int KEY_SPLIT, int WARPS, bool CLUSTER_MERGE,
          OptionSet OPTIONS = OptionSet::kNone, typename KV = T>
__global__ void __launch_bounds__(TileConfig<HEAD_DIM, KEY_SPLIT, WARPS>::kThreads,
                                  TileConfig<HEAD_DIM, KEY_SPLIT, WARPS>::kCtasPerSm)
    tree_attn_kernel(const TreeAttnParams p) {
  constexpr bool kFp8 = sizeof(KV) == 1;
  constexpr bool kOptions = OPTIONS != OptionSet::kNone;
  constexpr bool kScoreOptions = OPTIONS == OptionSet::kAll;  // the soft-cap and the window
  static_assert(!kFp8 || (kScoreOptions && !CLUSTER_MERGE), "fp8 KV runs the kAll kernels");
  static_assert(!kOptions || !CLUSTER_MERGE, "the option kernels never merge in their cluster");
  using Cfg = TileConfig<HEAD_DIM, KEY_SPLIT, WARPS, sizeof(KV)>;
  // The type of P and of the MMAs' 16-bit operands: fp16 where KV is fp8.
  using MmaT = std::conditional_t<kFp8, __half, T>;
  using Traits = KernelTraits<Cfg>;
  constexpr int kBlockN = Cfg::kBlockN;
  extern __shared__ __align__(128) unsigned char smem[];
  // Wait, then let the merge kernel's CTAs queue behind this grid: once they
  // launch, the op's inputs are final, so they may read seq_lens early.
  VERIFY_OPS_STAMP(kStampEntry);
  wait_for_primary_grid();
  VERIFY_OPS_STAMP(kStampWaited);
  allow_dependent_launch();

  const int m_tile = m_tile_of<CLUSTER_MERGE>(p, blockIdx.x);
  const int split = split_of<CLUSTER_MERGE>(p, blockIdx.x);
  const int b = blockIdx.y / p.num_kv_heads;
  const int kv_head = blockIdx.y % p.num_kv_heads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row_warp = warp % Cfg::kRowWarps;  // which 16 query rows
  const int key_group = warp / Cfg::kRowWarps;  // which keys of each tile
  const int key0 = key_group * Cfg::kKeysPerWarp;

  const SmemLayout<Cfg> layout(smem);
  const int row0 = m_tile * Cfg::kBlockM;  // first query row of this tile
  // The index loads issue first, both before either is used: the slot
  // indices wait on them, and Q's copies, which need neither, issue during
  // their latency: 0.1-0.6 us of batch 1 at 4k (H200).
  const int64_t prefix = load_index(p.seq_lens, p.lens_is_int64, b * p.lens_stride);
  const int64_t req_row = load_index(p.req_pool_indices, p.rpi_is_int64, b * p.rpi_stride);
  // Q tile: row r is draft r / group of query head kv_head * group + r % group.
  // With a producer warpgroup the consumers copy it, and the producer goes
  // straight on to the slot indices.
  constexpr int kQThreads = Cfg::kProducerWarps > 0 ? Cfg::kConsumerThreads : Cfg::kThreads;
  const T* q_tile = static_cast<const T*>(p.q) +
                    static_cast<int64_t>(b) * p.num_drafts * p.q_stride_token +
                    static_cast<int64_t>(kv_head) * p.group * p.q_stride_head;
  if (tid < kQThreads) {
    for (int i = tid; i < Cfg::kBlockM * Cfg::kChunks; i += kQThreads) {
      const int r = i / Cfg::kChunks, c = i % Cfg::kChunks;
      const int row = row0 + r;
      const bool valid = row < p.rows_per_kv_head;
      uint32_t draft = 0, head_in_group = 0;
      if (valid) p.group_div.divmod(row, draft, head_in_group);
      const T* src = q_tile + draft * p.q_stride_token + head_in_group * p.q_stride_head + c * 8;
      cp_async_16(layout.q() + SmemLayout<Cfg>::q_offset(r, c), src, valid ? 16 : 0);
    }
  }
  // With a window, the splits cover only the positions it reaches.
  const int64_t seq_start = kScoreOptions ? kv_window_start(p, prefix) : 0;
  const int64_t total = prefix + p.num_drafts - seq_start;
  const SplitPlan plan = plan_splits(total, p.num_splits, p.split_min_tokens, kBlockN);
  if (split >= plan.active) {
    cp_async_commit();  // Q's copies land before the CTA's shared memory is freed
    cp_async_wait<0>();
    return;
  }
  const int64_t kv_begin = seq_start + split * plan.chunk;
  const int64_t kv_end = min(seq_start + total, kv_begin + plan.chunk);
  // The loop works in token offsets within the split, which fit 32 bits: it
  // then keeps no 64-bit positions live and compares in one instruction.
  const int split_tokens = static_cast<int>(kv_end - kv_begin);
  const KvLoader<KV, Cfg, Traits::kWarpSpecialized> loader(p, layout, tid, req_row, kv_begin,
                                                           split_tokens, kv_head);
  const int split_prefix =
      static_cast<int>(min(prefix - kv_begin, static_cast<int64_t>(split_tokens)));
  const int num_tiles = (split_tokens + kBlockN - 1) / kBlockN;

  if constexpr (Traits::kWarpSpecialized) {
    if (tid < Cfg::kStages) {
      mbarrier_init(layout.full_barrier(tid), Cfg::kLoadThreads);
      mbarrier_init(layout.empty_barrier(tid), Cfg::kConsumerThreads / 32);
    }
  }

  // Prologue: Q and the first kSlotLead slot tiles, then kPrefetch KV tiles
  // unless a producer loads them. The producer commits one group per slot
  // tile, so that its wait for tile t's slots waits for those alone, not
  // for the prologue's last; the consumers wait for Q themselves.
  if constexpr (Traits::kWarpSpecialized) {
    for (int t = 0; t < Traits::kSlotLead; ++t) {
      loader.load_slots(t);
      cp_async_commit();
    }
    __syncthreads();  // the mbarriers are initialized
  } else {
    for (int t = 0; t < Traits::kSlotLead; ++t) loader.load_slots(t);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int t = 0; t < Traits::kPrefetch; ++t) {
      if (t < num_tiles) loader.issue_tile(t);
      cp_async_commit();
    }
  }

  if constexpr (Traits::kWarpSpecialized) {
    if (loader.loads) {
      run_producer(loader, layout, num_tiles);
      return;
    }
    grow_registers<Cfg::kConsumerRegisters>();
  }

  // Per thread: rows g and g + 8 of its warp's 16 rows (g = lane / 4).
  const int g = lane / 4, t4 = lane % 4;
  int row_draft[2];
  bool row_valid[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + row_warp * 16 + g + 8 * h;
    row_valid[h] = row < p.rows_per_kv_head;
    row_draft[h] = row_valid[h] ? static_cast<int>(p.group_div.div(row)) : 0;
  }
  const bool warp_active = row0 + row_warp * 16 < p.rows_per_kv_head;
  const unsigned char* mask_base =
      reinterpret_cast<const unsigned char*>(p.tree_mask) + b * p.mask_stride_batch;
  // The options' per-thread state, kept small (each register here is live
  // through the loop): the score scale with k_scale, and for a window the
  // offset of the root's first visible key from kv_begin.
  float scale_log2 = p.scale_log2;
  bool window_split = false;
  int window_shift = 0;
  if constexpr (kOptions) {
    if (p.k_scale) scale_log2 *= *p.k_scale;
  }
  if constexpr (kScoreOptions) {
    // A bf16 Q runs the fp8 kernels in fp16 as q * 2^-8 (fp16_q_in_place).
    if constexpr (kFp8 && std::is_same_v<T, __nv_bfloat16>) scale_log2 *= 256.f;
    // Keys from offset window_shift + depth on are in a row's window: the
    // split needs the window's mask if it begins before the deepest row's
    // first key (splits of at least 64 tokens: the first one, but for D > 64).
    window_shift = static_cast<int>(max(prefix - p.sliding_window - kv_begin, int64_t{-INT32_MAX}));
    window_split = p.sliding_window >= 0 && window_shift + p.num_drafts > 0;
  }

  float o[Traits::kDTiles][4];
#pragma unroll
  for (int i = 0; i < Traits::kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  uint32_t q_frag[Cfg::kQRegisterSteps > 0 ? Cfg::kQRegisterSteps : 1][4];
  auto q_frag_address = [&](int ks) {
    return layout.q() +
           SmemLayout<Cfg>::q_offset(row_warp * 16 + (lane & 15), ks * 2 + (lane >> 4));
  };
  if constexpr (Traits::kWarpSpecialized) {
    cp_async_wait<0>();  // this thread's Q copies
    if constexpr (!Cfg::kQAllInRegisters) fence_shared_for_wgmma();  // wgmma reads Q there
    named_barrier_sync<kQLandedBarrier, Cfg::kConsumerThreads>();  // everyone's
  }
  if constexpr (kFp8) {
    // Q has landed (the prologue waited for every copy): into fp16, in place,
    // then into registers in the permuted k order, where they fit.
    fp16_q_in_place<T, Cfg>(layout.q(), tid);
    __syncthreads();
    if constexpr (Cfg::kQAllInRegisters) {
#pragma unroll
      for (int ks = 0; ks < Traits::kKSteps; ++ks)
        load_permuted_q_fragment<HEAD_DIM>(q_frag[ks], layout.q(), row_warp, lane, ks);
    }
  } else if constexpr (Cfg::kQRegisterSteps > 0) {
#pragma unroll
    for (int ks = 0; ks < Cfg::kQRegisterSteps; ++ks) ldmatrix_x4(q_frag[ks], q_frag_address(ks));
    // A loop step soon refills the stage that held Q.
    if constexpr (Traits::kQStageHandover)
      named_barrier_arrive<kQReadBarrier, Cfg::kThreads>();
    else if constexpr (Cfg::kQInLastStage)
      __syncthreads();
  }

  // One cp.async group: KV tile `tile + kPrefetch`, and slots further ahead.
  auto refill = [&](int tile) {
    if (tile + Traits::kPrefetch < num_tiles) loader.issue_tile(tile + Traits::kPrefetch);
    loader.load_slots(tile + Traits::kSlotLead);
    cp_async_commit();
  };
  // A tile's softmax: the tree mask where the tile needs it, then the fold.
  auto fold_tile = [&](float (&s)[Traits::kNTiles][4], uint32_t (&p_frag)[Traits::kNTiles / 2][4],
                       int tile) {
    if constexpr (kScoreOptions) {
      // Soft-capped scores are in log2 units already: the fold scales by 1.
      const bool capped = p.logit_cap > 0.f;
      if (capped) soft_cap(s, scale_log2, p);
      const bool tree_masked = tile_needs_mask<kBlockN>(tile, split_prefix, split_tokens);
      const bool windowed = p.sliding_window >= 0 &&
                            (tree_masked ||
                             (window_split && tile * kBlockN < window_shift + p.num_drafts));
      const bool masked = tree_masked || windowed;
      if (masked)
        apply_tree_mask<kBlockN>(s, tile, split_prefix, split_tokens, mask_base, row_draft,
                                 row_valid, key0, t4, p);
      if (windowed)
        apply_window<kBlockN>(s, tile, split_prefix, window_split, window_shift, row_draft,
                              mask_base, key0, t4, p);
      return fold_tile_scores<MmaT, Traits::kWgmma>(s, p_frag, tile, masked, row_max, row_sum,
                                                    o, capped ? 1.f : scale_log2);
    } else {
      const bool masked = tile_needs_mask<kBlockN>(tile, split_prefix, split_tokens);
      if (masked)
        apply_tree_mask<kBlockN>(s, tile, split_prefix, split_tokens, mask_base, row_draft,
                                 row_valid, key0, t4, p);
      return fold_tile_scores<T, Traits::kWgmma>(s, p_frag, tile, masked, row_max, row_sum, o,
                                                 kOptions ? scale_log2 : p.scale_log2);
    }
  };

  if constexpr (kFp8) {
    auto q_fragment = [&](int ks, uint32_t (&a)[4]) {
      if constexpr (Cfg::kQAllInRegisters) {
#pragma unroll
        for (int i = 0; i < 4; ++i) a[i] = q_frag[ks][i];
      } else {
        load_permuted_q_fragment<HEAD_DIM>(a, layout.q(), row_warp, lane, ks);
      }
    };
    mainloop_sm80_fp8<KV, Cfg>(o, layout, q_fragment, key0, lane, warp_active, num_tiles,
                               fold_tile, refill);
  } else if constexpr (Traits::kScoresAhead)
    mainloop_sm90_two_warpgroups<T, Cfg>(o, layout, q_frag, warp, num_tiles, fold_tile, refill);
  else if constexpr (Traits::kWgmma)
    mainloop_sm90<T, Cfg>(o, layout, q_frag, warp, num_tiles, fold_tile, refill);
  else
    mainloop_sm80<T, Cfg>(o, layout, q_frag, q_frag_address, key0, lane, warp_active, num_tiles,
                          fold_tile, refill);
  cp_async_wait<0>();
  VERIFY_OPS_STAMP(kStampLoopEnd);
  VERIFY_OPS_STAMP_SM_AND(kStampSmAndTiles, num_tiles);

  if constexpr (KEY_SPLIT > 1) {
    float* exchange = reinterpret_cast<float*>(layout.base_pointer + Cfg::kQSmemElems * 2);
    if (!combine_key_groups<Cfg>(o, row_max, row_sum, exchange, row_warp, lane,
                                 key_group, warp_active))
      return;
  }
  if (!warp_active) return;
  store_rows<T, Cfg, CLUSTER_MERGE, kOptions, kFp8>(p, o, row_max, row_sum, layout.kv(),
                                    plan.active);
}

}  // namespace verify_ops
