#include "cpu/kv_tile.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

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
// The compiler's generic vectors, lowered to whatever the target has (SSE,
// AVX, NEON registers): shuffles instead of scalar copies.

// dst[c * dst_stride + j] = src[j][c] for 32-bit words, c < 8, j < 8: three
// rounds of shuffles instead of 64 scalar copies.
typedef uint32_t Words8 __attribute__((vector_size(32)));

__attribute__((always_inline)) inline void transpose_8x8(const void* const src[8], void* dst,
                                                         int64_t dst_stride) {
  Words8 r[8], a[8], b[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&r[i], src[i], sizeof(Words8));
  for (int i = 0; i < 8; i += 2) {  // interleave pairs of rows
    a[i] = __builtin_shufflevector(r[i], r[i + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    a[i + 1] = __builtin_shufflevector(r[i], r[i + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int i = 0; i < 8; i += 4)  // then pairs of pairs
    for (int k = 0; k < 2; ++k) {
      b[i + 2 * k] = __builtin_shufflevector(a[i + k], a[i + k + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      b[i + 2 * k + 1] =
          __builtin_shufflevector(a[i + k], a[i + k + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  char* out = static_cast<char*>(dst);
  const int64_t row_bytes = dst_stride * 4;
  for (int k = 0; k < 4; ++k) {  // then the two halves
    const Words8 low = __builtin_shufflevector(b[k], b[k + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    const Words8 high = __builtin_shufflevector(b[k], b[k + 4], 4, 5, 6, 7, 12, 13, 14, 15);
    std::memcpy(out + k * row_bytes, &low, sizeof(Words8));
    std::memcpy(out + (k + 4) * row_bytes, &high, sizeof(Words8));
  }
}

// out[2 c] = even[c], out[2 c + 1] = odd[c] for 16-bit words, c < count: two
// rows of V interleaved into VNNI pairs, 16 words of each row per round.
__attribute__((always_inline)) inline void interleave_words(const uint16_t* even, const uint16_t* odd, int64_t count,
                             uint16_t* out) {
  typedef uint16_t Halves16 __attribute__((vector_size(32)));
  int64_t c = 0;
  for (; c + 16 <= count; c += 16) {
    Halves16 e, o;
    std::memcpy(&e, even + c, sizeof(e));
    std::memcpy(&o, odd + c, sizeof(o));
    const Halves16 low = __builtin_shufflevector(e, o, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5,
                                                 21, 6, 22, 7, 23);
    const Halves16 high = __builtin_shufflevector(e, o, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28,
                                                  13, 29, 14, 30, 15, 31);
    std::memcpy(out + 2 * c, &low, sizeof(low));
    std::memcpy(out + 2 * c + 16, &high, sizeof(high));
  }
  for (; c < count; ++c) {
    out[2 * c] = even[c];
    out[2 * c + 1] = odd[c];
  }
}
#else
inline void transpose_8x8(const void* const src[8], void* dst, int64_t dst_stride) {
  for (int c = 0; c < 8; ++c)
    for (int j = 0; j < 8; ++j)
      std::memcpy(static_cast<char*>(dst) + (c * dst_stride + j) * 4,
                  static_cast<const char*>(src[j]) + c * 4, 4);
}

inline void interleave_words(const uint16_t* even, const uint16_t* odd, int64_t count,
                             uint16_t* out) {
  for (int64_t c = 0; c < count; ++c) {
    out[2 * c] = even[c];
    out[2 * c + 1] = odd[c];
  }
}
#endif

// dst[c * dst_stride + j] = rows[j][c] for 32-bit words, j < kGatherTokens,
// c < words.
inline void transpose_rows(const void* const rows[kGatherTokens], int64_t words, void* dst,
                           int64_t dst_stride) {
  auto word = [](const void* base, int64_t i) { return static_cast<const char*>(base) + 4 * i; };
  int64_t c = 0;
  for (; c + 8 <= words; c += 8)
    for (int64_t j = 0; j < kGatherTokens; j += 8) {
      const void* src[8];
      for (int i = 0; i < 8; ++i) src[i] = word(rows[j + i], c);
      transpose_8x8(src, static_cast<char*>(dst) + 4 * (c * dst_stride + j), dst_stride);
    }
  for (; c < words; ++c)
    for (int64_t j = 0; j < kGatherTokens; ++j)
      std::memcpy(static_cast<char*>(dst) + 4 * (c * dst_stride + j), word(rows[j], c), 4);
}

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
    const void* k_rows[kGatherTokens];
    for (int64_t j = 0; j < kGatherTokens; ++j) {
      const int64_t slot = slots[t0 + j];
      float* k_row = stage + j * head_dim;
      float* v_row = v + (t0 + j) * head_dim;
      k_rows[j] = k_row;
      if (slot < 0) {
        std::fill(k_row, k_row + head_dim, 0.f);
        std::fill(v_row, v_row + head_dim, 0.f);
        continue;
      }
      const kv_t* k_src = k_head + slot * k_slot_stride;
      const kv_t* v_src = v_head + slot * v_slot_stride;
      if constexpr (std::is_same_v<kv_t, float>)
        k_rows[j] = k_src;  // transposed straight from the pool
      else
        for (int64_t c = 0; c < head_dim; ++c) k_row[c] = static_cast<float>(k_src[c]);
      for (int64_t c = 0; c < head_dim; ++c) v_row[c] = static_cast<float>(v_src[c]);
    }
    // Transposing kGatherTokens rows at once writes kGatherTokens consecutive
    // floats per dimension instead of one float per cache line.
    transpose_rows(k_rows, head_dim, kt + t0, kt_stride);
  }
}

VERIFY_OPS_VECTOR_CLONES void gather_kv_tile_vnni(const c10::BFloat16* k_head,
                                                  int64_t k_slot_stride,
                                                  const c10::BFloat16* v_head,
                                                  int64_t v_slot_stride, const int64_t* slots,
                                                  int64_t width, int64_t head_dim,
                                                  const c10::BFloat16* zeros,
                                                  c10::BFloat16* kt, int64_t kt_stride,
                                                  c10::BFloat16* v) {
  // A pair of bf16 along head_dim is one 32-bit word: K in VNNI layout is
  // each K row's words, transposed.
  for (int64_t t0 = 0; t0 < width; t0 += kGatherTokens) {
    prefetch_rows(k_head, k_slot_stride, v_head, v_slot_stride, slots + t0 + kGatherTokens,
                  kGatherTokens, head_dim);
    const void* k_rows[kGatherTokens];
    const c10::BFloat16* v_rows[kGatherTokens];
    for (int64_t j = 0; j < kGatherTokens; ++j) {
      const int64_t slot = slots[t0 + j];
      k_rows[j] = slot < 0 ? zeros : k_head + slot * k_slot_stride;
      v_rows[j] = slot < 0 ? zeros : v_head + slot * v_slot_stride;
    }
    transpose_rows(k_rows, head_dim / 2, kt + 2 * t0, kt_stride);
    // V in VNNI layout interleaves the rows of each pair of tokens.
    for (int64_t j = 0; j < kGatherTokens; j += 2)
      interleave_words(reinterpret_cast<const uint16_t*>(v_rows[j]),
                       reinterpret_cast<const uint16_t*>(v_rows[j + 1]), head_dim,
                       reinterpret_cast<uint16_t*>(v + (t0 + j) * head_dim));
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
