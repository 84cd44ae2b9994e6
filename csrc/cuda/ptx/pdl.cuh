// Programmatic dependent launch (sm_90+): each kernel of the op may start
// while the kernel before it in the stream drains (a merge behind its
// attention grid, the next layer's attention behind this layer's merge), and
// waits in wait_for_primary_grid, before it touches global memory, until that
// grid is done. Elsewhere both are no-ops and launches serialize as usual.
#pragma once

namespace verify_ops {

__device__ inline void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ inline void wait_for_primary_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace verify_ops
