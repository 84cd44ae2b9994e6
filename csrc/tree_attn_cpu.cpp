// CPU kernel for verify.tree_attn: one task per (request, KV head), online
// softmax over KV tiles, fp32 accumulation. Each KV row is read once for all
// D * (Hq / Hkv) query rows of its head, like the CUDA kernel.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "check_message.h"
#include "tree_attn.h"

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

template <typename scalar_t>
void tree_attn_cpu_kernel(const TreeAttnShape& s, const at::Tensor& q,
                          const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& req_to_token,
                          const at::Tensor& req_pool_indices,
                          const at::Tensor& seq_lens,
                          const at::Tensor& tree_mask, float sm_scale,
                          const at::Tensor& out) {
  const int64_t D = s.num_drafts, d = s.head_dim;
  const int64_t group = s.num_q_heads / s.num_kv_heads;
  const int64_t rows = D * group;  // query rows sharing one KV head

  const scalar_t* q_ptr = q.data_ptr<scalar_t>();
  const scalar_t* k_ptr = k_cache.data_ptr<scalar_t>();
  const scalar_t* v_ptr = v_cache.data_ptr<scalar_t>();
  scalar_t* out_ptr = out.data_ptr<scalar_t>();
  const bool* mask_ptr = tree_mask.data_ptr<bool>();
  const IndexReader r2t(req_to_token), rpi(req_pool_indices), lens(seq_lens);

  at::parallel_for(0, s.batch * s.num_kv_heads, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> qf(rows * d), acc(rows * d), kf(kTileTokens * d),
        vf(kTileTokens * d), scores(rows * kTileTokens), row_max(rows),
        row_sum(rows);
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t b = task / s.num_kv_heads, kvh = task % s.num_kv_heads;
      const int64_t req_row = rpi(b), prefix = lens(b);
      const int64_t total = prefix + D;

      // Row r is draft r / group of query head kvh * group + r % group.
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t tok = b * D + r / group, head = kvh * group + r % group;
        const scalar_t* src = q_ptr + tok * q.stride(0) + head * q.stride(1);
        for (int64_t c = 0; c < d; ++c)
          qf[r * d + c] = static_cast<float>(src[c]) * sm_scale;
      }
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(row_max.begin(), row_max.end(),
                -std::numeric_limits<float>::infinity());
      std::fill(row_sum.begin(), row_sum.end(), 0.f);

      for (int64_t start = 0; start < total; start += kTileTokens) {
        const int64_t n = std::min(kTileTokens, total - start);
        for (int64_t t = 0; t < n; ++t) {
          const int64_t slot = r2t(req_row, start + t);
          const scalar_t* ks =
              k_ptr + slot * k_cache.stride(0) + kvh * k_cache.stride(1);
          const scalar_t* vs =
              v_ptr + slot * v_cache.stride(0) + kvh * v_cache.stride(1);
          for (int64_t c = 0; c < d; ++c) {
            kf[t * d + c] = static_cast<float>(ks[c]);
            vf[t * d + c] = static_cast<float>(vs[c]);
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t draft = r / group;
          const bool* mask_row = mask_ptr + b * tree_mask.stride(0) +
                                 draft * tree_mask.stride(1);
          float tile_max = -std::numeric_limits<float>::infinity();
          for (int64_t t = 0; t < n; ++t) {
            const int64_t pos = start + t;
            float sc = -std::numeric_limits<float>::infinity();
            if (pos < prefix || mask_row[(pos - prefix) * tree_mask.stride(2)]) {
              sc = dot(qf.data() + r * d, kf.data() + t * d, d);
            }
            scores[r * kTileTokens + t] = sc;
            tile_max = std::max(tile_max, sc);
          }
          if (tile_max == -std::numeric_limits<float>::infinity()) continue;
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
        // A row that sees no key (empty prefix, empty mask row) outputs zeros.
        const float inv = row_sum[r] > 0.f ? 1.f / row_sum[r] : 0.f;
        for (int64_t c = 0; c < d; ++c)
          dst[c] = static_cast<scalar_t>(acc[r * d + c] * inv);
      }
    }
  });
}

constexpr const char* kOp = "verify.tree_attn";

// The shared argument checks plus the device; `out` may be undefined
// (functional variant).
TreeAttnShape check_cpu_args(const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& req_to_token,
                             const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                             const at::Tensor& tree_mask, const at::Tensor& out) {
  const TreeAttnShape s = check_tree_attn_args(kOp, q, k_cache, v_cache, req_to_token,
                                               req_pool_indices, seq_lens, tree_mask, out);
  VERIFY_CHECK(q.device().is_cpu(), kOp, ": the CPU kernel got q on ", q.device());
  return s;
}

// Runs the kernel on checked arguments.
void run_tree_attn_cpu(const TreeAttnShape& s, const at::Tensor& q, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& req_to_token,
                       const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                       const at::Tensor& tree_mask, double sm_scale, const at::Tensor& out) {
  // Always on CPU: there is no device to synchronize with, and a bad slot
  // would read out of bounds.
  check_tree_attn_values(kOp, s, req_to_token, req_pool_indices, seq_lens);
  if (s.batch == 0 || s.num_drafts == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(
      at::kBFloat16, at::kHalf, q.scalar_type(), "tree_attn_cpu", [&] {
        tree_attn_cpu_kernel<scalar_t>(s, q, k_cache, v_cache, req_to_token,
                                       req_pool_indices, seq_lens, tree_mask,
                                       static_cast<float>(sm_scale), out);
      });
}

}  // namespace

void tree_attn_out_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                       const at::Tensor& v_cache, const at::Tensor& req_to_token,
                       const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                       const at::Tensor& tree_mask, double sm_scale, const at::Tensor& out) {
  const TreeAttnShape s = check_cpu_args(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                         seq_lens, tree_mask, out);
  run_tree_attn_cpu(s, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                    tree_mask, sm_scale, out);
}

namespace {

at::Tensor tree_attn_cpu(const at::Tensor& q, const at::Tensor& k_cache,
                         const at::Tensor& v_cache, const at::Tensor& req_to_token,
                         const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                         const at::Tensor& tree_mask, double sm_scale) {
  const TreeAttnShape s = check_cpu_args(q, k_cache, v_cache, req_to_token, req_pool_indices,
                                         seq_lens, tree_mask, at::Tensor());
  at::Tensor out = at::empty(q.sizes(), q.options());
  run_tree_attn_cpu(s, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                    tree_mask, sm_scale, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(verify, CPU, m) {
  m.impl("tree_attn", &tree_attn_cpu);
  m.impl("tree_attn_out", &tree_attn_out_cpu);
}

}  // namespace verify_ops
