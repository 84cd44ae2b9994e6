// The two matrix products of a KV tile, S = Q.K^T and O += P.V, through
// at::native::cpublas::brgemm (oneDNN's JIT kernel for the CPU at hand, else
// the BLAS gemm), in one of two precisions:
//
// - Fp32TileProducts: K and V converted to fp32 once per tile; any pool
//   dtype, any CPU. The score scale is folded into Q.
// - Bf16TileProducts: a bf16 q and pool stay bf16 and P is rounded to bf16
//   for P.V (as the GPU kernels do); for CPUs with AMX, where brgemm's bf16
//   kernel ran 3-8x faster than its fp32 one on the shapes used here (one
//   core of the 2-core AMX machine CI runs on). Scores come unscaled.
//
// Both take [rows, head_dim] queries and tiles of up to `max_width` keys
// (`width` a multiple of kGatherTokens per tile), produce fp32 scores
// [rows, width] with row stride max_width, and accumulate into fp32 acc
// [rows, head_dim]. One object per thread serves call after call: reset()
// sizes it, growing its buffers and never shrinking them, so a call neither
// allocates nor faults in fresh pages; release() ends a thread's use.
#pragma once

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>

#include "cpu/buffer.h"
#include "cpu/kv_tile.h"

namespace verify_ops::cpu {

class Fp32TileProducts {
 public:
  static constexpr bool kScaledQueries = true;

  void reset(int64_t rows, int64_t head_dim, int64_t max_width);
  void release() {}

  // Query row r (of head_dim values of q_t: float, c10::BFloat16 or
  // c10::Half), times the score scale.
  template <typename q_t>
  void set_query(int64_t r, const q_t* src, float score_scale);

  // Gathers the tile of `width` tokens at `slots` (see kv_tile.h).
  template <typename kv_t>
  void load(const kv_t* k_head, int64_t k_slot_stride, const kv_t* v_head,
            int64_t v_slot_stride, const int64_t* slots, int64_t width) {
    width_ = width;
    gather_kv_tile(k_head, k_slot_stride, v_head, v_slot_stride, slots, width, head_dim_,
                   kt_.data(), kt_stride_, v_.data(), stage_.data());
  }

  void scores(float* scores) const;
  void accumulate(const float* probs, float* acc) const;

 private:
  int64_t rows_ = 0, head_dim_ = 0, max_width_ = 0, kt_stride_ = 0, width_ = 0;
  Buffer<float> q_, kt_, v_, stage_;
};

class Bf16TileProducts {
 public:
  static constexpr bool kScaledQueries = false;

  // True where brgemm has its bf16 kernel (AMX) and head_dim is even.
  static bool available(int64_t head_dim);

  void reset(int64_t rows, int64_t head_dim, int64_t max_width);
  void release();  // hands back the thread's AMX state

  // Query row r as it is: the caller scales the scores.
  void set_query(int64_t r, const c10::BFloat16* src, float /*score_scale*/) {
    std::copy(src, src + head_dim_, q_.data() + r * head_dim_);
  }

  void load(const c10::BFloat16* k_head, int64_t k_slot_stride, const c10::BFloat16* v_head,
            int64_t v_slot_stride, const int64_t* slots, int64_t width) {
    width_ = width;
    gather_kv_tile_vnni(k_head, k_slot_stride, v_head, v_slot_stride, slots, width, head_dim_,
                        zeros_.data(), kt_.data(), max_width_, v_.data());
  }

  void scores(float* scores) const;
  // Rounds probs to bf16 first.
  void accumulate(const float* probs, float* acc);

 private:
  int64_t rows_ = 0, head_dim_ = 0, max_width_ = 0, width_ = 0;
  Buffer<c10::BFloat16> q_, kt_, v_, probs_, zeros_;
};

}  // namespace verify_ops::cpu
