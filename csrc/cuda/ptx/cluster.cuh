// Thread-block clusters (sm_90+): the cluster-wide barrier and reads of
// another CTA's shared memory (distributed shared memory). The host launches
// clusters only for kernels built for sm_90 or newer (resident_clusters).
#pragma once

#include <cstdint>

namespace verify_ops {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define VERIFY_OPS_HAS_CLUSTERS 1
#else
#define VERIFY_OPS_HAS_CLUSTERS 0
#endif

// Every thread of the cluster that has not exited arrives and waits (an
// exited thread no longer holds the barrier up); shared-memory writes before
// it are visible to every CTA of the cluster after it.
__device__ inline void cluster_barrier() {
#if VERIFY_OPS_HAS_CLUSTERS
  asm volatile(
      "barrier.cluster.arrive.release;\n"
      "barrier.cluster.wait.acquire;\n" ::: "memory");
#else
  __trap();
#endif
}

// The address of `addr` (in this CTA's shared memory) in the shared memory
// of the cluster's CTA `rank`.
__device__ inline uint32_t cluster_address(uint32_t addr, uint32_t rank) {
  uint32_t mapped = 0;
#if VERIFY_OPS_HAS_CLUSTERS
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(mapped) : "r"(addr), "r"(rank));
#endif
  return mapped;
}

__device__ inline float load_cluster_f32(uint32_t addr) {
  float v = 0.f;
#if VERIFY_OPS_HAS_CLUSTERS
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(addr));
#endif
  return v;
}

__device__ inline uint4 load_cluster_16(uint32_t addr) {
  uint4 v = make_uint4(0, 0, 0, 0);
#if VERIFY_OPS_HAS_CLUSTERS
  asm volatile("ld.shared::cluster.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr));
#endif
  return v;
}

}  // namespace verify_ops
