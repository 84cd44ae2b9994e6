#include "cpu/kv_tile.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <algorithm>

#include "cpu/vector_clones.h"

namespace verify_ops::cpu {
namespace {

// Asks for the K and V rows of slots[0 .. count) (entries < 0 skipped).
template <typename kv_t>
inline void prefetch_rows(const kv_t* k_head, int64_t k_slot_stride, const kv_t* v_head,
                          int64_t v_slot_stride, const int64_t* slots, int64_t count,
                          int64_t head_dim) {
  constexpr int64_t kLine = 64;
  const int64_t row_bytes = head_dim * static_cast<int64_t>(sizeof(kv_t));
  for (int64_t t = 0; t < count; ++t) {
    if (slots[t] < 0) continue;
    const char* k_row = reinterpret_cast<const char*>(k_head + slots[t] * k_slot_stride);
    const char* v_row = reinterpret_cast<const char*>(v_head + slots[t] * v_slot_stride);
    for (int64_t b = 0; b < row_bytes; b += kLine) {
      __builtin_prefetch(k_row + b, 0, 2);
      __builtin_prefetch(v_row + b, 0, 2);
    }
  }
}

}  // namespace

template <typename kv_t>
VERIFY_OPS_VECTOR_CLONES void gather_kv_tile(const kv_t* k_head, int64_t k_slot_stride,
                                             const kv_t* v_head, int64_t v_slot_stride,
                                             const int64_t* slots, int64_t width,
                                             int64_t head_dim, float* kt, float* v,
                                             float* stage) {
  for (int64_t t0 = 0; t0 < width; t0 += kGatherTokens) {
    prefetch_rows(k_head, k_slot_stride, v_head, v_slot_stride, slots + t0 + kGatherTokens,
                  kGatherTokens, head_dim);
    for (int64_t j = 0; j < kGatherTokens; ++j) {
      const int64_t slot = slots[t0 + j];
      float* k_row = stage + j * head_dim;
      float* v_row = v + (t0 + j) * head_dim;
      if (slot < 0) {
        std::fill(k_row, k_row + head_dim, 0.f);
        std::fill(v_row, v_row + head_dim, 0.f);
        continue;
      }
      const kv_t* k_src = k_head + slot * k_slot_stride;
      const kv_t* v_src = v_head + slot * v_slot_stride;
      for (int64_t c = 0; c < head_dim; ++c) k_row[c] = static_cast<float>(k_src[c]);
      for (int64_t c = 0; c < head_dim; ++c) v_row[c] = static_cast<float>(v_src[c]);
    }
    // Transposing through the stage writes kGatherTokens consecutive floats
    // per dimension instead of one float per cache line.
    for (int64_t c = 0; c < head_dim; ++c)
      for (int64_t j = 0; j < kGatherTokens; ++j)
        kt[c * width + t0 + j] = stage[j * head_dim + c];
  }
}

#define VERIFY_OPS_GATHER(kv_t)                                                       \
  template void gather_kv_tile<kv_t>(const kv_t*, int64_t, const kv_t*, int64_t,     \
                                     const int64_t*, int64_t, int64_t, float*, float*, float*);
VERIFY_OPS_GATHER(float)
VERIFY_OPS_GATHER(c10::BFloat16)
VERIFY_OPS_GATHER(c10::Half)
VERIFY_OPS_GATHER(c10::Float8_e4m3fn)
VERIFY_OPS_GATHER(c10::Float8_e5m2)
#undef VERIFY_OPS_GATHER

}  // namespace verify_ops::cpu
