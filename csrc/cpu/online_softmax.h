// The element-wise half of the CPU kernel: scale, soft-cap and online
// softmax over a [rows, width] block of scores that brgemm produced, and the
// output rows from their accumulators, in vectorized loops.
#pragma once

#include <cstdint>

namespace verify_ops::cpu {

// Score tiles are this many keys wide, or a multiple of it.
constexpr int64_t kScoreLanes = 16;

// s <- scale * s, then with cap > 0 s <- cap * tanh(s / cap), for `count` scores.
void scale_and_cap(float* scores, int64_t count, float scale, float cap);

// One KV tile of the online softmax. scores: [rows, width] with row stride
// `stride`, width a multiple of kScoreLanes, keys a row must not see at -inf. Each row's
// running max and sum absorb the tile, its scores become exp(s - max) (zero
// for a row that has seen no key yet), and its accumulator row
// acc[r * head_dim ..] is rescaled to the new max.
void online_softmax_tile(float* scores, int64_t rows, int64_t width, int64_t stride,
                         float* row_max,
                         float* row_sum, float* acc, int64_t head_dim);

// dst[c] = sum over p < count of weights[p] * parts[p][c], for c < head_dim,
// in fp32 then converted to out_t (float, c10::BFloat16 or c10::Half): an
// output row from the accumulators of the parts of its key range, each
// weighted by its rescale and the softmax's 1 / denominator.
template <typename out_t>
void weighted_sum_row(const float* const* parts, const float* weights, int64_t count,
                      int64_t head_dim, out_t* dst);

}  // namespace verify_ops::cpu
