// CPU kernel for verify.relocate_kv: dst[i] = src[i] for every layer's K and V
// cache, one memcpy per (cache, slot pair), in parallel.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "common/check_message.h"
#include "common/relocate_kv_args.h"
#include "common/debug_checks.h"
#include "ops.h"

namespace verify_ops {

void relocate_kv_cpu(at::TensorList k_caches, at::TensorList v_caches,
                     const at::Tensor& src_slots, const at::Tensor& dst_slots) {
  const RelocateShape s = check_relocate_kv_args(k_caches, v_caches, src_slots, dst_slots);
  VERIFY_CHECK(k_caches[0].device().is_cpu(), "verify.relocate_kv: the CPU kernel got ",
              "k_caches[0] on ", k_caches[0].device());
  check_relocate_kv_values(s, src_slots, dst_slots);  // always: no device to sync with
  if (s.num_pairs == 0) return;

  // Rows move as bytes: the op never looks at the dtype beyond its size.
  std::vector<char*> bases;
  std::vector<int64_t> strides, rows;
  for (at::TensorList caches : {k_caches, v_caches}) {
    for (const at::Tensor& c : caches) {
      bases.push_back(static_cast<char*>(c.data_ptr()));
      strides.push_back(slot_stride_bytes(c));
      rows.push_back(row_bytes(c));
    }
  }
  const auto src = src_slots.to(at::kLong).contiguous();
  const auto dst = dst_slots.to(at::kLong).contiguous();
  const int64_t* src_ptr = src.data_ptr<int64_t>();
  const int64_t* dst_ptr = dst.data_ptr<int64_t>();
  const int64_t n = s.num_pairs;
  const int64_t num_caches = static_cast<int64_t>(bases.size());

  at::parallel_for(0, num_caches * n, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t c = i / n, pair = i % n;
      std::memcpy(bases[c] + dst_ptr[pair] * strides[c], bases[c] + src_ptr[pair] * strides[c],
                  rows[c]);
    }
  });
}

TORCH_LIBRARY_IMPL(verify, CPU, m) { m.impl("relocate_kv", &relocate_kv_cpu); }

}  // namespace verify_ops
