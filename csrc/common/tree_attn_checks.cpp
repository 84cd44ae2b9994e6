// Argument checks shared by every backend of verify.tree_attn. The Python fake
// kernels (verify_ops/ops.py) mirror these messages; tests compare the two.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/check_message.h"
#include "common/index_reader.h"
#include "common/tree_attn_args.h"

namespace verify_ops {
namespace {

void check_rank(const char* op, const at::Tensor& t, const char* name,
                int64_t rank, const char* layout) {
  VERIFY_CHECK(t.dim() == rank, op, ": ", name, " must be ", rank, "-D ",
              layout, ", got ", t.dim(), "-D with shape ", t.sizes());
}

void check_index_dtype(const char* op, const at::Tensor& t, const char* name) {
  VERIFY_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op,
              ": ", name, " must have dtype int32 or int64, got ",
              t.scalar_type());
}

void check_device(const char* op, const at::Tensor& t, const char* name,
                  const at::Tensor& q) {
  VERIFY_CHECK(t.device() == q.device(), op, ": ", name,
              " must be on the same device as q (", q.device(), "), got ",
              t.device());
}

void check_last_dim_contiguous(const char* op, const at::Tensor& t,
                               const char* name) {
  VERIFY_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, ": ", name,
              " must have a contiguous last dim (stride 1), got stride ",
              t.stride(-1));
}

// A scale is a one-element fp32 tensor on q's device: a tensor, so that a
// captured graph reads the value current at each replay.
void check_scale(const char* op, const std::optional<at::Tensor>& scale, const char* name,
                 const at::Tensor& q) {
  if (!scale.has_value() || !scale->defined()) return;
  VERIFY_CHECK(scale->numel() == 1 && scale->scalar_type() == at::kFloat &&
                  scale->device() == q.device(),
              op, ": ", name, " must be a one-element float32 tensor on q's device (",
              q.device(), "), got ", scale->numel(), " elements of ", scale->scalar_type(),
              " on ", scale->device());
}

void check_options(const char* op, const TreeAttnOptions& options, const at::Tensor& q,
                   const TreeAttnShape& s) {
  check_scale(op, options.k_scale, "k_scale", q);
  check_scale(op, options.v_scale, "v_scale", q);
  VERIFY_CHECK(options.logit_cap >= 0 && std::isfinite(options.logit_cap), op,
              ": logit_cap must be >= 0 (0 = off) and finite, got ",
              std::to_string(options.logit_cap));
  VERIFY_CHECK(options.sliding_window >= -1, op,
              ": sliding_window must be -1 (off) or >= 0, got ", options.sliding_window);
  if (options.has_sinks()) {
    const at::Tensor& sinks = *options.sinks;
    VERIFY_CHECK(sinks.scalar_type() == at::kFloat, op,
                ": sinks must have dtype float32, got ", sinks.scalar_type());
    check_device(op, sinks, "sinks", q);
    VERIFY_CHECK(sinks.dim() == 1 && sinks.size(0) == s.num_q_heads, op,
                ": sinks must have shape [Hq] = [", s.num_q_heads, "], got ", sinks.sizes());
  }
  if (options.has_lse()) {
    const at::Tensor& lse = *options.lse;
    VERIFY_CHECK(lse.scalar_type() == at::kFloat, op, ": lse must have dtype float32, got ",
                lse.scalar_type());
    check_device(op, lse, "lse", q);
    VERIFY_CHECK(lse.dim() == 2 && lse.size(0) == q.size(0) && lse.size(1) == s.num_q_heads,
                op, ": lse must have shape [bs*D, Hq] = [", q.size(0), ", ", s.num_q_heads,
                "], got ", lse.sizes());
    for (int64_t d = 0; d < lse.dim(); ++d)
      VERIFY_CHECK(lse.stride(d) != 0 || lse.size(d) <= 1, op,
                  ": lse must not overlap itself (stride 0 on a dim of size > 1), got strides ",
                  lse.strides(), " for shape ", lse.sizes());
  }
}

}  // namespace

bool is_fp8_kv(at::ScalarType dtype) {
  return dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2;
}

TreeAttnShape check_tree_attn_args(const char* op, const at::Tensor& q,
                                   const at::Tensor& k_cache,
                                   const at::Tensor& v_cache,
                                   const at::Tensor& req_to_token,
                                   const at::Tensor& req_pool_indices,
                                   const at::Tensor& seq_lens,
                                   const at::Tensor& tree_mask,
                                   const at::Tensor& out,
                                   const TreeAttnOptions& options) {
  check_rank(op, q, "q", 3, "[bs*D, Hq, head_dim]");
  check_rank(op, k_cache, "k_cache", 3, "[pool, Hkv, head_dim]");
  check_rank(op, v_cache, "v_cache", 3, "[pool, Hkv, head_dim]");
  check_rank(op, req_to_token, "req_to_token", 2, "[R, max_ctx]");
  check_rank(op, req_pool_indices, "req_pool_indices", 1, "[bs]");
  check_rank(op, seq_lens, "seq_lens", 1, "[bs]");
  check_rank(op, tree_mask, "tree_mask", 3, "[bs, D, D]");

  const bool on_cpu = q.device().is_cpu();
  const auto dtype = q.scalar_type();
  VERIFY_CHECK(dtype == at::kBFloat16 || dtype == at::kHalf ||
                  (on_cpu && dtype == at::kFloat),
              op, ": q must have dtype bfloat16 or float16",
              on_cpu ? " (float32 is also accepted on CPU)" : "", ", got ",
              dtype, " on ", q.device());
  VERIFY_CHECK(k_cache.scalar_type() == dtype || is_fp8_kv(k_cache.scalar_type()), op,
              ": k_cache must have the dtype of q (", dtype,
              ") or be float8_e4m3fn or float8_e5m2, got ", k_cache.scalar_type());
  VERIFY_CHECK(v_cache.scalar_type() == k_cache.scalar_type(), op,
              ": v_cache must have the dtype of k_cache (", k_cache.scalar_type(), "), got ",
              v_cache.scalar_type());
  check_index_dtype(op, req_to_token, "req_to_token");
  check_index_dtype(op, req_pool_indices, "req_pool_indices");
  check_index_dtype(op, seq_lens, "seq_lens");
  VERIFY_CHECK(tree_mask.scalar_type() == at::kBool, op,
              ": tree_mask must have dtype bool, got ",
              tree_mask.scalar_type());

  check_device(op, k_cache, "k_cache", q);
  check_device(op, v_cache, "v_cache", q);
  check_device(op, req_to_token, "req_to_token", q);
  check_device(op, req_pool_indices, "req_pool_indices", q);
  check_device(op, seq_lens, "seq_lens", q);
  check_device(op, tree_mask, "tree_mask", q);

  TreeAttnShape s;
  s.batch = seq_lens.size(0);
  VERIFY_CHECK(req_pool_indices.size(0) == s.batch, op,
              ": req_pool_indices must have bs = seq_lens.size(0) = ",
              s.batch, " entries, got ", req_pool_indices.size(0));
  VERIFY_CHECK(tree_mask.size(0) == s.batch, op,
              ": tree_mask.size(0) must equal bs = seq_lens.size(0) = ",
              s.batch, ", got ", tree_mask.size(0));
  if (s.batch > 0) {
    VERIFY_CHECK(q.size(0) % s.batch == 0, op,
                ": q.size(0) must be a multiple of bs = ", s.batch, ", got ",
                q.size(0));
    s.num_drafts = q.size(0) / s.batch;
  } else {
    VERIFY_CHECK(q.size(0) == 0, op,
                ": q.size(0) must be 0 when bs = 0, got ", q.size(0));
    s.num_drafts = tree_mask.size(1);
  }
  VERIFY_CHECK(tree_mask.size(1) == s.num_drafts &&
                  tree_mask.size(2) == s.num_drafts,
              op, ": tree_mask must have shape [bs, D, D] = [", s.batch, ", ",
              s.num_drafts, ", ", s.num_drafts, "] (D = q.size(0) / bs), got ",
              tree_mask.sizes());

  s.num_q_heads = q.size(1);
  s.head_dim = q.size(2);
  s.pool_size = k_cache.size(0);
  s.num_kv_heads = k_cache.size(1);
  VERIFY_CHECK(s.head_dim > 0, op, ": head_dim must be positive, got ",
              s.head_dim);
  VERIFY_CHECK(s.num_kv_heads > 0 && s.num_q_heads % s.num_kv_heads == 0, op,
              ": Hq (q.size(1) = ", s.num_q_heads,
              ") must be a positive multiple of Hkv (k_cache.size(1) = ",
              s.num_kv_heads, ")");
  VERIFY_CHECK(k_cache.size(2) == s.head_dim, op,
              ": k_cache head_dim must equal q's (", s.head_dim, "), got ",
              k_cache.size(2));
  VERIFY_CHECK(v_cache.sizes() == k_cache.sizes(), op,
              ": v_cache must have the shape of k_cache (", k_cache.sizes(),
              "), got ", v_cache.sizes());

  check_last_dim_contiguous(op, q, "q");
  check_last_dim_contiguous(op, k_cache, "k_cache");
  check_last_dim_contiguous(op, v_cache, "v_cache");

  if (out.defined()) {
    VERIFY_CHECK(out.sizes() == q.sizes(), op,
                ": out must have the shape of q (", q.sizes(), "), got ",
                out.sizes());
    VERIFY_CHECK(out.scalar_type() == dtype, op,
                ": out must have the dtype of q (", dtype, "), got ",
                out.scalar_type());
    check_device(op, out, "out", q);
    check_last_dim_contiguous(op, out, "out");
    // An expanded out would have several rows written to one address.
    for (int64_t d = 0; d < out.dim(); ++d)
      VERIFY_CHECK(out.stride(d) != 0 || out.size(d) <= 1, op,
                  ": out must not overlap itself (stride 0 on a dim of size > 1), got strides ",
                  out.strides(), " for shape ", out.sizes());
  }

  check_options(op, options, q, s);
  s.num_req_rows = req_to_token.size(0);
  s.max_context = req_to_token.size(1);
  return s;
}

namespace {

// The value checks, given the ranges found on the host or on the device.
void check_lengths(const char* op, const TreeAttnShape& shape, int64_t len_min,
                   int64_t need) {
  VERIFY_CHECK(len_min >= 0, op, ": seq_lens must be >= 0, got ", len_min);
  VERIFY_CHECK(need <= shape.max_context, op,
              ": seq_lens + D must be <= max_ctx = req_to_token.size(1) = ",
              shape.max_context, ", got ", need);
}

// On the host, plain loops: a dozen tensor ops would cost more than a short
// verify itself.
void check_values_on_host(const char* op, const TreeAttnShape& shape,
                          const at::Tensor& req_to_token, const at::Tensor& req_pool_indices,
                          const at::Tensor& seq_lens) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  const IndexReader r2t(req_to_token), rpi(req_pool_indices), lens(seq_lens);
  int64_t rpi_min = kMax, rpi_max = kMin, len_min = kMax, need = kMin;
  for (int64_t b = 0; b < shape.batch; ++b) {
    rpi_min = std::min(rpi_min, rpi(b));
    rpi_max = std::max(rpi_max, rpi(b));
    len_min = std::min(len_min, lens(b));
    need = std::max(need, lens(b) + shape.num_drafts);
  }
  check_in_range(op, "req_pool_indices", rpi_min, rpi_max, shape.num_req_rows,
                 "req_to_token.size(0)");
  check_lengths(op, shape, len_min, need);
  // Slots actually read: req_to_token[rpi[b], 0 : seq_lens[b] + D].
  int64_t slot_min = kMax, slot_max = kMin;
  for (int64_t b = 0; b < shape.batch; ++b) {
    const int64_t row = rpi(b), used = lens(b) + shape.num_drafts;
    for (int64_t t = 0; t < used; ++t) {
      const int64_t slot = r2t(row, t);
      slot_min = std::min(slot_min, slot);
      slot_max = std::max(slot_max, slot);
    }
  }
  if (slot_min <= slot_max)
    check_in_range(op, "KV slots in req_to_token", slot_min, slot_max, shape.pool_size,
                   "k_cache.size(0)");
}

}  // namespace

void check_tree_attn_values(const char* op, const TreeAttnShape& shape,
                            const at::Tensor& req_to_token,
                            const at::Tensor& req_pool_indices,
                            const at::Tensor& seq_lens) {
  if (shape.batch == 0) return;
  if (req_to_token.is_cpu())
    return check_values_on_host(op, shape, req_to_token, req_pool_indices, seq_lens);
  const auto rpi = req_pool_indices.to(at::kLong);
  const auto lens = seq_lens.to(at::kLong);
  check_in_range(op, "req_pool_indices", rpi.min().item<int64_t>(), rpi.max().item<int64_t>(),
                 shape.num_req_rows, "req_to_token.size(0)");
  check_lengths(op, shape, lens.min().item<int64_t>(),
                (lens + shape.num_drafts).max().item<int64_t>());
  // Slots actually read: req_to_token[rpi[b], 0 : seq_lens[b] + D].
  const auto rows = req_to_token.index_select(0, rpi).to(at::kLong);
  const auto pos = at::arange(shape.max_context, rows.options());
  const auto used = pos.unsqueeze(0) < (lens + shape.num_drafts).unsqueeze(1);
  const auto slots = rows.masked_select(used);
  if (slots.numel() == 0) return;
  check_in_range(op, "KV slots in req_to_token", slots.min().item<int64_t>(),
                 slots.max().item<int64_t>(), shape.pool_size, "k_cache.size(0)");
}

}  // namespace verify_ops
