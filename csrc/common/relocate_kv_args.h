// Shared declarations for verify.relocate_kv: argument checks and the CPU entry
// point. The schema itself lives in torch_bindings.cpp.
#pragma once

#include <ATen/ATen.h>

namespace verify_ops {

// Sizes derived from validated arguments.
struct RelocateShape {
  int64_t num_layers;  // k_caches.size() == v_caches.size()
  int64_t num_pairs;   // src_slots.size(0) == dst_slots.size(0)
  int64_t pool_size;   // slots per cache (dim 0 of every K and V cache)
};

// Checks list lengths, dtypes, devices, ranks and shapes (never values, so no
// device sync).
RelocateShape check_relocate_kv_args(at::TensorList k_caches, at::TensorList v_caches,
                                     const at::Tensor& src_slots,
                                     const at::Tensor& dst_slots);

// Slots inside the pool, no dst slot twice, src and dst disjoint. Reads tensor
// values, so on CUDA (where that synchronizes) it runs only when
// debug_checks_enabled(); the CPU kernel always runs it.
void check_relocate_kv_values(const RelocateShape& shape, const at::Tensor& src_slots,
                              const at::Tensor& dst_slots);

// Bytes from the start of one slot's row to the next, and bytes in one row.
int64_t slot_stride_bytes(const at::Tensor& cache);
int64_t row_bytes(const at::Tensor& cache);

}  // namespace verify_ops
