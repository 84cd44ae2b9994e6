// Shared-memory barriers of sm_90 for the warp-specialized kernel: mbarriers
// that a producer warpgroup and the consumer warpgroups hand stages through,
// named barriers (among the producer's warps; for the stage that held Q;
// turns on the tensor cores; Q landed), and the register split
// between the two roles (setmaxnreg).
#pragma once

#include <cstdint>

#include "cuda/ptx/wgmma.cuh"

namespace verify_ops {

__device__ inline void mbarrier_init(uint32_t bar, int arrivals) {
#if VERIFY_OPS_HAS_WGMMA
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
#endif
}
// One arrival for the whole (converged) warp, from the lane elect.sync picks:
// no lane index is kept live across the caller's loop (the head_dim-128
// consumers spilled theirs and reloaded it every step).
__device__ inline void mbarrier_arrive_once_per_warp(uint32_t bar) {
#if VERIFY_OPS_HAS_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred leader;\n"
      "elect.sync _|leader, 0xffffffff;\n"
      "@leader mbarrier.arrive.shared::cta.b64 _, [%0];\n"
      "}\n" ::"r"(bar)
      : "memory");
#endif
}
// Arrives once every cp.async this thread has issued so far has landed; the
// arrival counts toward the barrier's expected count (.noinc).
__device__ inline void cp_async_mbarrier_arrive(uint32_t bar) {
#if VERIFY_OPS_HAS_WGMMA
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
#endif
}
// Returns once the phase of parity `parity` has completed.
__device__ inline void mbarrier_wait(uint32_t bar, uint32_t parity) {
#if VERIFY_OPS_HAS_WGMMA
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
#endif
}

// Barrier ID (not 0, which __syncthreads uses) among THREADS threads. The
// id is an immediate: with an id in a register ptxas reserves all 16.
template <int ID, int THREADS>
__device__ inline void named_barrier_sync() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory");
}
// The same for a thread count known only at run time.
template <int ID>
__device__ inline void named_barrier_sync(int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "r"(threads) : "memory");
}
// Counts this thread toward barrier ID without waiting for the others.
template <int ID, int THREADS>
__device__ inline void named_barrier_arrive() {
  asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(THREADS) : "memory");
}
template <int REGISTERS>
__device__ inline void shrink_registers() {
#if VERIFY_OPS_HAS_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
#endif
}
template <int REGISTERS>
__device__ inline void grow_registers() {
#if VERIFY_OPS_HAS_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGISTERS));
#endif
}

}  // namespace verify_ops
