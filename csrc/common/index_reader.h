// Reads int32 or int64 index tensors (req_to_token, req_pool_indices,
// seq_lens) of rank 1 or 2 on the host through their strides, with the
// dtype, pointer and strides read once rather than per element.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace verify_ops {

struct IndexReader {
  const void* data;
  bool is_int64;
  int64_t stride0;
  int64_t stride1;

  explicit IndexReader(const at::Tensor& t)
      : data(t.data_ptr()),
        is_int64(t.scalar_type() == at::kLong),
        stride0(t.stride(0)),
        stride1(t.dim() > 1 ? t.stride(1) : 0) {}

  int64_t operator()(int64_t i, int64_t j = 0) const {
    const int64_t off = i * stride0 + j * stride1;
    return is_int64 ? static_cast<const int64_t*>(data)[off]
                    : static_cast<const int32_t*>(data)[off];
  }
};

}  // namespace verify_ops
