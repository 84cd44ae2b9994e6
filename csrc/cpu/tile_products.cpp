#include "cpu/tile_products.h"

#include <ATen/native/CPUBlas.h>
#include <c10/util/Half.h>

#include "cpu/vector_clones.h"

namespace verify_ops::cpu {
namespace {

// A power-of-two row stride would put the transposing copy's head_dim rows
// of the fp32 K tile in a few L1 sets.
constexpr int64_t kKtPadding = 16;

// out[r * stride + t] = bf16(in[r * stride + t]) for t < width.
VERIFY_OPS_VECTOR_CLONES void round_to_bf16(const float* in, int64_t rows, int64_t width,
                                            int64_t stride, c10::BFloat16* out) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < width; ++t) out[r * stride + t] = c10::BFloat16(in[r * stride + t]);
}

}  // namespace

void Fp32TileProducts::reset(int64_t rows, int64_t head_dim, int64_t max_width) {
  rows_ = rows;
  head_dim_ = head_dim;
  max_width_ = max_width;
  kt_stride_ = max_width + kKtPadding;
  q_.grow(rows * head_dim);
  kt_.grow(head_dim * kt_stride_);
  v_.grow(max_width * head_dim);
  stage_.grow(kGatherTokens * head_dim);
}

template <typename q_t>
VERIFY_OPS_VECTOR_CLONES void Fp32TileProducts::set_query(int64_t r, const q_t* src,
                                                          float score_scale) {
  float* dst = q_.data() + r * head_dim_;
  for (int64_t c = 0; c < head_dim_; ++c) dst[c] = static_cast<float>(src[c]) * score_scale;
}

template void Fp32TileProducts::set_query<float>(int64_t, const float*, float);
template void Fp32TileProducts::set_query<c10::BFloat16>(int64_t, const c10::BFloat16*, float);
template void Fp32TileProducts::set_query<c10::Half>(int64_t, const c10::Half*, float);

void Fp32TileProducts::scores(float* scores) const {
  at::native::cpublas::brgemm(rows_, width_, head_dim_, head_dim_, kt_stride_, max_width_,
                              /*add_C=*/false, q_.data(), kt_.data(), scores);
}

void Fp32TileProducts::accumulate(const float* probs, float* acc) const {
  at::native::cpublas::brgemm(rows_, head_dim_, width_, max_width_, head_dim_, head_dim_,
                              /*add_C=*/true, probs, v_.data(), acc);
}

bool Bf16TileProducts::available(int64_t head_dim) {
  return head_dim % 2 == 0 && at::native::cpublas::could_pack(at::kBFloat16);
}

void Bf16TileProducts::reset(int64_t rows, int64_t head_dim, int64_t max_width) {
  rows_ = rows;
  head_dim_ = head_dim;
  max_width_ = max_width;
  q_.grow(rows * head_dim);
  kt_.grow(head_dim * max_width);
  v_.grow(max_width * head_dim);
  probs_.grow(rows * max_width);
  zeros_.grow(head_dim);  // only ever read
}

void Bf16TileProducts::release() { at::native::cpublas::brgemm_release(/*is_vnni=*/true); }

void Bf16TileProducts::scores(float* scores) const {
  at::native::cpublas::brgemm(rows_, width_, head_dim_, head_dim_, max_width_, max_width_,
                              /*add_C=*/false, q_.data(), kt_.data(), scores,
                              /*is_vnni=*/true);
}

void Bf16TileProducts::accumulate(const float* probs, float* acc) {
  round_to_bf16(probs, rows_, width_, max_width_, probs_.data());
  at::native::cpublas::brgemm(rows_, head_dim_, width_, max_width_, head_dim_, head_dim_,
                              /*add_C=*/true, probs_.data(), v_.data(), acc, /*is_vnni=*/true);
}

}  // namespace verify_ops::cpu
