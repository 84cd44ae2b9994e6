// The launcher's choices, as pure functions of shapes and what the device
// holds: the tile configuration for a query-row count, and the number of KV
// splits. The reasons and their measurements (H200) are beside each rule.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/tree_attn/merge_limits.h"

namespace verify_ops {

// The attention kernel's tile configurations (TileConfig<HEAD_DIM, KEY_SPLIT, WARPS>).
enum class TileChoice {
  kKeySplit4,      // 4 warps, each a quarter of a tile's keys for 16 rows
  kKeySplit2,      // 4 warps, two 16-row groups over half the keys each
  kOneWarpgroup,   // 4 warps, 64 rows
  kTwoWarpgroups,  // 8 warps, 128 rows
  kProducer,       // 12 warps: 128 rows and a producer warpgroup (sm_90a)
};

// Which of the larger configurations the device runs.
struct TileFit {
  bool producer;        // sm_90a build, compute capability 9, its shared memory fits
  bool two_warpgroups;  // its shared memory fits
  bool one_warpgroup;   // its shared memory fits (sm_120's 99 KB does not at head_dim 256)
};

inline TileChoice choose_tile(int head_dim, int rows_per_kv_head, int64_t kv_head_pairs,
                              const TileFit& fit) {
  // Few query rows per KV head leave warps of a 64-row tile idle: split each
  // KV tile across them instead (four ways where a tile has 64 keys).
  if (head_dim <= 128 && rows_per_kv_head <= 16) return TileChoice::kKeySplit4;
  if (rows_per_kv_head <= 32) return TileChoice::kKeySplit2;
  // 128-row tiles (two warpgroups) past 64 rows, except for a single
  // (request, KV head) pair at head_dim <= 128: its two 64-row CTAs per split
  // put twice the SMs to work at short context (1.19-1.25x at 4k) and cost at
  // most 3 % at 64k; at head_dim 256 they lost 15 % there (H200).
  const bool wide_tiles = rows_per_kv_head > 64 &&
                          !(head_dim <= 128 && kv_head_pairs == 1 && rows_per_kv_head <= 128);
  // A producer warpgroup feeds the two warpgroups where wgmma runs (sm_90a);
  // at head_dim 256 only past 128 rows, where it wins 1.04-1.09x (H200).
  const int producer_min_rows = head_dim == 256 ? 129 : 65;
  if (wide_tiles && rows_per_kv_head >= producer_min_rows && fit.producer)
    return TileChoice::kProducer;
  if (wide_tiles && fit.two_warpgroups) return TileChoice::kTwoWarpgroups;
  // Devices with less shared memory than sm_90 run the smaller key-split kernel.
  if (!fit.one_warpgroup) return TileChoice::kKeySplit2;
  return TileChoice::kOneWarpgroup;
}

// Splits along the KV sequence, from shapes and the device only: as many as
// one wave of resident CTAs holds. Rounding up instead would start a sliver of
// a second wave (5 splits of 64 CTAs on 264 slots run two waves where 4 run
// one). A split never covers fewer than `min_tokens`. A few splits past the
// one-latency merge's capacity are cut to it: they cost less left out than
// merged by the split-parallel merge (1.04-1.17x at batch 1, 16k-64k, H200).
inline int choose_num_splits(int64_t ctas_without_split, int64_t resident_ctas,
                             int64_t max_context, int min_tokens, int head_dim) {
  const int64_t fit = resident_ctas / std::max<int64_t>(ctas_without_split, 1);
  const int64_t most = std::max<int64_t>(1, (max_context + min_tokens - 1) / min_tokens);
  const int splits =
      static_cast<int>(std::clamp<int64_t>(fit, 1, std::min<int64_t>(most, kMaxSplits)));
  const int few_splits = few_splits_capacity(head_dim);
  return splits > few_splits && splits * 16 <= few_splits * 17 ? few_splits : splits;
}

// Two tiles per split at least: CTAs enough to fill every SM matter more
// than the partials, which the merge reads back from L2. But no fewer tokens
// than the CTA has rows, so that a split's partials weigh at most half the K
// and V it reads (128 rows at head_dim 256: four tiles, not two).
inline int split_min_tokens(int block_n, int block_m) { return std::max(2 * block_n, block_m); }

}  // namespace verify_ops
