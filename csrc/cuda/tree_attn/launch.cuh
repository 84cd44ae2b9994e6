// The host side of one head dim's kernels: the tile configuration and split
// choice (heuristics.h), split-KV workspace from PyTorch's caching allocator,
// and launches on the given stream with programmatic dependent launch and,
// where the splits merge in their cluster, thread-block clusters. Included by
// the per-head-dim instantiation files only.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "cuda/device_attributes.h"
#include "cuda/tree_attn/heuristics.h"
#include "cuda/tree_attn/kernel.cuh"
#include "cuda/tree_attn/merge_kernels.cuh"
#include "cuda/tree_attn/params.h"
#include "cuda/tree_attn/tile_config.h"

namespace verify_ops {

// Runs the tree-attention kernels of one head dim on `params` (everything
// but the split fields set), for inputs whose requests hold at most
// `max_context` positions; `options`: some option of the op is in use, and
// the option kernels run. Defined by instantiate_hdim*.cu.
template <typename T, int HEAD_DIM>
void launch_tree_attn(TreeAttnParams& params, const at::Tensor& q, int64_t max_context,
                      bool options, KvDtype kv_dtype, cudaStream_t stream);

namespace launch_detail {

template <int HEAD_DIM, int KEY_SPLIT, int WARPS = 4, int KV_BYTES = 2>
bool fits_in_shared_memory(int device) {
  return TileConfig<HEAD_DIM, KEY_SPLIT, WARPS, KV_BYTES>::kSmemBytes <=
         device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device);
}

// Opts the attention kernel into its dynamic shared memory and returns how
// many of its CTAs one SM holds at once (registers and shared memory): once
// per device, on the current one.
template <typename T, int HEAD_DIM, int KEY_SPLIT, int WARPS, bool CLUSTER_MERGE = false,
          OptionSet OPTIONS = OptionSet::kNone, typename KV = T>
int prepare_attention_kernel(int device) {
  using Cfg = TileConfig<HEAD_DIM, KEY_SPLIT, WARPS, sizeof(KV)>;
  static std::mutex mu;
  static std::vector<int> table;
  return cached_per_device(table, mu, device, [&] {
    auto* kernel = tree_attn_kernel<T, HEAD_DIM, KEY_SPLIT, WARPS, CLUSTER_MERGE, OPTIONS, KV>;
    C10_CUDA_CHECK(cudaFuncSetAttribute(
        kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes));
    int ctas = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &ctas, kernel, Cfg::kThreads, Cfg::kSmemBytes));
    return std::max(ctas, 1);
  });
}

// Launches a kernel so that, where the device allows, it starts while the
// kernel before it in the stream drains (each kernel of the op waits for that
// grid before it touches global memory); in clusters of `cluster_size` CTAs
// along x where that is more than one.
template <typename... Args>
void launch_dependent(void (*kernel)(Args...), dim3 grid, int threads, int smem_bytes,
                      cudaStream_t stream, int device, const TreeAttnParams& params,
                      int cluster_size = 1) {
  cudaLaunchAttribute attrs[2]{};
  int num_attrs = 0;
  if (supports_dependent_launch(device)) {
    attrs[num_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[num_attrs++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_size > 1) {
    attrs[num_attrs].id = cudaLaunchAttributeClusterDimension;
    attrs[num_attrs++].val.clusterDim = {static_cast<unsigned>(cluster_size), 1, 1};
  }
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  config.attrs = attrs;
  config.numAttrs = num_attrs;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, params));
}

// How many clusters of `cluster_size` CTAs of the cluster-merge kernel the
// device holds at once; 0 where the kernel was not built for sm_90+ (no
// cluster instructions) or the device launches no clusters. Once per device
// and size.
template <typename T, int HEAD_DIM, int KEY_SPLIT, int WARPS>
int resident_clusters(int device, int cluster_size) {
  using Cfg = TileConfig<HEAD_DIM, KEY_SPLIT, WARPS>;
  static std::mutex mu;
  static std::vector<int> tables[kMaxClusterSplits + 1];
  const int clusters = cached_per_device(tables[cluster_size], mu, device, [&] {
    prepare_attention_kernel<T, HEAD_DIM, KEY_SPLIT, WARPS, true>(device);
    auto* kernel = tree_attn_kernel<T, HEAD_DIM, KEY_SPLIT, WARPS, true>;
    cudaFuncAttributes attributes{};
    C10_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    if (std::min(attributes.binaryVersion, attributes.ptxVersion) < 90 ||
        !device_attribute<cudaDevAttrClusterLaunch>(device))
      return -1;
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim = {static_cast<unsigned>(cluster_size), 1, 1};
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(cluster_size);
    config.blockDim = dim3(Cfg::kThreads);
    config.dynamicSmemBytes = Cfg::kSmemBytes;
    config.attrs = &cluster;
    config.numAttrs = 1;
    int count = 0;
    if (cudaOccupancyMaxActiveClusters(&count, kernel, &config) != cudaSuccess) {
      (void)cudaGetLastError();  // no clusters of this size: the merge kernels serve
      return -1;
    }
    return count > 0 ? count : -1;
  });
  return std::max(clusters, 0);
}

// Shared memory a merge CTA reserves, unused, so that no SM holds two: merge
// CTAs launch early (PDL) onto the first SMs the attention grid frees, and
// without it a one-wave merge grid crowds onto about a quarter of the SMs
// (32/8/128 D8: 4k 12.9 -> 11.6 us, 16k 25.5 -> 24.6; +0.8 % at 64k, H200).
// Only where the merge grid fits on the SMs, so that it stays one wave.
template <auto kMergeKernel>
int merge_spread_smem(int device, int64_t merge_ctas) {
  if (merge_ctas > device_attribute<cudaDevAttrMultiProcessorCount>(device)) return 0;
  static std::mutex mu;
  static std::vector<int> table;
  return cached_per_device(table, mu, device, [&] {
    const int more_than_half_an_sm =
        device_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>(device) / 2 + 1;
    C10_CUDA_CHECK(cudaFuncSetAttribute(
        kMergeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, more_than_half_an_sm));
    return more_than_half_an_sm;
  });
}

// One tile configuration: the split choice, workspace, the attention grid
// and its merge. The option kernels never merge in their cluster.
template <typename T, int HEAD_DIM, int KEY_SPLIT, int WARPS, OptionSet OPTIONS, typename KV>
void launch_config(TreeAttnParams& params, const at::Tensor& q, int64_t max_context,
                   cudaStream_t stream) {
  using Cfg = TileConfig<HEAD_DIM, KEY_SPLIT, WARPS, sizeof(KV)>;
  params.num_m_tiles = static_cast<int>(ceil_div64(params.rows_per_kv_head, Cfg::kBlockM));
  params.split_min_tokens = split_min_tokens(Cfg::kBlockN, Cfg::kBlockM);
  const int64_t ctas = static_cast<int64_t>(params.batch) * params.num_kv_heads *
                       params.num_m_tiles;
  const int device = q.get_device();
  const int64_t resident_ctas =
      static_cast<int64_t>(device_attribute<cudaDevAttrMultiProcessorCount>(device)) *
      prepare_attention_kernel<T, HEAD_DIM, KEY_SPLIT, WARPS, false, OPTIONS, KV>(device);
  params.num_splits =
      choose_num_splits(ctas, resident_ctas, max_context, params.split_min_tokens, HEAD_DIM);
  // A few splits merge inside their cluster, where all the clusters fit at
  // once (else the grid runs a second wave: 0.55-0.74x where forced, H200).
  bool merge_in_cluster = false;
  if constexpr (OPTIONS == OptionSet::kNone)
    merge_in_cluster =
        params.num_splits > 1 && params.num_splits <= kMaxClusterSplits &&
        resident_clusters<T, HEAD_DIM, KEY_SPLIT, WARPS>(device, params.num_splits) >= ctas;

  const int64_t n_rows = static_cast<int64_t>(params.batch) * params.num_drafts *
                         params.num_q_heads;
  at::Tensor partial_out, partial_lse;
  if (params.num_splits > 1 && !merge_in_cluster) {
    partial_out = at::empty({n_rows, params.num_splits, HEAD_DIM}, q.options());
    partial_lse = at::empty({n_rows, params.num_splits}, q.options().dtype(at::kFloat));
    params.partial_out = partial_out.data_ptr();
    params.partial_lse = partial_lse.data_ptr<float>();
  }

  const dim3 grid(params.num_m_tiles * params.num_splits,
                  params.batch * params.num_kv_heads);
  if constexpr (OPTIONS == OptionSet::kNone) {
    if (merge_in_cluster)
      return launch_dependent(tree_attn_kernel<T, HEAD_DIM, KEY_SPLIT, WARPS, true>, grid,
                              Cfg::kThreads, Cfg::kSmemBytes, stream, device, params,
                              params.num_splits);
  }
  launch_dependent(tree_attn_kernel<T, HEAD_DIM, KEY_SPLIT, WARPS, false, OPTIONS, KV>, grid,
                   Cfg::kThreads, Cfg::kSmemBytes, stream, device, params);

  if (params.num_splits > few_splits_capacity(HEAD_DIM)) {
    constexpr auto merge = merge_splits_kernel<T, HEAD_DIM, OPTIONS != OptionSet::kNone>;
    const dim3 merge_grid(n_rows, HEAD_DIM / kMergeDims);
    launch_dependent(merge, merge_grid, kMergeThreads,
                     merge_spread_smem<merge>(device, int64_t{merge_grid.x} * merge_grid.y),
                     stream, device, params);
  } else if (params.num_splits > 1) {
    constexpr auto merge = merge_few_splits_kernel<T, HEAD_DIM, OPTIONS != OptionSet::kNone>;
    const int rows_per_cta =
        kFewSplitThreads / (few_split_lanes(params.num_splits, HEAD_DIM) * (HEAD_DIM / 4));
    const int64_t merge_ctas = ceil_div64(n_rows, rows_per_cta);
    launch_dependent(merge, dim3(merge_ctas), kFewSplitThreads,
                     merge_spread_smem<merge>(device, merge_ctas), stream, device, params);
  }
}

}  // namespace launch_detail

namespace launch_detail {

template <typename T, int HEAD_DIM, OptionSet OPTIONS>
void launch_for_tile(TreeAttnParams& params, const at::Tensor& q, int64_t max_context,
                     cudaStream_t stream) {
  const int device = q.get_device();
  TileFit fit{};
#ifdef VERIFY_OPS_SM90A
  // The producer kernel needs wgmma and setmaxnreg: built only where every
  // sm_90 target of the build is sm_90a (setup.py).
  fit.producer = device_attribute<cudaDevAttrComputeCapabilityMajor>(device) == 9 &&
                 fits_in_shared_memory<HEAD_DIM, 1, 12>(device);
#endif
  fit.two_warpgroups = fits_in_shared_memory<HEAD_DIM, 1, 8>(device);
  fit.one_warpgroup = fits_in_shared_memory<HEAD_DIM, 1>(device);
  const int64_t kv_head_pairs = static_cast<int64_t>(params.batch) * params.num_kv_heads;
  switch (choose_tile(HEAD_DIM, params.rows_per_kv_head, kv_head_pairs, fit)) {
    case TileChoice::kKeySplit4:
      if constexpr (TileConfig<HEAD_DIM>::kBlockN >= 64)
        return launch_config<T, HEAD_DIM, 4, 4, OPTIONS, T>(params, q, max_context, stream);
      break;
    case TileChoice::kKeySplit2:
      return launch_config<T, HEAD_DIM, 2, 4, OPTIONS, T>(params, q, max_context, stream);
    case TileChoice::kOneWarpgroup:
      return launch_config<T, HEAD_DIM, 1, 4, OPTIONS, T>(params, q, max_context, stream);
    case TileChoice::kTwoWarpgroups:
      return launch_config<T, HEAD_DIM, 1, 8, OPTIONS, T>(params, q, max_context, stream);
    case TileChoice::kProducer:
#ifdef VERIFY_OPS_SM90A
      return launch_config<T, HEAD_DIM, 1, 12, OPTIONS, T>(params, q, max_context, stream);
#endif
      break;
  }
  TORCH_CHECK(false, "verify.tree_attn: no kernel for this tile choice (a bug)");
}

// An fp8 pool runs the four-warp mma.sync kernels: the key splits for few
// rows, else 64-row tiles (more rows take more row tiles, each reading the
// split's KV from L2).
template <typename T, int HEAD_DIM, typename KV>
void launch_fp8(TreeAttnParams& params, const at::Tensor& q, int64_t max_context,
                cudaStream_t stream) {
  const int device = q.get_device();
  TORCH_CHECK(device_attribute<cudaDevAttrComputeCapabilityMajor>(device) * 10 +
                      device_attribute<cudaDevAttrComputeCapabilityMinor>(device) >= 89,
              "verify.tree_attn: an fp8 KV cache needs a GPU of compute capability 8.9 or "
              "newer on CUDA");
  if constexpr (HEAD_DIM <= 128) {
    if (params.rows_per_kv_head <= 16)
      return launch_config<T, HEAD_DIM, 4, 4, OptionSet::kAll, KV>(params, q, max_context, stream);
  }
  if (params.rows_per_kv_head <= 32 || !fits_in_shared_memory<HEAD_DIM, 1, 4, 1>(device))
    return launch_config<T, HEAD_DIM, 2, 4, OptionSet::kAll, KV>(params, q, max_context, stream);
  return launch_config<T, HEAD_DIM, 1, 4, OptionSet::kAll, KV>(params, q, max_context, stream);
}

}  // namespace launch_detail

template <typename T, int HEAD_DIM>
void launch_tree_attn(TreeAttnParams& params, const at::Tensor& q, int64_t max_context,
                      bool options, KvDtype kv_dtype, cudaStream_t stream) {
  using namespace launch_detail;
  // A window reads at most W + D positions of a request (from prefix - W on):
  // splits past those would start empty, and past the few-split merge's
  // capacity take the split-parallel merge (8/1/64 D8, 64k, window 128:
  // 10.7 us, against 5.7 us at a 256-token context, H100).
  if (params.sliding_window >= 0)
    max_context = std::min<int64_t>(max_context, int64_t{params.sliding_window} + params.num_drafts);
  switch (kv_dtype) {
    case KvDtype::kFp8E4m3:
      return launch_fp8<T, HEAD_DIM, __nv_fp8_e4m3>(params, q, max_context, stream);
    case KvDtype::kFp8E5m2:
      return launch_fp8<T, HEAD_DIM, __nv_fp8_e5m2>(params, q, max_context, stream);
    case KvDtype::kSameAsQ:
      if (!options)
        return launch_for_tile<T, HEAD_DIM, OptionSet::kNone>(params, q, max_context, stream);
      if (params.logit_cap > 0.f || params.sliding_window >= 0)
        return launch_for_tile<T, HEAD_DIM, OptionSet::kAll>(params, q, max_context, stream);
      return launch_for_tile<T, HEAD_DIM, OptionSet::kTotals>(params, q, max_context, stream);
  }
}

#if VERIFY_OPS_CTA_STAMPS
// This translation unit's stamp table (its kernels' g_cta_stamps).
template <int HEAD_DIM>
void* cta_stamps_table() {
  void* address = nullptr;
  C10_CUDA_CHECK(cudaGetSymbolAddress(&address, g_cta_stamps));
  return address;
}
#endif

}  // namespace verify_ops
