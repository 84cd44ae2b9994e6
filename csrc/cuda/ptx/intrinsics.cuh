// Single PTX instructions the kernels pin down where CUDA's own intrinsics
// let the compiler move or widen them.
#pragma once

#include <cstdint>

namespace verify_ops {

// Special registers read afresh (asm volatile), so that the compiler does
// not keep an earlier read live across the main loop instead.
__device__ inline uint32_t special_register_ctaid_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(r));
  return r;
}
__device__ inline uint32_t special_register_ctaid_y() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(r));
  return r;
}
__device__ inline uint32_t special_register_tid_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(r));
  return r;
}

// Stores by shared-memory address: the kernels keep 32-bit shared
// addresses live, not 64-bit generic pointers.
__device__ inline void store_shared(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ inline void store_shared(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}

// A read-only byte load that ptxas may not hoist out of its branch: the
// masked pass would otherwise run, loads and all, on every tile.
__device__ inline unsigned char load_mask_byte(const unsigned char* addr) {
  unsigned short v;
  asm volatile("ld.global.nc.u8 %0, [%1];" : "=h"(v) : "l"(addr));
  return static_cast<unsigned char>(v);
}

// 2^x in one MUFU op; exp2f adds a denormal-range fixup around it, and
// softmax weights below 2^-126 of the row maximum are zero either way.
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1 / x in one MUFU op (flushes denormals; 1 / inf is 0).
__device__ inline float fast_reciprocal(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace verify_ops
