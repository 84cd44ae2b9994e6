// CUDA kernel for verify.relocate_kv: dst[i] = src[i] for every layer's K and V
// cache in one launch. blockIdx.y picks the cache, the x dimension strides over
// (slot pair, vector) with the widest vector (up to 16 bytes) that every
// pointer, slot stride and row size allows. Offsets are 64-bit: a pool's byte
// size exceeds 2**31 on real models. Nothing here reads tensor values unless
// VERIFY_OPS_DEBUG=1, so the launch is capture-safe.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/check_message.h"
#include "common/relocate_kv_args.h"
#include "common/debug_checks.h"
#include "ops.h"

namespace verify_ops {
namespace {

constexpr const char* kOp = "verify.relocate_kv";
constexpr int kThreads = 256;
// Cache base pointers travel in the kernel's parameters (no H2D copy, capture
// safe); 448 of them keep the struct under the classic 4 KB parameter limit.
// Models with more than 224 layers take one launch per 448 caches.
constexpr int kMaxCachesPerLaunch = 448;

struct RelocateParams {
  char* bases[kMaxCachesPerLaunch];
  const void* src;
  const void* dst;
  int64_t src_stride, dst_stride;  // elements between consecutive slot indices
  int64_t num_pairs;
  int64_t k_slot_stride, v_slot_stride;  // bytes between consecutive slots
  int64_t k_row_vecs, v_row_vecs;        // vectors per slot row
  int num_k;                             // caches [0, num_k) are K, the rest V
};

template <typename Vec, typename Index>
__global__ void __launch_bounds__(kThreads)
    relocate_kv_kernel(const __grid_constant__ RelocateParams p) {
  const int cache = blockIdx.y;
  const bool is_k = cache < p.num_k;
  const int64_t slot_stride = is_k ? p.k_slot_stride : p.v_slot_stride;
  const int64_t row_vecs = is_k ? p.k_row_vecs : p.v_row_vecs;
  char* base = p.bases[cache];
  const Index* src = static_cast<const Index*>(p.src);
  const Index* dst = static_cast<const Index*>(p.dst);
  const int64_t total = p.num_pairs * row_vecs;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < total;
       i += step) {
    const int64_t pair = i / row_vecs, vec = i - pair * row_vecs;
    const int64_t from = static_cast<int64_t>(src[pair * p.src_stride]);
    const int64_t to = static_cast<int64_t>(dst[pair * p.dst_stride]);
    reinterpret_cast<Vec*>(base + to * slot_stride)[vec] =
        reinterpret_cast<const Vec*>(base + from * slot_stride)[vec];
  }
}

// The widest of 16, 8, 4, 2, 1 bytes dividing every address and size in `values`.
int vector_bytes(const std::vector<uint64_t>& values) {
  uint64_t all = 16;
  for (uint64_t v : values) all |= v;
  return static_cast<int>(all & (~all + 1));  // lowest set bit
}

template <typename Index>
void launch_with_vector(int vec_bytes, const RelocateParams& p, dim3 grid, cudaStream_t stream) {
  switch (vec_bytes) {
    case 16: relocate_kv_kernel<uint4, Index><<<grid, kThreads, 0, stream>>>(p); break;
    case 8: relocate_kv_kernel<uint2, Index><<<grid, kThreads, 0, stream>>>(p); break;
    case 4: relocate_kv_kernel<uint32_t, Index><<<grid, kThreads, 0, stream>>>(p); break;
    case 2: relocate_kv_kernel<uint16_t, Index><<<grid, kThreads, 0, stream>>>(p); break;
    default: relocate_kv_kernel<uint8_t, Index><<<grid, kThreads, 0, stream>>>(p); break;
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace

void relocate_kv_cuda(at::TensorList k_caches, at::TensorList v_caches,
                      const at::Tensor& src_slots, const at::Tensor& dst_slots) {
  const RelocateShape s = check_relocate_kv_args(k_caches, v_caches, src_slots, dst_slots);
  VERIFY_CHECK(k_caches[0].is_cuda(), kOp, ": the CUDA kernel got k_caches[0] on ",
              k_caches[0].device());
  const c10::cuda::CUDAGuard guard(k_caches[0].device());
  if (debug_checks_enabled()) check_relocate_kv_values(s, src_slots, dst_slots);
  if (s.num_pairs == 0) return;

  std::vector<char*> bases;
  for (at::TensorList caches : {k_caches, v_caches})
    for (const at::Tensor& c : caches) bases.push_back(static_cast<char*>(c.data_ptr()));
  const int64_t k_stride = slot_stride_bytes(k_caches[0]);
  const int64_t v_stride = slot_stride_bytes(v_caches[0]);
  const int64_t k_row = row_bytes(k_caches[0]), v_row = row_bytes(v_caches[0]);
  std::vector<uint64_t> sizes = {static_cast<uint64_t>(k_stride), static_cast<uint64_t>(v_stride),
                                 static_cast<uint64_t>(k_row), static_cast<uint64_t>(v_row)};
  for (char* b : bases) sizes.push_back(reinterpret_cast<uint64_t>(b));
  const int vec = vector_bytes(sizes);

  RelocateParams p{};
  p.src = src_slots.data_ptr();
  p.dst = dst_slots.data_ptr();
  p.src_stride = src_slots.stride(0);
  p.dst_stride = dst_slots.stride(0);
  p.num_pairs = s.num_pairs;
  p.k_slot_stride = k_stride;
  p.v_slot_stride = v_stride;
  p.k_row_vecs = k_row / vec;
  p.v_row_vecs = v_row / vec;
  const int64_t most_vecs = s.num_pairs * std::max(p.k_row_vecs, p.v_row_vecs);
  // About four vectors per thread per cache; past 65535 blocks the grid-stride loop takes over.
  const unsigned blocks_x = static_cast<unsigned>(
      std::clamp<int64_t>((most_vecs + 4 * kThreads - 1) / (4 * kThreads), 1, 65535));

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(k_caches[0].get_device()).stream();
  const int num_layers = static_cast<int>(s.num_layers);
  for (int first = 0; first < 2 * num_layers; first += kMaxCachesPerLaunch) {
    const int count = std::min(kMaxCachesPerLaunch, 2 * num_layers - first);
    std::copy(bases.begin() + first, bases.begin() + first + count, p.bases);
    p.num_k = std::clamp(num_layers - first, 0, count);
    const dim3 grid(blocks_x, count);
    if (src_slots.scalar_type() == at::kLong)
      launch_with_vector<int64_t>(vec, p, grid, stream);
    else
      launch_with_vector<int32_t>(vec, p, grid, stream);
  }
}

TORCH_LIBRARY_IMPL(verify, CUDA, m) { m.impl("relocate_kv", &relocate_kv_cuda); }

}  // namespace verify_ops
