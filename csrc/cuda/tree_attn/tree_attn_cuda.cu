// The CUDA entry point of verify.tree_attn_out: argument checks, the kernel
// parameters, and the launch (launch.cuh, one instantiation per head dim) on
// the current stream. Nothing here reads tensor values, so it is safe to capture in a
// CUDA graph (unless VERIFY_OPS_DEBUG=1 turns on the value checks).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common/check_message.h"
#include "common/debug_checks.h"
#include "common/tree_attn_args.h"
#include "cuda/cta_stamps.cuh"
#include "cuda/tree_attn/params.h"
#include "ops.h"

namespace verify_ops {

// Defined in launch.cuh, instantiated per head dim (instantiate_hdim*.cu).
template <typename T, int HEAD_DIM>
void launch_tree_attn(TreeAttnParams& params, const at::Tensor& q, int64_t max_context,
                      bool options, KvDtype kv_dtype, cudaStream_t stream);
#if VERIFY_OPS_CTA_STAMPS
template <int HEAD_DIM>
void* cta_stamps_table();
#endif

namespace {

constexpr const char* kOp = "verify.tree_attn";

// A cache's bytes between pool slots; a one-slot pool may carry any stride,
// and only slot 0 is ever read from it.
int64_t slot_bytes(const at::Tensor& cache) {
  return cache.size(0) <= 1 ? 0 : cache.stride(0) * cache.element_size();
}

// 16-byte aligned data and strides of whole 16-byte chunks, for cp.async.
bool aligned_16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 &&
         t.stride(0) * t.element_size() % 16 == 0 && t.stride(1) * t.element_size() % 16 == 0;
}

template <typename T>
void dispatch_head_dim(TreeAttnParams& params, int64_t head_dim, const at::Tensor& q,
                       int64_t max_context, bool options, KvDtype kv_dtype,
                       cudaStream_t stream) {
  switch (head_dim) {
    case 64: return launch_tree_attn<T, 64>(params, q, max_context, options, kv_dtype, stream);
    case 128: return launch_tree_attn<T, 128>(params, q, max_context, options, kv_dtype, stream);
    case 256: return launch_tree_attn<T, 256>(params, q, max_context, options, kv_dtype, stream);
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
                        double sm_scale, const at::Tensor& out_arg,
                        const TreeAttnOptions& options) {
  const c10::cuda::CUDAGuard guard(q_arg.device());
  if (debug_checks_enabled())
    check_tree_attn_values(kOp, s, req_to_token, req_pool_indices, seq_lens);
  if (s.batch == 0 || s.num_drafts == 0 || s.num_q_heads == 0) return;  // nothing to write
  VERIFY_CHECK(aligned_16(k_cache) && aligned_16(v_cache), kOp,
              ": k_cache and v_cache need 16-byte aligned data and strides of whole 16 "
              "bytes, got strides ", k_cache.strides(), " and ",
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

  // The options, for the option kernels; a call that uses none runs the plain ones.
  const auto scale_pointer = [](const std::optional<at::Tensor>& t) -> const float* {
    return t.has_value() && t->defined() ? t->data_ptr<float>() : nullptr;
  };
  params.k_scale = scale_pointer(options.k_scale);
  params.v_scale = scale_pointer(options.v_scale);
  params.sinks = options.has_sinks() ? options.sinks->data_ptr<float>() : nullptr;
  params.sinks_stride = options.has_sinks() ? options.sinks->stride(0) : 0;
  params.lse = options.has_lse() ? options.lse->data_ptr<float>() : nullptr;
  params.lse_stride_token = options.has_lse() ? options.lse->stride(0) : 0;
  params.lse_stride_head = options.has_lse() ? options.lse->stride(1) : 0;
  params.logit_cap = static_cast<float>(options.logit_cap);
  params.logit_cap_inverse = options.capped() ? static_cast<float>(1 / options.logit_cap) : 0.f;
  params.sliding_window = static_cast<int>(std::min<int64_t>(options.sliding_window, INT32_MAX));
  const KvDtype kv_dtype = k_cache.scalar_type() == at::kFloat8_e4m3fn ? KvDtype::kFp8E4m3
                           : k_cache.scalar_type() == at::kFloat8_e5m2 ? KvDtype::kFp8E5m2
                                                                       : KvDtype::kSameAsQ;
  const bool uses_options = params.k_scale || params.v_scale || params.sinks || params.lse ||
                            options.capped() || options.windowed() ||
                            kv_dtype != KvDtype::kSameAsQ;

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
  if (q.scalar_type() == at::kBFloat16)
    dispatch_head_dim<__nv_bfloat16>(params, s.head_dim, q, s.max_context, uses_options,
                                     kv_dtype, stream);
  else
    dispatch_head_dim<__half>(params, s.head_dim, q, s.max_context, uses_options, kv_dtype,
                              stream);
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
                     tree_mask, sm_scale, out, options);
}

#if VERIFY_OPS_CTA_STAMPS
// Only in builds with VERIFY_OPS_CTA_STAMPS=1 (setup.py), for the CTA stamps
// probe: the stamp rows of the last call's CTAs ([kStampCtas, kStampSlots]
// int64, on like's device), and their reset to zero, on the current stream.
// Each head dim's translation unit holds its own table: `like` is the q of
// the call whose stamps are wanted, and its last dim picks the table.
namespace {

constexpr size_t kStampBytes = sizeof(unsigned long long) * kStampCtas * kStampSlots;

void* stamps_on_device(const at::Tensor& like) {
  switch (like.size(-1)) {
    case 64: return cta_stamps_table<64>();
    case 128: return cta_stamps_table<128>();
    case 256: return cta_stamps_table<256>();
    default: VERIFY_CHECK(false, "verify_stamps: like must be a q of head_dim 64, 128 or 256");
  }
  return nullptr;
}

at::Tensor read_cta_stamps(const at::Tensor& like) {
  const c10::cuda::CUDAGuard guard(like.device());
  at::Tensor rows = at::empty({kStampCtas, kStampSlots}, like.options().dtype(at::kLong));
  C10_CUDA_CHECK(cudaMemcpyAsync(rows.data_ptr(), stamps_on_device(like), kStampBytes,
                                 cudaMemcpyDeviceToDevice,
                                 c10::cuda::getCurrentCUDAStream(like.get_device()).stream()));
  return rows;
}

void reset_cta_stamps(const at::Tensor& like) {
  const c10::cuda::CUDAGuard guard(like.device());
  C10_CUDA_CHECK(cudaMemsetAsync(stamps_on_device(like), 0, kStampBytes,
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
