// The fp8-KV mainloop (mma.sync, fp16 math): K and V tiles stay fp8 in shared
// memory, half the bytes of a 16-bit pool, and become fp16 fragments on the
// way into the tensor cores, exactly (every fp8 value is an fp16 value).
//
// ldmatrix reads the fp8 tiles as if their byte pairs were 16-bit elements:
// - K (non-transposed): a thread gets 4 consecutive dims 4t4..4t4+3 of key g
//   in a 16-dim step. Q K^T's k index is permuted to match: the fragment's k
//   = 2t4, 2t4+1, 2t4+8, 2t4+9 hold dims 4t4..4t4+3, and Q's fragments are
//   built with the same permutation (a dot product does not care).
// - V (transposed): a thread gets dims 2g, 2g+1 of keys 2t4, 2t4+1. Byte
//   permutes split them into the B fragments of two output tiles, one over
//   a 16-dim chunk's even dims, one over its odd dims, so O tile 2c + q holds
//   dims 16c + 2j + q. The epilogue writes each thread's 4 adjacent dims.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/fp8.cuh"
#include "cuda/ptx/mma.cuh"
#include "cuda/tree_attn/kernel_traits.cuh"
#include "cuda/tree_attn/smem_layout.cuh"

namespace verify_ops {

// Converts the CTA's Q tile in shared memory to fp16 where q is bf16, each
// 16-byte chunk in place, as q * 2^-8: fp16's range then holds any |q| below
// 2^24 (the kernel scales the scores by 2^8). Called once Q has landed.
template <typename T, typename Cfg>
__device__ inline void fp16_q_in_place(uint32_t q_smem, int tid) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    for (int i = tid; i < Cfg::kBlockM * Cfg::kChunks; i += Cfg::kThreads) {
      const uint32_t addr = q_smem + i * 16;
      uint32_t v[4];
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                   : "r"(addr));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v[j]));
        const __half2 h = __floats2half2_rn(f.x * (1.f / 256.f), f.y * (1.f / 256.f));
        v[j] = *reinterpret_cast<const uint32_t*>(&h);
      }
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v[0]),
                   "r"(v[1]), "r"(v[2]), "r"(v[3])
                   : "memory");
    }
  }
}

// Q (fp16 in shared memory, [rows][HEAD_DIM] in swizzled 16-byte chunks) as
// the A fragment of 16-dim step ks, in the permuted k order above, for rows
// row_warp * 16 + g and + 8.
template <int HEAD_DIM>
__device__ inline void load_permuted_q_fragment(uint32_t (&a)[4], uint32_t q_smem, int row_warp,
                                                int lane, int ks) {
  const int g = lane / 4, t4 = lane % 4;
  const int chunk = 2 * ks + (t4 >> 1);
  const uint32_t within = (t4 & 1) * 8;  // bytes: dims 4t4 % 8 onwards
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const uint32_t row = q_smem + swizzled_rows<HEAD_DIM>(row_warp * 16 + g + 8 * h, chunk);
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(a[h]) : "r"(row + within));
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(a[2 + h]) : "r"(row + within + 4));
  }
}

// Inputs as mainloop_sm80's, with the fp16 Q fragments in the permuted
// order (q_fragment(ks, a) fills step ks's), and O in the split-dim order.
template <typename KV, typename Cfg, typename QFragment, typename FoldTile, typename Refill>
__device__ inline void mainloop_sm80_fp8(float (&o)[KernelTraits<Cfg>::kDTiles][4],
                                         const SmemLayout<Cfg>& layout, QFragment&& q_fragment,
                                         int key0, int lane, bool warp_active, int num_tiles,
                                         FoldTile&& fold_tile, Refill&& refill) {
  using Traits = KernelTraits<Cfg>;
  constexpr int kNTiles = Traits::kNTiles, kKSteps = Traits::kKSteps;
  static_assert(kKSteps % 2 == 0 && Traits::kDTiles % 4 == 0, "fp8 fragments go in pairs");
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
      // Matrix m of an ldmatrix.x4: keys + 8 (m & 1), dims of step + (m >> 1).
      const int matrix = lane >> 3;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ks += 2) {
        uint32_t a[2][4];
        q_fragment(ks, a[0]);
        q_fragment(ks + 1, a[1]);
#pragma unroll
        for (int n2 = 0; n2 < kNTiles / 2; ++n2) {
          uint32_t kb[4];
          const int krow = key0 + n2 * 16 + (matrix & 1) * 8 + (lane & 7);
          ldmatrix_x4(kb, k_stage + SmemLayout<Cfg>::tile_offset(krow, ks + (matrix >> 1)));
#pragma unroll
          for (int m = 0; m < 4; ++m)
            mma_16816<__half>(s[2 * n2 + (m & 1)], a[m >> 1],
                              fp8_pair_to_half2<KV, 0, 1>(kb[m]),
                              fp8_pair_to_half2<KV, 2, 3>(kb[m]));
        }
      }
      uint32_t p_frag[kNTiles / 2][4];
      fold_tile(s, p_frag, tile);
#pragma unroll
      for (int kk = 0; kk < kNTiles / 2; ++kk) {
        const int vrow = key0 + kk * 16 + (matrix & 1) * 8 + (lane & 7);
#pragma unroll
        for (int c2 = 0; c2 < Cfg::kHeadDim / 32; ++c2) {  // two 16-dim chunks at a time
          uint32_t vb[4];
          ldmatrix_x4_trans(vb, v_stage + SmemLayout<Cfg>::tile_offset(vrow, 2 * c2 + (matrix >> 1)));
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int chunk = 2 * c2 + c;
            // vb[2c]: keys 2t4, 2t4 + 1 (b0); vb[2c + 1]: keys 2t4 + 8, + 9 (b1).
            mma_16816<__half>(o[2 * chunk], p_frag[kk],
                              fp8_pair_to_half2<KV, 0, 2>(vb[2 * c]),
                              fp8_pair_to_half2<KV, 0, 2>(vb[2 * c + 1]));
            mma_16816<__half>(o[2 * chunk + 1], p_frag[kk],
                              fp8_pair_to_half2<KV, 1, 3>(vb[2 * c]),
                              fp8_pair_to_half2<KV, 1, 3>(vb[2 * c + 1]));
          }
        }
      }
    }
    __syncthreads();  // the stage is refilled next iteration
  }
}

}  // namespace verify_ops
