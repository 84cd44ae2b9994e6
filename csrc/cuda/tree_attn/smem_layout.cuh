// Where a CTA of the attention kernel keeps things in shared memory: Q, the
// K/V stages, the ring of slot indices and the producer's mbarriers, and how
// 16-byte chunks of a tile's rows are swizzled.
#pragma once

#include <cstdint>

#include "cuda/ptx/wgmma.cuh"

namespace verify_ops {

// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][HEAD_DIM]
// tile. XOR-swizzling the chunk by row % 8 keeps ldmatrix conflict-free.
template <int HEAD_DIM>
__device__ inline uint32_t swizzled_rows(int row, int chunk) {
  return static_cast<uint32_t>(row * HEAD_DIM * 2 + ((chunk ^ (row & 7)) << 4));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of fp8 rows of
// HEAD_DIM bytes. The XOR pattern spreads 8 consecutive rows' same chunk over
// the 8 16-byte bank groups of a 128-byte line, so ldmatrix on them is
// conflict-free at every head dim (two rows share a line at head_dim 64).
template <int HEAD_DIM>
__device__ inline uint32_t swizzled_fp8_rows(int row, int chunk) {
  constexpr int kRowsPerLine = HEAD_DIM >= 128 ? 1 : 128 / HEAD_DIM;
  constexpr int kChunks = HEAD_DIM / 16;
  constexpr int kPattern = (kChunks < 8 ? kChunks : 8) - 1;
  return static_cast<uint32_t>(row * HEAD_DIM + ((chunk ^ ((row / kRowsPerLine) & kPattern)) << 4));
}

template <typename Cfg>
struct SmemLayout {
  // Stage s holds K tile then V tile: the last stage is one span for Q.
  static constexpr uint32_t kTileBytes = Cfg::kTileElems * Cfg::kKVElemBytes;

  uint32_t base;                // aligned to Cfg::kSmemAlign
  unsigned char* base_pointer;  // the same, as a generic pointer

  // wgmma's swizzle atoms need 1024-byte alignment: the base is rounded up
  // (the declared alignment of dynamic shared memory is 128).
  __device__ explicit SmemLayout(unsigned char* smem) {
    const uint32_t unaligned = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    base = Cfg::kSmemAlign == 128
               ? unaligned
               : (unaligned + Cfg::kSmemAlign - 1) & ~(Cfg::kSmemAlign - 1u);
    base_pointer = smem + (base - unaligned);
  }

  __device__ uint32_t kv() const { return base + Cfg::kQSmemElems * 2; }
  __device__ uint32_t k_stage(int stage) const { return kv() + stage * 2 * kTileBytes; }
  __device__ uint32_t v_stage(int stage) const { return k_stage(stage) + kTileBytes; }
  __device__ uint32_t q() const { return Cfg::kQInLastStage ? k_stage(Cfg::kStages - 1) : base; }
  // Slot entries are 8 bytes; the kernel reads the low 32 bits of each (int32
  // slots land there, and the host checks that the pool has < 2^32 slots).
  __device__ uint32_t slot_ring() const { return kv() + Cfg::kKVBytes; }
  __device__ const uint32_t* slot_ring_pointer() const {
    return reinterpret_cast<const uint32_t*>(base_pointer + Cfg::kQSmemElems * 2 +
                                             Cfg::kKVBytes);
  }
  // The producer's "stage full" and the consumers' "stage empty" mbarriers:
  // a stage is full once its K/V tile has landed (the producer's threads
  // arrive), empty once both warpgroups' P V on it are done (each consumer
  // warp arrives).
  __device__ uint32_t barriers() const {
    return slot_ring() + Cfg::kSlotRingTiles * Cfg::kBlockN * 8;
  }
  __device__ uint32_t full_barrier(int tile) const {
    return barriers() + (tile % Cfg::kStages) * 8;
  }
  __device__ uint32_t empty_barrier(int tile) const {
    return barriers() + (Cfg::kStages + tile % Cfg::kStages) * 8;
  }

  // Byte offset of a 16-byte chunk in a K/V tile: wgmma's slabs, or whole
  // rows, which take the mma.sync kernels fewer registers.
  __device__ static uint32_t tile_offset(int row, int chunk) {
    if constexpr (Cfg::kKVElemBytes == 1) return swizzled_fp8_rows<Cfg::kHeadDim>(row, chunk);
    else if constexpr (Cfg::kWarpgroupMma) return swizzled_slabs<Cfg::kBlockN>(row, chunk);
    else return swizzled_rows<Cfg::kHeadDim>(row, chunk);
  }
  // Q is in slabs where wgmma reads it from shared memory, else in whole rows
  // for ldmatrix.
  __device__ static uint32_t q_offset(int row, int chunk) {
    if constexpr (Cfg::kWarpgroupMma && !Cfg::kQAllInRegisters)
      return swizzled_slabs<Cfg::kBlockM>(row, chunk);
    else return swizzled_rows<Cfg::kHeadDim>(row, chunk);
  }
};

}  // namespace verify_ops
