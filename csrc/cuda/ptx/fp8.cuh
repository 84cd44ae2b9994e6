// fp8 (e4m3, e5m2) pairs to fp16 pairs, exactly: every fp8 value is an fp16
// value. e5m2 is fp16's top byte, so a byte move converts it; e4m3 takes
// cvt.rn.f16x2.e4m3x2 (sm_89+). In each 32-bit source word, byte i is the
// i-th fp8 value; the result holds the pair's first value in its low half.
#pragma once

#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

namespace verify_ops {

// Values `first` and `second` (byte indices 0-3) of `bytes`, as f16x2.
template <typename KV, int FIRST, int SECOND>
__device__ inline uint32_t fp8_pair_to_half2(uint32_t bytes) {
  if constexpr (std::is_same_v<KV, __nv_fp8_e5m2>) {
    // Each fp16 is the byte followed by a zero byte: 0x?4?4 picks them.
    return __byte_perm(bytes, 0u, 0x0404 | (FIRST << 4) | (SECOND << 12));
  } else {
    static_assert(std::is_same_v<KV, __nv_fp8_e4m3>, "fp8 KV is e4m3 or e5m2");
    const uint32_t pair = __byte_perm(bytes, 0u, 0x4400 | FIRST | (SECOND << 4));
    uint32_t half2 = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(half2) : "h"(static_cast<uint16_t>(pair)));
#else
    __trap();  // the fp8 kernels are launched on sm_89+ only
#endif
    return half2;
  }
}

}  // namespace verify_ops
