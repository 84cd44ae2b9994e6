// CPU kernel for verify.tree_attn_out.
//
// Work items are (request, KV head, KV split). An item walks its part of the
// request's KV range in tiles of about kTileTokens tokens: each tile is gathered
// from the pool once for all D * (Hq / Hkv) query rows of the head
// (kv_tile.cpp); the scores S = Q.K^T and the update O += P.V are small
// matrix products through at::native::cpublas::brgemm (tile_products.cpp:
// in fp32, or in bf16 on AMX for a bf16 q and pool), and the online softmax
// between them runs in vectorized fp32 loops (online_softmax.cpp).
//
// Splits: when the (request, KV head) pairs are fewer than the threads
// (at::get_num_threads()), each request's KV range is cut into
// ceil(threads / pairs) equal parts (in steps of kGatherTokens; fewer where
// the longest range has under kMinSplitTokens per part); the thread that
// finishes a pair's last part merges the parts by their maxima and sums, in
// part order, as it writes the output. The result therefore depends on the
// thread count, but never on where a request's slots lie: tiles and splits
// follow logical positions, and slots only say where to read.
//
// Each thread keeps its tile buffers across calls (cpu/buffer.h), so a call
// allocates nothing per tile or per thread.
//
// Options follow verify_ops.tree_attn_ref: fp8 pools are read through their
// scales, the soft-cap applies to the scaled scores, sinks enter the
// denominator only, the sliding window counts drafts by tree depth and tiles
// before seq_len - W are never read, and lse is the natural-log LSE.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "common/check_message.h"
#include "common/index_reader.h"
#include "common/tree_attn_args.h"
#include "cpu/buffer.h"
#include "cpu/kv_tile.h"
#include "cpu/online_softmax.h"
#include "cpu/tile_products.h"
#include "ops.h"

namespace verify_ops {
namespace {

// Keys per tile: brgemm's N for Q.K^T and K for P.V. A range's last tile
// takes what is left, up to kMaxTileTokens (a remainder of a few keys, often
// just the drafts, would cost a tile's fixed work for almost nothing), padded
// to a multiple of kGatherTokens with zero keys (masked).
constexpr int64_t kTileTokens = 256;
constexpr int64_t kMaxTileTokens = kTileTokens + 64;
static_assert(kTileTokens % cpu::kGatherTokens == 0 && kMaxTileTokens % cpu::kGatherTokens == 0 &&
              cpu::kGatherTokens % cpu::kScoreLanes == 0);
// A request's range is split into parts of at least this many tokens: a
// shorter part would cost more in its thread's start and the merge than it
// saves.
constexpr int64_t kMinSplitTokens = 128;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

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

// One request's KV range: positions [first, total), and its tree.
struct RequestRange {
  int64_t req_row;  // row of req_to_token
  int64_t prefix;   // L = seq_lens[b]
  int64_t first;    // max(0, L - W) with a window, else 0: nothing before is visible
  int64_t total;    // L + D
  const int64_t* depth;          // [D]: draft j's ancestors; it sits at position L + depth[j]
  const uint8_t* draft_visible;  // [D, D]: draft i sees draft j (tree mask and window)
};

// Softmax state of one item's query rows: acc [rows, d] not yet divided by
// sum; max and sum per row.
struct RowState {
  float* acc;
  float* max;
  float* sum;
};

// Per-thread buffers for one (request, KV head) at a time, beside the tile
// products' own; kept across calls like them (see tile_products.h).
struct Scratch {
  cpu::Buffer<float> scores, acc, max, sum, part_weights;
  cpu::Buffer<int64_t> slots, window_lo;
  cpu::Buffer<const float*> part_rows;

  void reset(int64_t rows, int64_t d, int64_t drafts, int64_t parts) {
    scores.grow(rows * kMaxTileTokens);
    acc.grow(rows * d);
    max.grow(rows);
    sum.grow(rows);
    slots.grow(kMaxTileTokens + cpu::kGatherTokens);
    window_lo.grow(drafts);
    part_weights.grow(parts);
    part_rows.grow(parts);
  }

  RowState state() { return {acc.data(), max.data(), sum.data()}; }
};

template <typename T>
T& thread_instance() {
  thread_local T object;
  return object;
}

// The calling thread's tile products and scratch, sized for this call; the
// tile products are released when it goes out of scope.
template <typename Tiles>
struct ThreadBuffers {
  Tiles& tiles;
  Scratch& sc;

  ThreadBuffers(int64_t rows, int64_t d, int64_t drafts, int64_t parts)
      : tiles(thread_instance<Tiles>()), sc(thread_instance<Scratch>()) {
    tiles.reset(rows, d, kMaxTileTokens);
    sc.reset(rows, d, drafts, parts);
  }
  ~ThreadBuffers() { tiles.release(); }
  ThreadBuffers(const ThreadBuffers&) = delete;
  ThreadBuffers& operator=(const ThreadBuffers&) = delete;
};

template <typename q_t, typename kv_t>
struct TreeAttnCpu {
  const TreeAttnShape& s;
  const CpuOptions& opt;
  const at::Tensor& q;
  const at::Tensor& k_cache;
  const at::Tensor& v_cache;
  const at::Tensor& out;
  IndexReader r2t;
  int64_t group, rows;

  // Query row r of KV head kvh is draft r / group of q head kvh * group + r % group.
  int64_t token_of(int64_t b, int64_t r) const { return b * s.num_drafts + r / group; }
  int64_t head_of(int64_t kvh, int64_t r) const { return kvh * group + r % group; }

  // Sets the scores of keys a row must not see to -inf, in the tile of
  // `width` keys from position `start` of a range that ends at `end`: prefix
  // keys before the row's window, drafts it does not see, padding.
  void mask_tile(const RequestRange& req, const int64_t* window_lo, int64_t start,
                 int64_t width, int64_t end, float* scores) const {
    const int64_t D = s.num_drafts, L = req.prefix, stop = start + width;
    const int64_t drafts_from = std::max(start, L), drafts_to = std::min(end, stop);
    const int64_t padding_from = std::max(start, std::min(end, stop));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r / group;
      float* row = scores + r * kMaxTileTokens;  // key t at position start + t
      const int64_t hidden_to = std::clamp(std::min(window_lo[i], L), start, stop);
      std::fill(row, row + (hidden_to - start), kNegInf);
      const uint8_t* visible = req.draft_visible + i * D;  // draft j at position L + j
      for (int64_t pos = drafts_from; pos < drafts_to; ++pos)
        if (!visible[pos - L]) row[pos - start] = kNegInf;
      std::fill(row + (padding_from - start), row + width, kNegInf);
    }
  }

  // Attends the rows of (request b, KV head kvh) to positions [begin, end)
  // of its range, from a zero state into `state`.
  template <typename Tiles>
  void attend(int64_t b, int64_t kvh, const RequestRange& req, int64_t begin, int64_t end,
              Tiles& tiles, Scratch& sc, RowState state) const {
    const int64_t D = s.num_drafts, d = s.head_dim, L = req.prefix;
    // A draft at position P sees positions >= P - W.
    int64_t highest_lo = std::numeric_limits<int64_t>::min();
    for (int64_t j = 0; j < D; ++j) {
      sc.window_lo[j] = opt.window >= 0 ? L + req.depth[j] - opt.window
                                        : std::numeric_limits<int64_t>::min();
      highest_lo = std::max(highest_lo, sc.window_lo[j]);
    }
    const q_t* q_ptr = q.data_ptr<q_t>();
    for (int64_t r = 0; r < rows; ++r)
      tiles.set_query(r, q_ptr + token_of(b, r) * q.stride(0) + head_of(kvh, r) * q.stride(1),
                      opt.score_scale);
    const float post_scale = Tiles::kScaledQueries ? 1.f : opt.score_scale;
    std::fill(state.acc, state.acc + rows * d, 0.f);
    std::fill(state.max, state.max + rows, kNegInf);
    std::fill(state.sum, state.sum + rows, 0.f);

    const kv_t* k_head = static_cast<const kv_t*>(k_cache.data_ptr()) + kvh * k_cache.stride(1);
    const kv_t* v_head = static_cast<const kv_t*>(v_cache.data_ptr()) + kvh * v_cache.stride(1);
    float* scores = sc.scores.data();
    for (int64_t start = begin, keys; start < end; start += keys) {
      keys = end - start <= kMaxTileTokens ? end - start : kTileTokens;
      const int64_t width =
          (keys + cpu::kGatherTokens - 1) / cpu::kGatherTokens * cpu::kGatherTokens;
      // The tile's slots (-1 past `end`: padding), then the next
      // kGatherTokens ones, only prefetched (-1 past the drafts).
      for (int64_t t = 0; t < width + cpu::kGatherTokens; ++t) {
        const int64_t pos = start + t;
        sc.slots[t] = pos < (t < width ? end : req.total) ? r2t(req.req_row, pos) : -1;
      }
      tiles.load(k_head, k_cache.stride(0), v_head, v_cache.stride(0), sc.slots.data(), width);
      tiles.scores(scores);
      if (post_scale != 1.f || opt.logit_cap > 0)
        for (int64_t r = 0; r < rows; ++r)
          cpu::scale_and_cap(scores + r * kMaxTileTokens, width, post_scale, opt.logit_cap);
      // Only tiles with drafts, padding or a window edge need a per-key mask.
      if (start + width > std::min(L, end) || start < highest_lo)
        mask_tile(req, sc.window_lo.data(), start, width, end, scores);
      cpu::online_softmax_tile(scores, rows, width, kMaxTileTokens, state.max, state.sum, state.acc,
                               d);
      tiles.accumulate(scores, state.acc);
    }
  }

  // Writes out (and lse) for the rows of (b, kvh) from the states of `count`
  // parts over disjoint key ranges, merged by their maxima in part order.
  void finish(int64_t b, int64_t kvh, const RowState* parts, int64_t count, Scratch& sc) const {
    const int64_t d = s.head_dim;
    q_t* out_ptr = out.data_ptr<q_t>();
    const float** part_rows = sc.part_rows.data();
    float* weights = sc.part_weights.data();
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t tok = token_of(b, r), head = head_of(kvh, r);
      float max = kNegInf;
      for (int64_t p = 0; p < count; ++p) max = std::max(max, parts[p].max[r]);
      // A sink adds exp(sink) to the denominator only. A row that sees no
      // key (empty prefix, empty mask row) outputs zeros.
      const float sink = opt.sinks ? opt.sinks[head] : kNegInf;
      const bool seen = max != kNegInf;
      float sum = 0.f;
      for (int64_t p = 0; p < count; ++p) {
        weights[p] = seen ? std::exp(parts[p].max[r] - max) : 0.f;  // 0: a part that saw nothing
        sum += weights[p] * parts[p].sum[r];
        part_rows[p] = parts[p].acc + r * d;
      }
      const float denom = seen ? sum + std::exp(sink - max) : 0.f;
      const float inv = seen ? opt.value_scale / denom : 0.f;
      for (int64_t p = 0; p < count; ++p) weights[p] *= inv;
      cpu::weighted_sum_row(part_rows, weights, count, d,
                            out_ptr + tok * out.stride(0) + head * out.stride(1));
      if (opt.lse)
        opt.lse[tok * opt.lse_stride_token + head * opt.lse_stride_head] =
            seen ? max + std::log(denom) : sink;
    }
  }
};

template <typename q_t, typename kv_t, typename Tiles>
void tree_attn_cpu(const TreeAttnShape& s, const at::Tensor& q, const at::Tensor& k_cache,
                   const at::Tensor& v_cache, const at::Tensor& req_to_token,
                   const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                   const at::Tensor& tree_mask, const CpuOptions& opt, const at::Tensor& out) {
  const int64_t group = s.num_q_heads / s.num_kv_heads;
  const int64_t rows = s.num_drafts * group, d = s.head_dim;
  const int64_t D = s.num_drafts;
  const TreeAttnCpu<q_t, kv_t> kernel{s, opt, q, k_cache, v_cache, out,
                                      IndexReader(req_to_token), group, rows};
  const IndexReader rpi(req_pool_indices), lens(seq_lens);

  // Each request's range and tree, once for all its KV heads and parts.
  std::vector<RequestRange> requests(s.batch);
  std::vector<int64_t> depth(s.batch * D);
  std::vector<uint8_t> draft_visible(s.batch * D * D);
  const bool* mask = tree_mask.data_ptr<bool>();
  for (int64_t b = 0; b < s.batch; ++b) {
    RequestRange& req = requests[b];
    req.req_row = rpi(b);
    req.prefix = lens(b);
    req.first = opt.window >= 0 ? std::max<int64_t>(0, req.prefix - opt.window) : 0;
    req.total = req.prefix + D;
    req.depth = depth.data() + b * D;
    req.draft_visible = draft_visible.data() + b * D * D;
    auto mask_at = [&](int64_t i, int64_t j) {
      return mask[b * tree_mask.stride(0) + i * tree_mask.stride(1) + j * tree_mask.stride(2)];
    };
    for (int64_t j = 0; j < D; ++j)
      for (int64_t k = 0; k < D; ++k) depth[b * D + j] += k != j && mask_at(j, k);
    // Draft i at L + depth[i] sees draft j at L + depth[j] inside its window
    // when depth[j] >= depth[i] - W.
    for (int64_t i = 0; i < D; ++i)
      for (int64_t j = 0; j < D; ++j)
        draft_visible[(b * D + i) * D + j] =
            mask_at(i, j) && (opt.window < 0 || req.depth[j] >= req.depth[i] - opt.window);
  }
  const int64_t pairs = s.batch * s.num_kv_heads;
  const int64_t threads = at::get_num_threads();
  int64_t longest = 0;
  for (const RequestRange& req : requests) longest = std::max(longest, req.total - req.first);
  const int64_t splits =
      pairs >= threads ? 1
                       : std::max<int64_t>(1, std::min((threads + pairs - 1) / pairs,
                                                       longest / kMinSplitTokens));

  if (splits == 1) {
    at::parallel_for(0, pairs, 1, [&](int64_t lo, int64_t hi) {
      ThreadBuffers<Tiles> buffers(rows, d, D, 1);
      Scratch& sc = buffers.sc;
      for (int64_t pair = lo; pair < hi; ++pair) {
        const int64_t b = pair / s.num_kv_heads, kvh = pair % s.num_kv_heads;
        const RowState state = sc.state();
        kernel.attend(b, kvh, requests[b], requests[b].first, requests[b].total, buffers.tiles,
                      sc, state);
        kernel.finish(b, kvh, &state, 1, sc);
      }
    });
    return;
  }

  // Item (pair, part) covers part `part` of `splits` equal parts of its
  // request's range, cut at multiples of kGatherTokens; a part may be empty.
  // Its state goes to `partial`; the thread that finishes a pair's last part
  // merges the pair's parts in their order (so the result does not depend on
  // which thread that is) and writes the output, all in one parallel region.
  auto part_start = [&](const RequestRange& req, int64_t part) {
    const int64_t steps = (req.total - req.first + cpu::kGatherTokens - 1) / cpu::kGatherTokens;
    return std::min(req.total, req.first + steps * part / splits * cpu::kGatherTokens);
  };
  // Each state on its own cache lines.
  const int64_t state_floats = (rows * d + 2 * rows + 15) / 16 * 16;
  cpu::Buffer<float>& partial = thread_instance<cpu::Buffer<float>>();
  partial.grow(pairs * splits * state_floats);
  auto partial_state = [&](int64_t item) {
    float* base = partial.data() + item * state_floats;
    return RowState{base, base + rows * d, base + rows * d + rows};
  };
  std::unique_ptr<std::atomic<int64_t>[]> parts_left(new std::atomic<int64_t>[pairs]);
  for (int64_t pair = 0; pair < pairs; ++pair) parts_left[pair].store(splits);
  at::parallel_for(0, pairs * splits, 1, [&](int64_t lo, int64_t hi) {
    ThreadBuffers<Tiles> buffers(rows, d, D, splits);
    std::vector<RowState> parts(splits);
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t pair = item / splits, part = item % splits;
      const int64_t b = pair / s.num_kv_heads, kvh = pair % s.num_kv_heads;
      const RequestRange& req = requests[b];
      kernel.attend(b, kvh, req, part_start(req, part), part_start(req, part + 1),
                    buffers.tiles, buffers.sc, partial_state(item));
      // acq_rel: the last one sees every other part's state.
      if (parts_left[pair].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      for (int64_t p = 0; p < splits; ++p) parts[p] = partial_state(pair * splits + p);
      kernel.finish(b, kvh, parts.data(), splits, buffers.sc);
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
  if (s.batch == 0 || s.num_drafts == 0 || s.num_q_heads == 0) return;  // nothing to write
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
  // q is fp32, bf16 or fp16; the pool has q's dtype or an fp8 one.
  auto run = [&](auto q_zero) {
    using q_t = decltype(q_zero);
    auto with_kv = [&](auto kv_zero) {
      using kv_t = decltype(kv_zero);
      constexpr bool bf16_pool = std::is_same_v<q_t, c10::BFloat16> && std::is_same_v<kv_t, q_t>;
      if constexpr (bf16_pool) {
        if (cpu::Bf16TileProducts::available(s.head_dim))
          return tree_attn_cpu<q_t, kv_t, cpu::Bf16TileProducts>(
              s, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, tree_mask, opt,
              out);
      }
      tree_attn_cpu<q_t, kv_t, cpu::Fp32TileProducts>(s, q, k_cache, v_cache, req_to_token,
                                                      req_pool_indices, seq_lens, tree_mask,
                                                      opt, out);
    };
    switch (k_cache.scalar_type()) {
      case at::kFloat8_e4m3fn: return with_kv(c10::Float8_e4m3fn());
      case at::kFloat8_e5m2: return with_kv(c10::Float8_e5m2());
      default: return with_kv(q_t());
    }
  };
  AT_DISPATCH_SWITCH(q.scalar_type(), "tree_attn_cpu",
                     AT_DISPATCH_CASE(at::kFloat, [&] { run(scalar_t()); })
                     AT_DISPATCH_CASE(at::kBFloat16, [&] { run(scalar_t()); })
                     AT_DISPATCH_CASE(at::kHalf, [&] { run(scalar_t()); }));
}

TORCH_LIBRARY_IMPL(verify, CPU, m) {
  m.impl("tree_attn_out", &tree_attn_out_cpu);
}

}  // namespace verify_ops
