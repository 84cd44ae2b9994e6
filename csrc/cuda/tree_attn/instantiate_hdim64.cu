// The head_dim-64 kernels, in a translation unit of their own so that the
// head dims compile in parallel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/tree_attn/launch.cuh"

namespace verify_ops {

template void launch_tree_attn<__nv_bfloat16, 64>(TreeAttnParams&, const at::Tensor&, int64_t,
                                                    bool, KvDtype, cudaStream_t);
template void launch_tree_attn<__half, 64>(TreeAttnParams&, const at::Tensor&, int64_t,
                                             bool, KvDtype, cudaStream_t);

#if VERIFY_OPS_CTA_STAMPS
template void* cta_stamps_table<64>();
#endif

}  // namespace verify_ops
