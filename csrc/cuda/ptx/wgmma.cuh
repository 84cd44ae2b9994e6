// Hopper warpgroup MMA (wgmma, sm_90a only): m64n64k16 with A in registers,
// m64n32k16 with A in registers or shared memory, B in shared memory, the
// fences around them, and the shared-memory layout it reads: a tile of ROWS
// rows of 16-bit elements is stored as slabs of ROWS x 128 bytes (64 elements
// of each row per slab); in a slab, 16-byte chunk c of row r sits at chunk
// c ^ (r % 8), the 128-byte swizzle.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VERIFY_OPS_HAS_WGMMA 1
#else
#define VERIFY_OPS_HAS_WGMMA 0
#endif

namespace verify_ops {

// Byte offset of 16-byte chunk `chunk` of row `row` in a ROWS-row tile.
template <int ROWS>
__host__ __device__ constexpr uint32_t swizzled_slabs(int row, int chunk) {
  return static_cast<uint32_t>((chunk / 8) * ROWS * 128 + row * 128 +
                               (((chunk % 8) ^ (row % 8)) << 4));
}

// Matrix descriptor of a 128-byte-swizzled operand at `addr` (1024-byte
// aligned atoms). One m64n64k16 operand spans one slab along its 64-wide
// dimension, so the only stride used is the one between 8-row atoms, 1024
// bytes; both offset fields carry it.
__device__ inline uint64_t sw128_descriptor(uint32_t addr) {
  constexpr uint64_t kAtomStride = 1024 >> 4;
  constexpr uint64_t kSwizzle128B = 1;
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | kAtomStride << 16 | kAtomStride << 32 |
         kSwizzle128B << 62;
}

// The descriptor of an operand `offset` bytes past the one `desc` describes.
// The start-address field (address / 16, bits 0-13) cannot overflow in shared
// memory (< 256 KB), so adding to the low word is enough: an add per wgmma
// where a descriptor built from an address takes a mask, a shift and an or.
__device__ inline uint64_t advance_descriptor(uint64_t desc, uint32_t offset) {
  const uint32_t low = static_cast<uint32_t>(desc) + (offset >> 4);
  return (desc & 0xFFFFFFFF00000000ull) | low;
}

// The accumulator operands of an m64n64k16 (32) or m64n32k16 (16) wgmma,
// %0..%31 or %0..%15.
#define VERIFY_OPS_WGMMA_D16_OPERANDS                                                        \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),  \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]),             \
      "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
#define VERIFY_OPS_WGMMA_D32_OPERANDS                                                        \
  VERIFY_OPS_WGMMA_D16_OPERANDS, "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), \
      "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]),             \
      "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),             \
      "+f"(d[7][2]), "+f"(d[7][3])
#define VERIFY_OPS_WGMMA_D16_LIST \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
#define VERIFY_OPS_WGMMA_D32_LIST                                                         \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "               \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "

#define VERIFY_OPS_WGMMA_M64N64K16_RS(TYPES)                                            \
  asm volatile("{\n.reg .pred acc;\nsetp.ne.b32 acc, %38, 0;\n"                         \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPES " "                  \
               VERIFY_OPS_WGMMA_D32_LIST "{%32, %33, %34, %35}, %36, acc, 1, 1, %37;\n}\n" \
               : VERIFY_OPS_WGMMA_D32_OPERANDS                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc),               \
                 "n"(TRANS_B ? 1 : 0), "r"(static_cast<int>(accumulate)))

// A's registers, B's descriptor and the accumulate flag are operands 16-19, 20 and 21.
#define VERIFY_OPS_WGMMA_M64N32K16_RS(TYPES)                                            \
  asm volatile("{\n.reg .pred acc;\nsetp.ne.b32 acc, %21, 0;\n"                        \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPES " "                  \
               VERIFY_OPS_WGMMA_D16_LIST "{%16, %17, %18, %19}, %20, acc, 1, 1, 0;\n}\n" \
               : VERIFY_OPS_WGMMA_D16_OPERANDS                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc),               \
                 "r"(static_cast<int>(accumulate)))

// The descriptors and the accumulate flag are operands 16, 17 and 18.
#define VERIFY_OPS_WGMMA_M64N32K16_SS(TYPES)                                            \
  asm volatile("{\n.reg .pred acc;\nsetp.ne.b32 acc, %18, 0;\n"                        \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TYPES " "                  \
               VERIFY_OPS_WGMMA_D16_LIST "%16, %17, acc, 1, 1, 0, 0;\n}\n"             \
               : VERIFY_OPS_WGMMA_D16_OPERANDS                                          \
               : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)))

// d (64 x 64 per warpgroup; per warp, 16 rows in mma.sync's C layout, 8 tiles
// of 8 columns) = A B (+ d if accumulate). A is 64 x 16 in registers, in
// mma.sync's A layout per warp; B is 16 x 64 at b_desc, K-major (each of the
// 64 columns contiguous along k) or, with TRANS_B, MN-major (each of the 16
// rows contiguous).
template <typename T, bool TRANS_B>
__device__ inline void wgmma_m64n64k16(float (&d)[8][4], const uint32_t (&a)[4],
                                       uint64_t b_desc, bool accumulate) {
#if VERIFY_OPS_HAS_WGMMA
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    VERIFY_OPS_WGMMA_M64N64K16_RS("bf16.bf16");
  else
    VERIFY_OPS_WGMMA_M64N64K16_RS("f16.f16");
#endif
}

// d (64 x 32) = A B (+ d) with A in registers, as for m64n64k16, and B
// (16 x 32) K-major.
template <typename T>
__device__ inline void wgmma_m64n32k16(float (&d)[4][4], const uint32_t (&a)[4], uint64_t b_desc,
                                       bool accumulate) {
#if VERIFY_OPS_HAS_WGMMA
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    VERIFY_OPS_WGMMA_M64N32K16_RS("bf16.bf16");
  else
    VERIFY_OPS_WGMMA_M64N32K16_RS("f16.f16");
#endif
}

// d (64 x 32) = A B (+ d) with A (64 x 16, K-major) in shared memory at
// a_desc and B K-major.
template <typename T>
__device__ inline void wgmma_m64n32k16_ss(float (&d)[4][4], uint64_t a_desc, uint64_t b_desc,
                                          bool accumulate) {
#if VERIFY_OPS_HAS_WGMMA
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    VERIFY_OPS_WGMMA_M64N32K16_SS("bf16.bf16");
  else
    VERIFY_OPS_WGMMA_M64N32K16_SS("f16.f16");
#endif
}
#undef VERIFY_OPS_WGMMA_M64N64K16_RS
#undef VERIFY_OPS_WGMMA_M64N32K16_RS
#undef VERIFY_OPS_WGMMA_M64N32K16_SS
#undef VERIFY_OPS_WGMMA_D16_LIST
#undef VERIFY_OPS_WGMMA_D32_LIST
#undef VERIFY_OPS_WGMMA_D16_OPERANDS
#undef VERIFY_OPS_WGMMA_D32_OPERANDS

// Orders earlier register writes (A, accumulators) before the next wgmma.
__device__ inline void wgmma_fence() {
#if VERIFY_OPS_HAS_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ inline void wgmma_commit() {
#if VERIFY_OPS_HAS_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int PENDING>
__device__ inline void wgmma_wait() {
#if VERIFY_OPS_HAS_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
#endif
}

// Accumulators are written by the tensor cores behind the compiler's back:
// pin them so no access moves across wgmma issue or wait. MMA A fragments
// (16-bit pairs) are pinned so that the instructions that compute them stay
// before the next wgmma wait.
__device__ inline void pin_register(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ inline void pin_register(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
template <typename R, int N>
__device__ inline void pin_registers(R (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) pin_register(r[i][j]);
}

// Shared memory written through the generic proxy (st.shared, cp.async) and
// read next by wgmma (the async proxy) needs this in each writing thread,
// before the barrier.
__device__ inline void fence_shared_for_wgmma() {
#if VERIFY_OPS_HAS_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

}  // namespace verify_ops
