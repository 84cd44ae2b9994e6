// Argument checks of verify.relocate_kv, shared by its CPU and CUDA kernels.
// The Python fake kernel (verify_ops/relocate.py) mirrors these messages.
#include "common/check_message.h"
#include "common/relocate_kv_args.h"

namespace verify_ops {
namespace {

constexpr const char* kOp = "verify.relocate_kv";

// A slot's row (every dim after the first) must be one contiguous byte range,
// so a slot moves as a single memcpy / run of vector copies.
void check_row_contiguous(const at::Tensor& t, const char* list, size_t i) {
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 1; --d) {
    VERIFY_CHECK(t.size(d) == 1 || t.stride(d) == expected, kOp, ": ", list, "[", i,
                "] must store each slot contiguously (dims after the first in row-major "
                "order), got shape ", t.sizes(), " with strides ", t.strides());
    expected *= t.size(d);
  }
}

void check_cache_list(at::TensorList caches, const char* list, const at::Tensor& first_k) {
  const at::Tensor& first = caches[0];
  for (size_t i = 0; i < caches.size(); ++i) {
    const at::Tensor& t = caches[i];
    VERIFY_CHECK(t.dim() >= 1, kOp, ": ", list, "[", i,
                "] must be at least 1-D [pool, ...], got 0-D");
    VERIFY_CHECK(t.scalar_type() == first_k.scalar_type(), kOp, ": ", list, "[", i,
                "] must have the dtype of k_caches[0] (", first_k.scalar_type(), "), got ",
                t.scalar_type());
    VERIFY_CHECK(t.device() == first_k.device(), kOp, ": ", list, "[", i,
                "] must be on the device of k_caches[0] (", first_k.device(), "), got ",
                t.device());
    VERIFY_CHECK(t.sizes() == first.sizes(), kOp, ": ", list, "[", i, "] must have the shape of ",
                list, "[0] (", first.sizes(), "), got ", t.sizes());
    check_row_contiguous(t, list, i);
  }
}

void check_slots(const at::Tensor& t, const char* name, const at::Tensor& first_k) {
  VERIFY_CHECK(t.dim() == 1, kOp, ": ", name, " must be 1-D [n], got ", t.dim(),
              "-D with shape ", t.sizes());
  VERIFY_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, kOp, ": ", name,
              " must have dtype int32 or int64, got ", t.scalar_type());
  VERIFY_CHECK(t.device() == first_k.device(), kOp, ": ", name,
              " must be on the device of k_caches[0] (", first_k.device(), "), got ",
              t.device());
}

}  // namespace

RelocateShape check_relocate_kv_args(at::TensorList k_caches, at::TensorList v_caches,
                                     const at::Tensor& src_slots,
                                     const at::Tensor& dst_slots) {
  VERIFY_CHECK(!k_caches.empty(), kOp, ": k_caches must hold at least one layer, got 0");
  VERIFY_CHECK(v_caches.size() == k_caches.size(), kOp,
              ": v_caches must hold one cache per layer of k_caches (", k_caches.size(),
              "), got ", v_caches.size());
  const at::Tensor& first_k = k_caches[0];
  check_cache_list(k_caches, "k_caches", first_k);
  check_cache_list(v_caches, "v_caches", first_k);
  VERIFY_CHECK(v_caches[0].size(0) == first_k.size(0), kOp,
              ": v_caches[0].size(0) must equal the pool size k_caches[0].size(0) = ",
              first_k.size(0), ", got ", v_caches[0].size(0));
  check_slots(src_slots, "src_slots", first_k);
  check_slots(dst_slots, "dst_slots", first_k);
  VERIFY_CHECK(dst_slots.scalar_type() == src_slots.scalar_type(), kOp,
              ": dst_slots must have the dtype of src_slots (", src_slots.scalar_type(),
              "), got ", dst_slots.scalar_type());
  VERIFY_CHECK(dst_slots.size(0) == src_slots.size(0), kOp,
              ": dst_slots must have the length of src_slots (", src_slots.size(0), "), got ",
              dst_slots.size(0));
  return {static_cast<int64_t>(k_caches.size()), src_slots.size(0), first_k.size(0)};
}

void check_relocate_kv_values(const RelocateShape& shape, const at::Tensor& src_slots,
                              const at::Tensor& dst_slots) {
  if (shape.num_pairs == 0) return;
  const auto src = src_slots.to(at::kLong);
  const auto dst = dst_slots.to(at::kLong);
  for (const auto& [t, name] : {std::pair{src, "src_slots"}, std::pair{dst, "dst_slots"}}) {
    const int64_t lo = t.min().item<int64_t>(), hi = t.max().item<int64_t>();
    check_in_range(kOp, name, lo, hi, shape.pool_size, "the pool size");
  }
  const auto sorted_dst = std::get<0>(dst.sort());
  const auto repeats = sorted_dst.slice(0, 1).eq(sorted_dst.slice(0, 0, -1)).nonzero();
  VERIFY_CHECK(repeats.numel() == 0, kOp, ": dst_slots must not repeat a slot, got slot ",
              repeats.numel() ? sorted_dst[repeats[0][0]].item<int64_t>() : 0,
              " more than once");
  const auto shared = src.masked_select(at::isin(src, dst));
  VERIFY_CHECK(shared.numel() == 0, kOp,
              ": src_slots and dst_slots must be disjoint, got slot ",
              shared.numel() ? shared[0].item<int64_t>() : 0, " in both");
}

int64_t slot_stride_bytes(const at::Tensor& cache) {
  return cache.stride(0) * cache.element_size();
}

int64_t row_bytes(const at::Tensor& cache) {
  int64_t bytes = cache.element_size();
  for (int64_t d = 1; d < cache.dim(); ++d) bytes *= cache.size(d);
  return bytes;
}

}  // namespace verify_ops
