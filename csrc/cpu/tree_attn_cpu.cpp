// CPU kernel for verify.tree_attn_out: one task per (request, KV head), online
// softmax over KV tiles, fp32 accumulation. Each KV row is read once for all
// D * (Hq / Hkv) query rows of its head, like the CUDA kernel. fp8 pools are
// read through their scales; soft-cap, sinks, the sliding window and the LSE
// output follow verify_ops.tree_attn_ref.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "common/check_message.h"
#include "common/tree_attn_args.h"
#include "ops.h"

namespace verify_ops {
namespace {

constexpr int64_t kTileTokens = 32;

// Reads int32 or int64 index tensors of rank 1 or 2 through their strides.
struct IndexReader {
  const void* data;
  bool is_int64;
  int64_t stride0;
  int64_t stride1;

  explicit IndexReader(const at::Tensor& t)
      : data(t.data_ptr()),
        is_int64(t.scalar_type() == at::kLong),
        stride0(t.stride(0)),
        stride1(t.dim() > 1 ? t.stride(1) : 0) {}

  int64_t operator()(int64_t i, int64_t j = 0) const {
    const int64_t off = i * stride0 + j * stride1;
    return is_int64 ? static_cast<const int64_t*>(data)[off]
                    : static_cast<const int32_t*>(data)[off];
  }
};

// Eight independent partial sums let the compiler vectorize the reduction
// without reassociating floating-point adds.
float dot(const float* a, const float* b, int64_t n) {
  float lanes[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += a[c + j] * b[c + j];
  float sum = 0.f;
  for (; c < n; ++c) sum += a[c] * b[c];
  for (int j = 0; j < 8; ++j) sum += lanes[j];
  return sum;
}

// The options as the kernel uses them: scales as numbers, sinks and lse as
// pointers (null when absent).
struct CpuOptions {
  float score_scale;  // sm_scale * k_scale
  float value_scale;  // v_scale
  float logit_cap;    // 0: off
  int64_t window;     // -1: off
  const float* sinks;
  float* lse;
  int64_t lse_stride_token, lse_stride_head;
};

template <typename scalar_t, typename kv_t>
void tree_attn_cpu_kernel(const TreeAttnShape& s, const at::Tensor& q,
                          const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& req_to_token,
                          const at::Tensor& req_pool_indices,
                          const at::Tensor& seq_lens,
                          const at::Tensor& tree_mask, const CpuOptions& opt,
                          const at::Tensor& out) {
  const int64_t D = s.num_drafts, d = s.head_dim;
  const int64_t group = s.num_q_heads / s.num_kv_heads;
  const int64_t rows = D * group;  // query rows sharing one KV head
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  const scalar_t* q_ptr = q.data_ptr<scalar_t>();
  const kv_t* k_ptr = static_cast<const kv_t*>(k_cache.data_ptr());
  const kv_t* v_ptr = static_cast<const kv_t*>(v_cache.data_ptr());
  scalar_t* out_ptr = out.data_ptr<scalar_t>();
  const bool* mask_ptr = tree_mask.data_ptr<bool>();
  const IndexReader r2t(req_to_token), rpi(req_pool_indices), lens(seq_lens);

  at::parallel_for(0, s.batch * s.num_kv_heads, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> qf(rows * d), acc(rows * d), kf(kTileTokens * d),
        vf(kTileTokens * d), scores(rows * kTileTokens), row_max(rows),
        row_sum(rows);
    std::vector<int64_t> depth(D);
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = task / s.num_kv_heads, kvh = task % s.num_kv_heads;
      const int64_t req_row = rpi(b), prefix = lens(b);
      const int64_t total = prefix + D;
      const bool* mask_b = mask_ptr + b * tree_mask.stride(0);
      auto mask_at = [&](int64_t i, int64_t j) {
        return mask_b[i * tree_mask.stride(1) + j * tree_mask.stride(2)];
      };
      // Draft j sits at position prefix + depth(j): depth counts its ancestors.
      for (int64_t j = 0; j < D; ++j) {
        depth[j] = 0;
        for (int64_t k = 0; k < D; ++k) depth[j] += k != j && mask_at(j, k);
      }
      // Tiles wholly before the root's window hold no visible key.
      const int64_t first =
          opt.window >= 0 ? std::max<int64_t>(0, prefix - opt.window) : 0;

      // Row r is draft r / group of query head kvh * group + r % group.
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t tok = b * D + r / group, head = kvh * group + r % group;
        const scalar_t* src = q_ptr + tok * q.stride(0) + head * q.stride(1);
        for (int64_t c = 0; c < d; ++c)
          qf[r * d + c] = static_cast<float>(src[c]) * opt.score_scale;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(row_max.begin(), row_max.end(), kNegInf);
      std::fill(row_sum.begin(), row_sum.end(), 0.f);

      for (int64_t start = first; start < total; start += kTileTokens) {
        const int64_t n = std::min(kTileTokens, total - start);
        for (int64_t t = 0; t < n; ++t) {
          const int64_t slot = r2t(req_row, start + t);
          const kv_t* ks = k_ptr + slot * k_cache.stride(0) + kvh * k_cache.stride(1);
          const kv_t* vs = v_ptr + slot * v_cache.stride(0) + kvh * v_cache.stride(1);
          for (int64_t c = 0; c < d; ++c) {
            kf[t * d + c] = static_cast<float>(ks[c]);
            vf[t * d + c] = static_cast<float>(vs[c]);
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t draft = r / group;
          const int64_t window_start = prefix + depth[draft] - opt.window;
          float tile_max = kNegInf;
          for (int64_t t = 0; t < n; ++t) {
            const int64_t pos = start + t;
            const bool is_prefix = pos < prefix;
            const int64_t logical = is_prefix ? pos : prefix + depth[pos - prefix];
            bool visible = is_prefix || mask_at(draft, pos - prefix);
            if (opt.window >= 0) visible = visible && logical >= window_start;
            float sc = kNegInf;
            if (visible) {
              sc = dot(qf.data() + r * d, kf.data() + t * d, d);
              if (opt.logit_cap > 0) sc = opt.logit_cap * std::tanh(sc / opt.logit_cap);
            }
            scores[r * kTileTokens + t] = sc;
            tile_max = std::max(tile_max, sc);
          }
          if (tile_max == kNegInf) continue;
          const float new_max = std::max(row_max[r], tile_max);
          const float rescale = std::exp(row_max[r] - new_max);
          row_max[r] = new_max;
          row_sum[r] *= rescale;
          float* a = acc.data() + r * d;
          for (int64_t c = 0; c < d; ++c) a[c] *= rescale;
          for (int64_t t = 0; t < n; ++t) {
            const float p = std::exp(scores[r * kTileTokens + t] - new_max);
            row_sum[r] += p;
            for (int64_t c = 0; c < d; ++c) a[c] += p * vf[t * d + c];
          }
        }
      }

      for (int64_t r = 0; r < rows; ++r) {
        const int64_t tok = b * D + r / group, head = kvh * group + r % group;
        scalar_t* dst = out_ptr + tok * out.stride(0) + head * out.stride(1);
        // A sink adds exp(sink) to the denominator only. A row that sees no
        // key (empty prefix, empty mask row) outputs zeros.
        const float sink = opt.sinks ? opt.sinks[head] : kNegInf;
        const bool seen = row_max[r] != kNegInf;
        const float denom = seen ? row_sum[r] + std::exp(sink - row_max[r]) : 0.f;
        const float inv = seen ? opt.value_scale / denom : 0.f;
        for (int64_t c = 0; c < d; ++c)
          dst[c] = static_cast<scalar_t>(acc[r * d + c] * inv);
        if (opt.lse)
          opt.lse[tok * opt.lse_stride_token + head * opt.lse_stride_head] =
              seen ? row_max[r] + std::log(denom) : sink;
      }
    }
  });
}

constexpr const char* kOp = "verify.tree_attn";

// Reads a one-element scale tensor; None is 1.
float scale_value(const std::optional<at::Tensor>& scale) {
  return scale.has_value() && scale->defined() ? scale->item<float>() : 1.f;
}

}  // namespace

void tree_attn_out_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& req_to_token,
                       const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                       const at::Tensor& tree_mask, double sm_scale, const at::Tensor& out,
                       const std::optional<at::Tensor>& k_scale,
                       const std::optional<at::Tensor>& v_scale, double logit_cap,
                       const std::optional<at::Tensor>& sinks, int64_t sliding_window,
                       const std::optional<at::Tensor>& lse) {
  const TreeAttnOptions options{k_scale, v_scale, logit_cap, sinks, sliding_window, lse};
  const TreeAttnShape s = check_tree_attn_args(kOp, q, k_cache, v_cache, req_to_token,
                                               req_pool_indices, seq_lens, tree_mask, out,
                                               options);
  VERIFY_CHECK(q.device().is_cpu(), kOp, ": the CPU kernel got q on ", q.device());
  // Always on CPU: there is no device to synchronize with, and a bad slot
  // would read out of bounds.
  check_tree_attn_values(kOp, s, req_to_token, req_pool_indices, seq_lens);
  if (s.batch == 0 || s.num_drafts == 0) return;
  CpuOptions opt{};
  opt.score_scale = static_cast<float>(sm_scale) * scale_value(k_scale);
  opt.value_scale = scale_value(v_scale);
  opt.logit_cap = static_cast<float>(logit_cap);
  opt.window = sliding_window;
  at::Tensor sinks_contiguous = options.has_sinks() ? sinks->contiguous() : at::Tensor();
  opt.sinks = options.has_sinks() ? sinks_contiguous.data_ptr<float>() : nullptr;
  if (options.has_lse()) {
    opt.lse = lse->data_ptr<float>();
    opt.lse_stride_token = lse->stride(0);
    opt.lse_stride_head = lse->stride(1);
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "tree_attn_cpu", [&] {
    using q_t = scalar_t;
    auto run = [&](auto kv_zero) {
      tree_attn_cpu_kernel<q_t, decltype(kv_zero)>(s, q, k_cache, v_cache, req_to_token,
                                                   req_pool_indices, seq_lens, tree_mask, opt,
                                                   out);
    };
    switch (k_cache.scalar_type()) {
      case at::kFloat8_e4m3fn: return run(c10::Float8_e4m3fn());
      case at::kFloat8_e5m2: return run(c10::Float8_e5m2());
      default: return run(q_t());
    }
  });
}

TORCH_LIBRARY_IMPL(verify, CPU, m) {
  m.impl("tree_attn_out", &tree_attn_out_cpu);
}

}  // namespace verify_ops
