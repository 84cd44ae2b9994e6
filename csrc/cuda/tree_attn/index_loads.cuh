// Reads of SGLang's index tensors (req_to_token, req_pool_indices,
// seq_lens), which may be int32 or int64.
#pragma once

#include <cstdint>

namespace verify_ops {

__device__ inline int64_t load_index(const void* p, bool is_int64, int64_t off) {
  return is_int64 ? __ldg(static_cast<const long long*>(p) + off)
                  : static_cast<int64_t>(__ldg(static_cast<const int*>(p) + off));
}

}  // namespace verify_ops
