// CUDA entry points for verify.tree_attn: argument checks, the split choice,
// workspace from PyTorch's caching allocator, and launches on the current
// stream. Nothing here reads tensor values, so it is safe to capture in a
// CUDA graph (unless VERIFY_OPS_DEBUG=1 turns on the value checks).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "common/check_message.h"
#include "common/debug_checks.h"
#include "common/tree_attn_args.h"
#include "cuda/tree_attn/kernel.cuh"
#include "ops.h"

namespace verify_ops {
namespace {

constexpr const char* kOp = "verify.tree_attn";

// A positive per-device value, computed once per device by `query`. Each
// call site (template instantiation) keeps its own table.
template <typename Query>
int cached_per_device(std::vector<int>& table, std::mutex& mu, int device, Query query) {
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(table.size())) table.resize(device + 1, 0);
  if (table[device] == 0) table[device] = query();
  return table[device];
}

template <cudaDeviceAttr ATTR>
int device_attribute(int device) {
  static std::mutex mu;
  static std::vector<int> table;
  return cached_per_device(table, mu, device, [&] {
    int value = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, ATTR, device));
    return value;
  });
}

// Programmatic dependent launch needs sm_90 or newer.
bool supports_dependent_launch(int device) {
  return device_attribute<cudaDevAttrComputeCapabilityMajor>(device) >= 9;
}

template <int HEAD_DIM, int KEY_SPLIT, int WARPS = 4>
bool fits_in_shared_memory(int device) {
  return TileConfig<HEAD_DIM, KEY_SPLIT, WARPS>::kSmemBytes <=
         device_attribute<cudaDevAttrMaxSharedMemoryPerBlockOptin>(device);
}

// Opts the attention kernel into its dynamic shared memory and returns how
// many of its CTAs one SM holds at once (registers and shared memory): once
// per device, on the current one.
template <typename T, int HEAD_DIM, int KEY_SPLIT, int WARPS, bool CLUSTER_MERGE = false>
int prepare_attention_kernel(int device) {
  using Cfg = TileConfig<HEAD_DIM, KEY_SPLIT, WARPS>;
  static std::mutex mu;
  static std::vector<int> table;
  return cached_per_device(table, mu, device, [&] {
    auto* kernel = tree_attn_kernel<T, HEAD_DIM, KEY_SPLIT, WARPS, CLUSTER_MERGE>;
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
// (NOTES, v14.3). Only where the merge grid fits on the SMs, so that it
// stays one wave.
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

// A cache's bytes between pool slots; a one-slot pool may carry any stride,
// and only slot 0 is ever read from it.
int64_t slot_bytes(const at::Tensor& cache) {
  return cache.size(0) <= 1 ? 0 : cache.stride(0) * cache.element_size();
}

bool aligned_16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 &&
         t.stride(0) % 8 == 0 && t.stride(1) % 8 == 0;
}

// Splits along the KV sequence, from shapes and the device only: as many as
// one wave of resident CTAs holds. Rounding up instead would start a sliver of
// a second wave (5 splits of 64 CTAs on 264 slots run two waves where 4 run
// one). A split never covers fewer than `min_tokens`.
int choose_num_splits(int64_t ctas_without_split, int64_t resident_ctas, int64_t max_context,
                      int min_tokens) {
  const int64_t fit = resident_ctas / std::max<int64_t>(ctas_without_split, 1);
  const int64_t most = std::max<int64_t>(1, ceil_div64(max_context, min_tokens));
  return static_cast<int>(std::clamp<int64_t>(fit, 1, std::min<int64_t>(most, kMaxSplits)));
}

template <typename T, int HEAD_DIM, int KEY_SPLIT, int WARPS = 4>
void launch(TreeAttnParams& params, const at::Tensor& q, int64_t max_context,
            cudaStream_t stream) {
  using Cfg = TileConfig<HEAD_DIM, KEY_SPLIT, WARPS>;
  const int64_t rows = params.rows_per_kv_head;
  params.num_m_tiles = static_cast<int>(ceil_div64(rows, Cfg::kBlockM));
  // Two tiles per split at least: CTAs enough to fill every SM matter more
  // than the partials, which the merge reads back from L2. But no fewer tokens
  // than the CTA has rows, so that a split's partials weigh at most half the K
  // and V it reads (128 rows at head_dim 256: four tiles, not two).
  params.split_min_tokens = std::max(2 * Cfg::kBlockN, Cfg::kBlockM);
  const int64_t ctas = static_cast<int64_t>(params.batch) * params.num_kv_heads *
                       params.num_m_tiles;
  const int device = q.get_device();
  const int64_t resident_ctas =
      static_cast<int64_t>(device_attribute<cudaDevAttrMultiProcessorCount>(device)) *
      prepare_attention_kernel<T, HEAD_DIM, KEY_SPLIT, WARPS>(device);
  params.num_splits =
      choose_num_splits(ctas, resident_ctas, max_context, params.split_min_tokens);
  // A few splits past the few-split merge's capacity cost less left out than
  // merged by the split-parallel merge (NOTES v26).
  const int few_splits = few_splits_capacity(HEAD_DIM);
  if (params.num_splits > few_splits && params.num_splits * 16 <= few_splits * 17)
    params.num_splits = few_splits;
  // A few splits merge inside their cluster, where all the clusters fit at
  // once (else the grid would run a second wave, NOTES v23).
  const bool merge_in_cluster =
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
  if (merge_in_cluster)
    return launch_dependent(tree_attn_kernel<T, HEAD_DIM, KEY_SPLIT, WARPS, true>, grid,
                            Cfg::kThreads, Cfg::kSmemBytes, stream, device, params,
                            params.num_splits);
  launch_dependent(tree_attn_kernel<T, HEAD_DIM, KEY_SPLIT, WARPS, false>, grid, Cfg::kThreads,
                   Cfg::kSmemBytes, stream, device, params);

  if (params.num_splits > few_splits) {
    constexpr auto merge = merge_splits_kernel<T, HEAD_DIM>;
    const dim3 merge_grid(n_rows, HEAD_DIM / kMergeDims);
    launch_dependent(merge, merge_grid, kMergeThreads,
                     merge_spread_smem<merge>(device, int64_t{merge_grid.x} * merge_grid.y),
                     stream, device, params);
  } else if (params.num_splits > 1) {
    constexpr auto merge = merge_few_splits_kernel<T, HEAD_DIM>;
    const int rows_per_cta =
        kFewSplitThreads / (few_split_lanes(params.num_splits, HEAD_DIM) * (HEAD_DIM / 4));
    const int64_t merge_ctas = ceil_div64(n_rows, rows_per_cta);
    launch_dependent(merge, dim3(merge_ctas), kFewSplitThreads,
                     merge_spread_smem<merge>(device, merge_ctas), stream, device, params);
  }
}

// Few query rows per KV head leave warps of a 64-row tile idle: split each KV
// tile across them instead. More than 64 rows take 128-row tiles where wgmma
// runs them (see TileConfig).
template <typename T, int HEAD_DIM>
void launch_for_rows(TreeAttnParams& params, const at::Tensor& q, int64_t max_context,
                     cudaStream_t stream) {
  if constexpr (TileConfig<HEAD_DIM>::kBlockN >= 64) {
    if (params.rows_per_kv_head <= 16)
      return launch<T, HEAD_DIM, 4>(params, q, max_context, stream);
  }
  if (params.rows_per_kv_head <= 32)
    return launch<T, HEAD_DIM, 2>(params, q, max_context, stream);
  const int device = q.get_device();
  // 128-row tiles (two warpgroups) past 64 rows, except for a single
  // (request, KV head) pair at head_dim <= 128: its two 64-row CTAs per split
  // put twice the SMs to work at short context (1.19-1.25x at 4k) and cost at
  // most 3 % at 64k; at head_dim 256 they lost 15 % there (NOTES v22).
  const bool one_pair = static_cast<int64_t>(params.batch) * params.num_kv_heads == 1;
  const bool wide_tiles = params.rows_per_kv_head > 64 &&
                          !(HEAD_DIM <= 128 && one_pair && params.rows_per_kv_head <= 128);
#ifdef VERIFY_OPS_SM90A
  // A producer warpgroup feeds the two warpgroups where wgmma runs (sm_90a);
  // at head_dim 256 only past 128 rows, where it wins 1.04-1.09x (NOTES v15).
  constexpr int kProducerMinRows = HEAD_DIM == 256 ? 129 : 65;
  if (wide_tiles && params.rows_per_kv_head >= kProducerMinRows &&
      device_attribute<cudaDevAttrComputeCapabilityMajor>(device) == 9 &&
      fits_in_shared_memory<HEAD_DIM, 1, 12>(device))
    return launch<T, HEAD_DIM, 1, 12>(params, q, max_context, stream);
#endif
  if (wide_tiles && fits_in_shared_memory<HEAD_DIM, 1, 8>(device))
    return launch<T, HEAD_DIM, 1, 8>(params, q, max_context, stream);
  // Devices with less shared memory than sm_90 (e.g. sm_120's 99 KB) run
  // the smaller key-split kernel instead.
  if (!fits_in_shared_memory<HEAD_DIM, 1>(device))
    return launch<T, HEAD_DIM, 2>(params, q, max_context, stream);
  return launch<T, HEAD_DIM, 1>(params, q, max_context, stream);
}

template <typename T>
void dispatch_head_dim(TreeAttnParams& params, int64_t head_dim, const at::Tensor& q,
                       int64_t max_context, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return launch_for_rows<T, 64>(params, q, max_context, stream);
    case 128: return launch_for_rows<T, 128>(params, q, max_context, stream);
    case 256: return launch_for_rows<T, 256>(params, q, max_context, stream);
    default:
      VERIFY_CHECK(false, kOp, ": head_dim must be 64, 128 or 256 on CUDA, got ", head_dim);
  }
}

// The shared argument checks plus what only the CUDA kernel requires; `out`
// may be undefined (functional variant).
TreeAttnShape check_cuda_args(const at::Tensor& q, const at::Tensor& k_cache,
                              const at::Tensor& v_cache, const at::Tensor& req_to_token,
                              const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                              const at::Tensor& tree_mask, const at::Tensor& out,
                              const TreeAttnOptions& options) {
  const TreeAttnShape s = check_tree_attn_args(kOp, q, k_cache, v_cache, req_to_token,
                                               req_pool_indices, seq_lens, tree_mask, out,
                                               options);
  VERIFY_CHECK(!is_fp8_kv(k_cache.scalar_type()) && !options.k_scale && !options.v_scale &&
                  !options.capped() && !options.has_sinks() && !options.windowed() &&
                  !options.has_lse(),
              kOp, ": the CUDA kernel does not take fp8 KV, scales, logit_cap, sinks, "
              "sliding_window or lse yet");
  VERIFY_CHECK(q.is_cuda(), kOp, ": the CUDA kernel got q on ", q.device());
  VERIFY_CHECK(s.head_dim == 64 || s.head_dim == 128 || s.head_dim == 256, kOp,
              ": head_dim must be 64, 128 or 256 on CUDA, got ", s.head_dim);
  // The kernels index pool slots and query rows in 32 bits (offsets in 64).
  VERIFY_CHECK(s.pool_size <= UINT32_MAX, kOp, ": the CUDA kernel addresses at most 2^32 pool "
              "slots, got k_cache with ", s.pool_size);
  for (const at::Tensor* cache : {&k_cache, &v_cache})
    VERIFY_CHECK(slot_bytes(*cache) <= UINT32_MAX, kOp, ": the CUDA kernel needs at most 2^32 "
                "bytes between pool slots, got a stride of ", cache->stride(0), " elements");
  // seq_lens + D <= max_ctx (the contract): a request's tokens then fit the
  // kernels' 32-bit token offsets.
  VERIFY_CHECK(s.max_context <= INT32_MAX, kOp, ": the CUDA kernel takes at most 2^31 - 1 "
              "positions per request (req_to_token.size(1)), got ", s.max_context);
  // One grid row of CTAs per (request, KV head): CUDA allows 65535.
  VERIFY_CHECK(s.batch * s.num_kv_heads <= 65535, kOp, ": the CUDA kernel takes at most 65535 "
              "(request, KV head) pairs (bs * Hkv), got ", s.batch, " * ", s.num_kv_heads);
  const int64_t q_rows = s.batch * s.num_drafts * s.num_q_heads;
  VERIFY_CHECK(q_rows <= INT32_MAX, kOp,
              ": the CUDA kernel takes at most 2^31 - 1 query rows (bs * D * Hq), got ", q_rows);
  return s;
}

// Runs the kernels on checked arguments.
void run_tree_attn_cuda(const TreeAttnShape& s, const at::Tensor& q_arg,
                        const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                        const at::Tensor& seq_lens, const at::Tensor& tree_mask,
                        double sm_scale, const at::Tensor& out_arg) {
  const c10::cuda::CUDAGuard guard(q_arg.device());
  if (debug_checks_enabled())
    check_tree_attn_values(kOp, s, req_to_token, req_pool_indices, seq_lens);
  if (s.batch == 0 || s.num_drafts == 0 || s.num_q_heads == 0) return;  // nothing to write
  VERIFY_CHECK(aligned_16(k_cache) && aligned_16(v_cache), kOp,
              ": k_cache and v_cache need 16-byte aligned data and strides that are "
              "multiples of 8 elements, got strides ", k_cache.strides(), " and ",
              v_cache.strides());

  // Unaligned q or out views go through an aligned copy (still capture-safe);
  // a clone, since contiguous() returns a contiguous q at an odd address as it is.
  at::Tensor q = aligned_16(q_arg) ? q_arg : q_arg.clone(at::MemoryFormat::Contiguous);
  // The kernels need a positive scale (they scale each tile's max, not each
  // score, before the max is taken). The scores of a negative scale are those
  // of -q with its magnitude; a zero scale makes every score zero.
  double scale = sm_scale;
  if (sm_scale < 0) {
    q = -q;
    scale = -sm_scale;
  } else if (sm_scale == 0) {
    q = at::zeros_like(q, at::MemoryFormat::Contiguous);
    scale = 1;
  }
  const bool out_aligned = aligned_16(out_arg);
  const at::Tensor out = out_aligned ? out_arg : at::empty(q_arg.sizes(), q_arg.options());

  TreeAttnParams params{};
  params.q = q.data_ptr();
  params.q_stride_token = q.stride(0);
  params.q_stride_head = q.stride(1);
  params.k = k_cache.data_ptr();
  params.v = v_cache.data_ptr();
  params.k_slot_bytes = static_cast<uint32_t>(slot_bytes(k_cache));
  params.k_stride_head = k_cache.stride(1);
  params.v_slot_bytes = static_cast<uint32_t>(slot_bytes(v_cache));
  params.v_stride_head = v_cache.stride(1);
  params.out = out.data_ptr();
  params.out_stride_token = out.stride(0);
  params.out_stride_head = out.stride(1);
  params.req_to_token = req_to_token.data_ptr();
  params.r2t_stride_row = req_to_token.stride(0);
  params.r2t_stride_pos = req_to_token.stride(1);
  params.req_pool_indices = req_pool_indices.data_ptr();
  params.rpi_stride = req_pool_indices.stride(0);
  params.seq_lens = seq_lens.data_ptr();
  params.lens_stride = seq_lens.stride(0);
  params.r2t_is_int64 = req_to_token.scalar_type() == at::kLong;
  params.rpi_is_int64 = req_pool_indices.scalar_type() == at::kLong;
  params.lens_is_int64 = seq_lens.scalar_type() == at::kLong;
  params.tree_mask = tree_mask.data_ptr<bool>();
  params.mask_stride_batch = tree_mask.stride(0);
  params.mask_stride_row = tree_mask.stride(1);
  params.mask_stride_col = tree_mask.stride(2);
  params.batch = static_cast<int>(s.batch);
  params.num_drafts = static_cast<int>(s.num_drafts);
  params.num_q_heads = static_cast<int>(s.num_q_heads);
  params.num_kv_heads = static_cast<int>(s.num_kv_heads);
  params.group = static_cast<int>(s.num_q_heads / s.num_kv_heads);
  params.rows_per_kv_head = params.num_drafts * params.group;
  params.group_div = FastDivmod(params.group);
  params.q_heads_div = FastDivmod(params.num_q_heads);
  params.drafts_div = FastDivmod(params.num_drafts);
  params.scale_log2 = static_cast<float>(scale * 1.4426950408889634);

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  if (q.scalar_type() == at::kBFloat16)
    dispatch_head_dim<__nv_bfloat16>(params, s.head_dim, q, s.max_context, stream);
  else
    dispatch_head_dim<__half>(params, s.head_dim, q, s.max_context, stream);
  if (!out_aligned) out_arg.copy_(out);
}

}  // namespace

void tree_attn_out_cuda(const at::Tensor& q, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& req_to_token,
                        const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                        const at::Tensor& tree_mask, double sm_scale, const at::Tensor& out,
                        const std::optional<at::Tensor>& k_scale,
                        const std::optional<at::Tensor>& v_scale, double logit_cap,
                        const std::optional<at::Tensor>& sinks, int64_t sliding_window,
                        const std::optional<at::Tensor>& lse) {
  const TreeAttnOptions options{k_scale, v_scale, logit_cap, sinks, sliding_window, lse};
  const TreeAttnShape s = check_cuda_args(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                          seq_lens, tree_mask, out, options);
  run_tree_attn_cuda(s, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                     tree_mask, sm_scale, out);
}

#if VERIFY_OPS_CTA_STAMPS
// Only in builds with VERIFY_OPS_CTA_STAMPS=1 (setup.py), for bench/cta_stamps.py:
// the stamp rows of the last call's CTAs ([kStampCtas, kStampSlots] int64, on
// like's device), and their reset to zero, on the current stream.
namespace {

void* stamps_on_device() {
  void* address = nullptr;
  C10_CUDA_CHECK(cudaGetSymbolAddress(&address, g_cta_stamps));
  return address;
}

at::Tensor read_cta_stamps(const at::Tensor& like) {
  const c10::cuda::CUDAGuard guard(like.device());
  at::Tensor rows = at::empty({kStampCtas, kStampSlots}, like.options().dtype(at::kLong));
  C10_CUDA_CHECK(cudaMemcpyAsync(rows.data_ptr(), stamps_on_device(), sizeof(g_cta_stamps),
                                 cudaMemcpyDeviceToDevice,
                                 c10::cuda::getCurrentCUDAStream(like.get_device()).stream()));
  return rows;
}

void reset_cta_stamps(const at::Tensor& like) {
  const c10::cuda::CUDAGuard guard(like.device());
  C10_CUDA_CHECK(cudaMemsetAsync(stamps_on_device(), 0, sizeof(g_cta_stamps),
                                 c10::cuda::getCurrentCUDAStream(like.get_device()).stream()));
}

}  // namespace

TORCH_LIBRARY(verify_stamps, m) {
  m.def("read(Tensor like) -> Tensor", &read_cta_stamps);
  m.def("reset(Tensor like) -> ()", &reset_cta_stamps);
}
#endif

TORCH_LIBRARY_IMPL(verify, CUDA, m) { m.impl("tree_attn_out", &tree_attn_out_cuda); }

}  // namespace verify_ops
