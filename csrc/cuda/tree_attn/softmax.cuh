// The online softmax of the attention kernel, per thread: its two rows of an
// MMA C fragment (g and g + 8 of its warp's 16), the tree mask over a tile's
// scores, and the fold of each tile into the running max and sum (log2 units
// of the scaled scores).
#pragma once

#include <cstdint>

#include "cuda/ptx/intrinsics.cuh"
#include "cuda/tree_attn/numeric.cuh"
#include "cuda/tree_attn/params.h"

namespace verify_ops {

// How the running max moved on a tile, and the factor O and the sum take.
struct Fold {
  bool max_moved;
  float rescale[2];
};

template <int D_TILES>
__device__ inline void rescale_o(float (&o)[D_TILES][4], const Fold& fold) {
  if (!fold.max_moved) return;
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int i = 0; i < D_TILES; ++i) {
      o[i][2 * h] *= fold.rescale[h];
      o[i][2 * h + 1] *= fold.rescale[h];
    }
}

// Masking is a separate pass, taken only by tiles that reach the drafts or
// the split's end, so the common path stays free of branches. Offsets are
// from the split's first token; split_prefix, the first draft's offset, lies
// in [1 - D, split_tokens].
template <int BLOCK_N>
__device__ inline bool tile_needs_mask(int tile, int split_prefix, int split_tokens) {
  const int tile_first = tile * BLOCK_N;
  return tile_first + BLOCK_N > split_prefix || tile_first + BLOCK_N > split_tokens;
}

// Sets the scores of the keys this thread's two rows do not see to -inf:
// keys past the split, and drafts their tree-mask rows (row_draft, in
// tree_mask[b] at mask_base) hide. This thread scores keys key0 + 8 n + 2 t4
// (+ 1) of the tile. Explicit scalar inputs, not a struct: a struct of these
// fields cost the one-warpgroup kernel 21 registers (ptxas 13.0).
template <int BLOCK_N, int N_TILES>
__device__ inline void apply_tree_mask(float (&s)[N_TILES][4], int tile, int split_prefix,
                                       int split_tokens, const unsigned char* mask_base,
                                       const int (&row_draft)[2], const bool (&row_valid)[2],
                                       int key0, int t4, const TreeAttnParams& p) {
  const int tile_first = tile * BLOCK_N;
  // Tile-relative bounds: keys at or past keys_left do not exist, and key
  // draft_begin + j is draft j.
  const int keys_left = min(split_tokens - tile_first, BLOCK_N);
  const int draft_begin = min(split_prefix - tile_first, BLOCK_N);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const unsigned char* mask_row = mask_base + row_draft[h] * p.mask_stride_row;
    // Every mask byte is loaded before any is used (draft index clamped,
    // so always in bounds): one memory latency per row, not one per score.
    unsigned char draft_visible[N_TILES][2];
#pragma unroll
    for (int n = 0; n < N_TILES; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int draft = min(max(key0 + n * 8 + 2 * t4 + e - draft_begin, 0), p.num_drafts - 1);
        draft_visible[n][e] = load_mask_byte(mask_row + draft * p.mask_stride_col);
      }
#pragma unroll
    for (int n = 0; n < N_TILES; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = key0 + n * 8 + 2 * t4 + e;
        const bool visible =
            key < keys_left && (key < draft_begin || (row_valid[h] && draft_visible[n][e]));
        if (!visible) s[n][2 * h + e] = -INFINITY;
      }
    }
  }
}

// A tile's probabilities against each row's reference max `ref` (log2
// units), as MMA A fragments (16-bit pairs), and this thread's share of each
// row's sum of them. Two partial sums per row halve the chain of dependent adds.
template <typename T, int N_TILES>
__device__ inline void exponentiate(const float (&s)[N_TILES][4], const float (&ref)[2],
                                    float scale_log2, uint32_t (&p_frag)[N_TILES / 2][4],
                                    float (&sum)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float part[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < N_TILES; ++n) {
      const float p0 = fast_exp2(s[n][2 * h] * scale_log2 - ref[h]);
      const float p1 = fast_exp2(s[n][2 * h + 1] * scale_log2 - ref[h]);
      part[0] += p0;
      part[1] += p1;
      p_frag[n / 2][2 * (n % 2) + h] = pack_pair<T>(p0, p1);
    }
    sum[h] = part[0] + part[1];
  }
}

// The online softmax of a tile: folds its raw scores, masked already where
// `masked`, times scale_log2 into the running row_max and row_sum (log2
// units), and writes their probabilities to p_frag (16-bit pairs of P_T).
// With wgmma, O must then be rescaled (after a wait) if the reference max
// moved for a row of the warp; without, O is rescaled here. The scale is
// positive (the host sees to it), so it applies to the tile max and inside
// each exponent's FFMA, not as a multiply per score.
template <typename P_T, bool WGMMA, int N_TILES, int D_TILES>
__device__ inline Fold fold_tile_scores(float (&s)[N_TILES][4], uint32_t (&p_frag)[N_TILES / 2][4],
                                        int tile, bool masked, float (&row_max)[2],
                                        float (&row_sum)[2], float (&o)[D_TILES][4],
                                        float scale_log2) {
  Fold fold;
  fold.max_moved = false;
  float sum[2];
  // The common tile: unmasked, past the split's first (which was unmasked
  // too, so every row's max is finite). Its exponentials go first, against
  // row_max; the tile max, two shuffles and a vote later, is needed only
  // where a probability may exceed 2^15 (fp16's range ends at 65504): a sum
  // of them above that bound sends the warp to the full path below.
  constexpr float kFastSumBound = 32768.f;
  if (!masked && tile > 0) {
    exponentiate<P_T>(s, row_max, scale_log2, p_frag, sum);
    if (!__any_sync(0xffffffff, sum[0] > kFastSumBound || sum[1] > kFastSumBound)) {
      row_sum[0] += sum[0];
      row_sum[1] += sum[1];
      return fold;
    }
  }
  // Exponents are taken against row_max, which moves only when a row's
  // max passes it by more than kMaxGrowthLog2: P then stays below 2^8,
  // and O (which wgmma may still be writing) needs rescaling on few tiles.
  constexpr float kMaxGrowthLog2 = 8.f;
  float tile_max[2];
  bool row_moves[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float m = -INFINITY;
#pragma unroll
    for (int n = 0; n < N_TILES; ++n) m = fmaxf(m, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
    tile_max[h] = quad_max(m) * scale_log2;
    row_moves[h] = tile_max[h] > row_max[h] + kMaxGrowthLog2;  // -inf + 8 is -inf
  }
  fold.max_moved = __any_sync(0xffffffff, row_moves[0] || row_moves[1]);
  if (fold.max_moved) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float new_max = fmaxf(row_max[h], tile_max[h]);
      // A row that has seen only -inf keeps max -inf, with O and sum at zero.
      fold.rescale[h] = new_max == -INFINITY ? 1.f : fast_exp2(row_max[h] - new_max);
      row_sum[h] *= fold.rescale[h];
      row_max[h] = new_max;
    }
    // Without wgmma no MMA writes O now: rescale it before the exponentials,
    // where fewer registers are live.
    if constexpr (!WGMMA) {
      rescale_o(o, fold);
      fold.max_moved = false;
    }
  }
  // Where row_max is still -inf so is every score: use 0 so exp2 stays finite.
  float ref[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) ref[h] = row_max[h] == -INFINITY ? 0.f : row_max[h];
  exponentiate<P_T>(s, ref, scale_log2, p_frag, sum);
  row_sum[0] += sum[0];
  row_sum[1] += sum[1];
  return fold;
}

}  // namespace verify_ops
