// The copies of a split's K/V tiles into the CTA's stages: each tile's slot
// indices first (from req_to_token into a ring in shared memory, kSlotLead
// tiles ahead), then each slot's K and V rows by cp.async, so KV is read in
// place wherever SGLang put it (no gather).
#pragma once

#include <cstdint>

#include "cuda/ptx/cp_async.cuh"
#include "cuda/tree_attn/params.h"
#include "cuda/tree_attn/smem_layout.cuh"

namespace verify_ops {

// KV: the pool's element type (q's dtype or fp8).
template <typename KV, typename Cfg, bool WARP_SPECIALIZED>
struct KvLoader {
  static constexpr int kChunkElems = 16 / sizeof(KV);
  static constexpr int kBlockN = Cfg::kBlockN;
  const TreeAttnParams& p;
  const SmemLayout<Cfg>& layout;
  const uint32_t* slot_ring;
  int r2t_bytes;
  // Loading thread load_tid < kBlockN loads position kv_begin + tile * kBlockN
  // + load_tid; with a producer warpgroup only its threads load.
  bool loads;
  int load_tid;
  const char* r2t_row;
  const char* my_slots;
  int64_t slots_per_tile_bytes;
  int split_tokens;  // KV tokens of this split
  // Each thread copies chunk `load_chunk` of rows load_row0 + j * kRowsPerPass.
  int load_chunk;
  int load_row0;
  const char* k_head;
  const char* v_head;

  __device__ KvLoader(const TreeAttnParams& params, const SmemLayout<Cfg>& smem, int tid,
                      int64_t req_row, int64_t kv_begin, int tokens, int kv_head)
      : p(params), layout(smem), slot_ring(smem.slot_ring_pointer()),
        r2t_bytes(params.r2t_is_int64 ? 8 : 4),
        loads(!WARP_SPECIALIZED || tid >= Cfg::kConsumerThreads),
        load_tid(WARP_SPECIALIZED ? (loads ? tid - Cfg::kConsumerThreads : 0) : tid),
        r2t_row(static_cast<const char*>(params.req_to_token) +
                req_row * params.r2t_stride_row * r2t_bytes),
        my_slots(r2t_row + (kv_begin + load_tid) * params.r2t_stride_pos * r2t_bytes),
        slots_per_tile_bytes(kBlockN * params.r2t_stride_pos * r2t_bytes),
        split_tokens(tokens),
        load_chunk(load_tid % Cfg::kKVChunks),
        load_row0(load_tid / Cfg::kKVChunks),
        k_head(reinterpret_cast<const char*>(static_cast<const KV*>(params.k) +
                                             kv_head * params.k_stride_head +
                                             load_chunk * kChunkElems)),
        v_head(reinterpret_cast<const char*>(static_cast<const KV*>(params.v) +
                                             kv_head * params.v_stride_head +
                                             load_chunk * kChunkElems)) {}

  // The slot indices of `tile` into its ring entry (zero past the split).
  __device__ void load_slots(int tile) const {
    if (loads && load_tid < kBlockN) {
      const int offset = tile * kBlockN + load_tid;  // from kv_begin
      const bool valid = offset < split_tokens;
      const int entry = (tile % Cfg::kSlotRingTiles) * kBlockN + load_tid;
      const char* src = valid ? my_slots + tile * slots_per_tile_bytes : r2t_row;
      const int bytes = valid ? r2t_bytes : 0;
      if (p.r2t_is_int64)
        cp_async_8(layout.slot_ring() + entry * 8, src, bytes);
      else
        cp_async_4(layout.slot_ring() + entry * 8, src, bytes);
    }
  }

  // The K and V rows of `tile` into its stage (zero past the split); its
  // slot indices must have landed.
  __device__ void issue_tile(int tile) const {
    const int stage = tile % Cfg::kStages;
    const uint32_t* ring = slot_ring + 2 * (tile % Cfg::kSlotRingTiles) * kBlockN;
    const int rows_left = split_tokens - tile * kBlockN;
    // A producer thread's rows lie a multiple of 8 apart at head_dim 64 and
    // 128, so they share their swizzle and one offset serves them all: offsets
    // computed row by row spilled the head_dim-64 producer's 24 registers.
    constexpr bool kOneOffset = WARP_SPECIALIZED && Cfg::kRowsPerPass % 8 == 0;
    const uint32_t first_off = SmemLayout<Cfg>::tile_offset(load_row0, load_chunk);
#pragma unroll
    for (int j = 0; j < Cfg::kLoadRows; ++j) {
      const int r = load_row0 + j * Cfg::kRowsPerPass;
      const bool valid = r < rows_left;
      const uint32_t slot = valid ? ring[2 * r] : 0;
      const uint32_t off = kOneOffset
                               ? first_off + SmemLayout<Cfg>::tile_offset(j * Cfg::kRowsPerPass, 0)
                               : SmemLayout<Cfg>::tile_offset(r, load_chunk);
      // One wide multiply-add each: 32-bit slot times 32-bit bytes, 64-bit sum.
      cp_async_16(layout.k_stage(stage) + off,
                  k_head + static_cast<uint64_t>(slot) * p.k_slot_bytes, valid ? 16 : 0);
      cp_async_16(layout.v_stage(stage) + off,
                  v_head + static_cast<uint64_t>(slot) * p.v_slot_bytes, valid ? 16 : 0);
    }
  }
};

}  // namespace verify_ops
