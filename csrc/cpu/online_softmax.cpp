#include "cpu/online_softmax.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <c10/util/bit_cast.h>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/vector_clones.h"

namespace verify_ops::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// exp(x) in branch-free float arithmetic the compiler vectorizes (std::exp
// is a library call per element): x = n ln2 + r with |r| <= ln2 / 2, e^r by
// Cephes' degree-6 polynomial (about 1 ulp), 2^n through the exponent bits.
// Below -87.3 (e^x < 2^-126) the result is 0, so exp(-inf) = 0.
inline float vector_exp(float x) {
  const float clamped = std::min(std::max(x, -87.3f), 88.f);
  // Adding 1.5 * 2^23 rounds to an integer held in the low mantissa bits.
  constexpr float kRound = 12582912.f;
  const float shifted = clamped * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  const float r = (clamped - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.f;
  const uint32_t exponent =
      (c10::bit_cast<uint32_t>(shifted) - c10::bit_cast<uint32_t>(kRound) + 127u) << 23;
  const float result = p * c10::bit_cast<float>(exponent);
  return x < -87.3f ? 0.f : result;
}

// A float's bits as an int32 that orders like the float (for non-NaN
// values): its own inverse. Integer max reductions vectorize; float ones do
// not without -ffinite-math-only.
inline int32_t ordered_bits(int32_t bits) { return bits >= 0 ? bits : bits ^ 0x7fffffff; }

inline float row_max_of(const float* row, int64_t width) {
  int32_t max = ordered_bits(c10::bit_cast<int32_t>(kNegInf));
  for (int64_t t = 0; t < width; ++t)
    max = std::max(max, ordered_bits(c10::bit_cast<int32_t>(row[t])));
  return c10::bit_cast<float>(ordered_bits(max));
}

// row <- exp(row - max); returns the sum, added in a fixed lane order.
inline float exp_row(float* row, int64_t width, float max) {
  float lanes[kScoreLanes] = {};
  for (int64_t t = 0; t < width; t += kScoreLanes)
    for (int64_t j = 0; j < kScoreLanes; ++j) {
      const float p = vector_exp(row[t + j] - max);
      row[t + j] = p;
      lanes[j] += p;
    }
  float sum = 0.f;
  for (int64_t j = 0; j < kScoreLanes; ++j) sum += lanes[j];
  return sum;
}

}  // namespace

VERIFY_OPS_VECTOR_CLONES
void scale_and_cap(float* scores, int64_t count, float scale, float cap) {
  if (cap <= 0) {
    for (int64_t i = 0; i < count; ++i) scores[i] *= scale;
    return;
  }
  const float inv_cap = 1.f / cap;
  for (int64_t i = 0; i < count; ++i) {
    // tanh(|y|) = (1 - e^{-2|y|}) / (1 + e^{-2|y|}): no overflow for large |y|.
    const float y = scores[i] * scale * inv_cap;
    const float e = vector_exp(-2.f * std::fabs(y));
    scores[i] = std::copysign(cap * ((1.f - e) / (1.f + e)), y);
  }
}

VERIFY_OPS_VECTOR_CLONES
void online_softmax_tile(float* scores, int64_t rows, int64_t width, int64_t stride,
                         float* row_max,
                         float* row_sum, float* acc, int64_t head_dim) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = scores + r * stride;
    const float new_max = std::max(row_max[r], row_max_of(row, width));
    if (new_max == kNegInf) {  // nothing seen yet: exp(-inf - -inf) would be NaN
      std::fill(row, row + width, 0.f);
      continue;
    }
    const float tile_sum = exp_row(row, width, new_max);
    if (new_max != row_max[r]) {
      const float rescale = std::exp(row_max[r] - new_max);  // 0 for the first keys
      float* a = acc + r * head_dim;
      for (int64_t c = 0; c < head_dim; ++c) a[c] *= rescale;
      row_sum[r] *= rescale;
      row_max[r] = new_max;
    }
    row_sum[r] += tile_sum;
  }
}

template <typename out_t>
VERIFY_OPS_VECTOR_CLONES void weighted_sum_row(const float* const* parts, const float* weights,
                                               int64_t count, int64_t head_dim, out_t* dst) {
  constexpr int64_t kChunk = 64;  // columns summed in registers before the conversion
  for (int64_t c0 = 0; c0 < head_dim; c0 += kChunk) {
    const int64_t n = std::min(kChunk, head_dim - c0);
    float sum[kChunk];
    for (int64_t c = 0; c < n; ++c) sum[c] = weights[0] * parts[0][c0 + c];
    for (int64_t p = 1; p < count; ++p)
      for (int64_t c = 0; c < n; ++c) sum[c] += weights[p] * parts[p][c0 + c];
    for (int64_t c = 0; c < n; ++c) dst[c0 + c] = static_cast<out_t>(sum[c]);
  }
}

template void weighted_sum_row<float>(const float* const*, const float*, int64_t, int64_t,
                                      float*);
template void weighted_sum_row<c10::BFloat16>(const float* const*, const float*, int64_t,
                                              int64_t, c10::BFloat16*);
template void weighted_sum_row<c10::Half>(const float* const*, const float*, int64_t, int64_t,
                                          c10::Half*);

}  // namespace verify_ops::cpu
