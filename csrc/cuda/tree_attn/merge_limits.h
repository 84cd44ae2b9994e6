// How many splits each merge path takes, shared by the launcher's choice
// and the merge kernels.
#pragma once

#include "common/fast_divmod.h"  // VERIFY_OPS_HOST_DEVICE

namespace verify_ops {

// The one-latency merge (merge_few_splits_kernel): a CTA of kFewSplitThreads
// threads holds a row's splits, kFewSplitsPerThread per thread.
constexpr int kFewSplitThreads = 256;
constexpr int kFewSplitsPerThread = 16;
// The split-parallel merge (merge_splits_kernel) takes up to kMaxSplits.
constexpr int kMaxSplits = 1024;
// Splits of one (request, KV head, row tile) that may form one cluster:
// the portable cluster size.
constexpr int kMaxClusterSplits = 8;

// 256 at head_dim 64, 128 at 128, 64 at 256.
VERIFY_OPS_HOST_DEVICE constexpr int few_splits_capacity(int head_dim) {
  return kFewSplitsPerThread * kFewSplitThreads / (head_dim / 4);
}

// Split lanes per row in merge_few_splits_kernel: the fewest (a power of two)
// that hold the splits, and enough for a row to fill a warp.
VERIFY_OPS_HOST_DEVICE constexpr int few_split_lanes(int num_splits, int head_dim) {
  int lanes = 1;
  while (lanes * kFewSplitsPerThread < num_splits || lanes * (head_dim / 4) < 32) lanes *= 2;
  return lanes;
}

}  // namespace verify_ops
