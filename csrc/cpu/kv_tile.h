// Gathers one tile of KV tokens of one KV head from the token pool, once for
// all query rows of the head, into the layouts brgemm takes: fp32 (bf16 /
// fp16 / fp8 converted once per tile), or bf16 kept as it is for a bf16
// brgemm (tile_products.h says which).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace verify_ops::cpu {

// Tokens per gather step; a tile's width is a multiple of it. Each step
// prefetches the rows of the next step's tokens: scattered slots defeat the
// hardware prefetcher, and one step ahead keeps enough rows in flight.
constexpr int64_t kGatherTokens = 16;

// Common arguments. k_head / v_head: the pool at this KV head (slot s's row
// starts at s * slot_stride). slots[t], t < width + kGatherTokens: the pool
// slot of the tile's token t (the last kGatherTokens: the tokens after the
// tile, only prefetched), or -1 for a token the tile must not read (before
// the window, past the drafts): its K column and V row are zero. width: a
// multiple of kGatherTokens.

// fp32 tile: kt [head_dim, width] with row stride kt_stride (K transposed:
// the B operand of Q.K^T) and v [width, head_dim]. stage: scratch of
// kGatherTokens * head_dim floats. kv_t: float, c10::BFloat16, c10::Half,
// c10::Float8_e4m3fn or c10::Float8_e5m2.
template <typename kv_t>
void gather_kv_tile(const kv_t* k_head, int64_t k_slot_stride, const kv_t* v_head,
                    int64_t v_slot_stride, const int64_t* slots, int64_t width,
                    int64_t head_dim, float* kt, int64_t kt_stride, float* v,
                    float* stage);

// bf16 tile in the VNNI layouts of a bf16 brgemm, pairs along the reduction
// dimension adjacent: kt [head_dim / 2, width, 2] with a stride of
// kt_stride pairs between its rows (K transposed) and v [width / 2, head_dim,
// 2]. head_dim even; zeros: head_dim zeros, the row of a token the tile does
// not read.
void gather_kv_tile_vnni(const c10::BFloat16* k_head, int64_t k_slot_stride,
                         const c10::BFloat16* v_head, int64_t v_slot_stride,
                         const int64_t* slots, int64_t width, int64_t head_dim,
                         const c10::BFloat16* zeros, c10::BFloat16* kt, int64_t kt_stride,
                         c10::BFloat16* v);

}  // namespace verify_ops::cpu
