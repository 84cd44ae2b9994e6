#include "cpu/kv_tile.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>

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

#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
#define VERIFY_OPS_HAS_SHUFFLEVECTOR 1
// Eight floats in the compiler's generic vectors, lowered to whatever the
// target has (two SSE registers, one AVX register, NEON pairs).
typedef float Float8 __attribute__((vector_size(32)));

// dst[c * dst_stride + j] = src[j * src_stride + c] for an 8 x 8 block, in
// three rounds of shuffles instead of 64 scalar copies.
__attribute__((always_inline)) inline void transpose_8x8(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  Float8 r[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&r[i], src + i * src_stride, sizeof(Float8));
  Float8 a[8], b[8];
  for (int i = 0; i < 8; i += 2) {  // interleave pairs of rows
    a[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    a[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4)  // then pairs of pairs
    for (int k = 0; k < 2; ++k) {
      b[i + 2 * k] = __builtin_shufflevector(a[i + k], a[i + k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      b[i + 2 * k + 1] = __builtin_shufflevector(a[i + k], a[i + k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int k = 0; k < 4; ++k) {  // then the two halves
    const Float8 low = __builtin_shufflevector(b[k], b[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    const Float8 high = __builtin_shufflevector(b[k], b[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    std::memcpy(dst + k * dst_stride, &low, sizeof(Float8));
    std::memcpy(dst + (k + 4) * dst_stride, &high, sizeof(Float8));
  }
}
#endif

}  // namespace

template <typename kv_t>
VERIFY_OPS_VECTOR_CLONES void gather_kv_tile(const kv_t* k_head, int64_t k_slot_stride,
                                             const kv_t* v_head, int64_t v_slot_stride,
                                             const int64_t* slots, int64_t width,
                                             int64_t head_dim, float* kt,
                                             int64_t kt_stride, float* v, float* stage) {
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
    int64_t c = 0;
#ifdef VERIFY_OPS_HAS_SHUFFLEVECTOR
    for (; c + 8 <= head_dim; c += 8)
      for (int64_t j = 0; j < kGatherTokens; j += 8)
        transpose_8x8(stage + j * head_dim + c, head_dim, kt + c * kt_stride + t0 + j, kt_stride);
#endif
    for (; c < head_dim; ++c)
      for (int64_t j = 0; j < kGatherTokens; ++j)
        kt[c * kt_stride + t0 + j] = stage[j * head_dim + c];
  }
}

#define VERIFY_OPS_GATHER(kv_t)                                                       \
  template void gather_kv_tile<kv_t>(const kv_t*, int64_t, const kv_t*, int64_t,     \
                                     const int64_t*, int64_t, int64_t, float*, int64_t, float*, \
                                     float*);
VERIFY_OPS_GATHER(float)
VERIFY_OPS_GATHER(c10::BFloat16)
VERIFY_OPS_GATHER(c10::Half)
VERIFY_OPS_GATHER(c10::Float8_e4m3fn)
VERIFY_OPS_GATHER(c10::Float8_e5m2)
#undef VERIFY_OPS_GATHER

}  // namespace verify_ops::cpu
