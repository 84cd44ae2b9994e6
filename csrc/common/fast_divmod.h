// Division by a divisor fixed for the whole launch, as a multiply-high and a
// shift: the kernels' per-row index math (rows -> draft, q head) would
// otherwise cost a ~25-instruction integer division each time.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define VERIFY_OPS_HOST_DEVICE __host__ __device__
#else
#define VERIFY_OPS_HOST_DEVICE
#endif

namespace verify_ops {

// The divisor must lie in [1, 2^31].
struct FastDivmod {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;  // floor(2^32 (2^shift - divisor) / divisor) + 1
  uint32_t shift = 0;       // ceil(log2(divisor))

  FastDivmod() = default;
  explicit FastDivmod(uint32_t d) : divisor(d) {
    while ((uint64_t{1} << shift) < d) ++shift;
    multiplier = static_cast<uint32_t>(
        ((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  // Exact for every 32-bit n and divisor >= 1 (the sum needs 33 bits).
  VERIFY_OPS_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t high = __umulhi(n, multiplier);
#else
    const uint32_t high = static_cast<uint32_t>((uint64_t{n} * multiplier) >> 32);
#endif
    return static_cast<uint32_t>((uint64_t{high} + n) >> shift);
  }
  VERIFY_OPS_HOST_DEVICE void divmod(uint32_t n, uint32_t& quotient, uint32_t& remainder) const {
    quotient = div(n);
    remainder = n - quotient * divisor;
  }
};

}  // namespace verify_ops
