// Per-CTA %globaltimer stamps of the attention grid, for timelines, in builds
// with VERIFY_OPS_CTA_STAMPS=1 only (setup.py); bench/probes/cta_stamps.py reads
// them. Elsewhere the macros compile to nothing. Every call overwrites the
// rows of its CTAs, so after a graph replay they hold its last layer's.
#pragma once

#include <cstdint>

namespace verify_ops {

// The slots of a CTA's row; 5-9 are left for an experiment's own stamps.
constexpr int kStampEntry = 0;        // the kernel starts (before its grid wait)
constexpr int kStampWaited = 1;       // past the wait for the kernel before it
constexpr int kStampLoopEnd = 2;      // thread 0's KV loop is done
constexpr int kStampEnd = 3;          // its rows (output or partials) stored
constexpr int kStampSmAndTiles = 4;   // SM id << 32 | the split's KV tiles
constexpr int kStampSlots = 10;
constexpr int kStampCtas = 1 << 16;   // CTAs past this are not stamped

#if VERIFY_OPS_CTA_STAMPS
__device__ unsigned long long g_cta_stamps[kStampCtas * kStampSlots];

__device__ inline unsigned long long global_timer_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ inline unsigned long long sm_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}
// Thread 0 of the CTA writes `value` to `slot` of the CTA's row.
__device__ inline void cta_stamp(int slot, unsigned long long value) {
  const unsigned cta = blockIdx.y * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0 && cta < kStampCtas) g_cta_stamps[cta * kStampSlots + slot] = value;
}
#define VERIFY_OPS_STAMP(slot) ::verify_ops::cta_stamp((slot), ::verify_ops::global_timer_ns())
#define VERIFY_OPS_STAMP_SM_AND(slot, low) \
  ::verify_ops::cta_stamp((slot), (::verify_ops::sm_id() << 32) | static_cast<uint32_t>(low))
#else
#define VERIFY_OPS_STAMP(slot) ((void)0)
#define VERIFY_OPS_STAMP_SM_AND(slot, low) ((void)0)
#endif

}  // namespace verify_ops
