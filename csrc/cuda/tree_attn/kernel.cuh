// Split-KV tree-attention kernel on tensor cores: warpgroup MMA (wgmma) on
// sm_90a for 64-row warpgroups, mma.sync m16n8k16 elsewhere.
//
// One CTA owns (request b, KV head h, a tile of up to 64 or 128 of the D*group
// query rows that share h, one split of the KV sequence). Each KV token of the
// split is read once into shared memory and used for all rows of the tile; KV tokens
// are prefix tokens 0..L-1 then draft tokens L..L+D-1, each at the slot
// req_to_token[req_pool_indices[b], pos]. Draft tokens are masked per row by
// tree_mask. Splits write partials (outputs in T, LSEs in fp32) that a merge
// kernel combines, or, a few splits to a cluster, merge in distributed shared
// memory (merge_splits_in_cluster).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/cta_stamps.cuh"
#include "cuda/ptx/cluster.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/wgmma.cuh"
#include "cuda/tree_attn/params.h"

namespace verify_ops {

template <int HEAD_DIM, int KEY_SPLIT = 1, int WARPS = 4>
struct TileConfig {
  // Four warps cover up to 64 query rows. Eight (two warpgroups, 128 rows) read
  // each KV tile once for twice the rows, which halves the L2-to-SM traffic
  // of many-row cases, and their MMAs overlap their softmax (see the kernel).
  // Twelve are those eight plus a producer warpgroup that does all copies
  // (sm_90a), handing stages over through mbarriers.
  static constexpr int kWarps = WARPS;
  static_assert(WARPS == 4 || ((WARPS == 8 || WARPS == 12) && KEY_SPLIT == 1), "bad WARPS");
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kProducerWarps = WARPS == 12 ? 4 : 0;
  static constexpr int kConsumerThreads = (kWarps - kProducerWarps) * 32;
  // Threads that issue the K/V copies: the producer, else all.
  static constexpr int kLoadThreads = kProducerWarps > 0 ? kProducerWarps * 32 : kThreads;
  // Registers of each role (setmaxnreg). Consumers draw theirs from what the
  // producer releases, within the CTA's launch allocation (168 per thread at
  // 384 threads): a request past it blocks forever. At head_dim 128 a
  // producer of 24 spilled its row offsets every tile (slower than eight warps
  // in the graph); at 64 the consumers' 240 measured 1-3 % faster than 232.
  static constexpr int kProducerRegisters = HEAD_DIM == 64 ? 24 : 40;
  static constexpr int kConsumerRegisters = HEAD_DIM == 64 ? 240 : 232;
  static_assert(kProducerWarps == 0 ||
                    kProducerRegisters * kLoadThreads + kConsumerRegisters * kConsumerThreads <=
                        65536 / kThreads / 8 * 8 * kThreads,
                "setmaxnreg asks for more registers than the CTA holds");
  // With few query rows per KV head, warps that would hold only padding rows
  // take a share of each KV tile instead: KEY_SPLIT warps cover one 16-row
  // group, each over kBlockN / KEY_SPLIT keys, and combine at the end.
  static constexpr int kRowWarps = (kWarps - kProducerWarps) / KEY_SPLIT;
  static constexpr int kBlockM = kRowWarps * 16;  // query rows per CTA
  static constexpr int kBlockN = HEAD_DIM <= 128 ? 64 : 32;  // KV tokens per tile
  static constexpr int kKeysPerWarp = kBlockN / KEY_SPLIT;
  static_assert(kWarps % KEY_SPLIT == 0 && kKeysPerWarp % 16 == 0, "bad KEY_SPLIT");
  // Two four-warp CTAs share an SM; an eight-warp CTA has it alone and keeps
  // as many KV bytes in flight through more stages.
  static constexpr int kCtasPerSm = WARPS == 4 ? 2 : 1;
  // One warpgroup MMA covers 64 rows of a CTA whose warps do not split keys.
  static constexpr bool kWarpgroupMma = KEY_SPLIT == 1;
  // At head_dim 256 the wgmma kernels (one CTA per SM, Q in shared memory)
  // keep three 32-token tiles in flight with one warpgroup, two with two or
  // with a producer (see kPrefetch); the key-split mma.sync kernels have two
  // stages, so that two CTAs share an SM.
  static constexpr int kStages =
      HEAD_DIM <= 128 ? (WARPS == 4 ? 3 : 6) : (kWarpgroupMma ? 4 : 2);
  static constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row
  static constexpr int kRowsPerPass = kLoadThreads / kChunks;
  static constexpr int kLoadRows = kBlockN / kRowsPerPass;  // rows per thread
  // The 16-dim steps of Q K^T whose Q fragments stay in registers for the
  // whole loop: all of them up to head_dim 128; at 256, half in the wgmma
  // kernels without a producer (all 64 registers of them do not fit beside 128
  // of O: ptxas spills in the loop), none elsewhere. A wgmma that reads Q from
  // shared memory reads three times the bytes per score at 32 keys a tile
  // (graph_tests' wgmma_sass_check guards the registers: ptxas once reused
  // them, v6).
  static constexpr int kQRegisterSteps =
      HEAD_DIM <= 128 ? HEAD_DIM / 16 : (kWarpgroupMma && kProducerWarps == 0 ? 8 : 0);
  static constexpr bool kQAllInRegisters = kQRegisterSteps == HEAD_DIM / 16;
  static constexpr int kTileElems = kBlockN * HEAD_DIM;
  // Q held in registers is staged through the last stage (its K and V tiles
  // are adjacent) where it fits, which the pipeline fills only after Q has
  // been read: two four-warp CTAs then fit an SM. Otherwise Q has its own region.
  static constexpr bool kQInLastStage = kQAllInRegisters && kBlockM <= 2 * kBlockN;
  static constexpr int kQSmemElems = kQInLastStage ? 0 : kBlockM * HEAD_DIM;
  // Slot indices run kStages tiles ahead of the KV they address, through a
  // ring of 2 * kStages tiles of 8-byte entries (int32 slots are zero-extended).
  static constexpr int kSlotRingTiles = 2 * kStages;
  static constexpr int kKVBytes = 2 * kStages * kTileElems * 2;
  // wgmma's swizzle atoms need 1024-byte alignment: the kernel rounds its
  // base up (the declared alignment of dynamic shared memory is 128).
  static constexpr int kSmemAlign = kWarpgroupMma ? 1024 : 128;
  // The producer's "stage full" and the consumers' "stage empty" mbarriers.
  static constexpr int kBarrierBytes = kProducerWarps > 0 ? 2 * kStages * 8 : 0;
  static constexpr int kSmemBytes = (kSmemAlign - 128) + kQSmemElems * 2 + kKVBytes +
                                    kSlotRingTiles * kBlockN * 8 + kBarrierBytes;
  // Key-split warps hand their softmax state (O, max, sum per lane) to the
  // first warp of their row group through the K/V stages once the loop is done.
  static constexpr int kStateFloats = HEAD_DIM / 8 * 4 + 4;
  static_assert((KEY_SPLIT - 1) * kRowWarps * 32 * kStateFloats * 4 <= kKVBytes,
                "key-split exchange must fit in the K/V stages");
  // The cluster merge leaves the CTA's rows (in T) and their LSEs there too.
  static_assert(kBlockM * HEAD_DIM * 2 + kBlockM * 4 <= kKVBytes,
                "the cluster merge's rows must fit in the K/V stages");
};

__host__ __device__ inline int64_t ceil_div64(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// ceil(a / b) for a >= 0 and b > 0, in 32 bits where both fit: a 64-bit
// division is a call of ~70 instructions on the kernels' critical path.
__device__ inline int64_t ceil_div_nonnegative(int64_t a, int64_t b) {
  if (a <= INT32_MAX && b <= INT32_MAX)
    return (static_cast<uint32_t>(a) + static_cast<uint32_t>(b) - 1) / static_cast<uint32_t>(b);
  return ceil_div64(a, b);
}

// How request b's KV sequence of `total` tokens is cut into splits. Both
// kernels compute this from seq_lens on the device, so the grid stays fixed.
struct SplitPlan {
  int64_t chunk;  // tokens per split, a multiple of the tile size
  int active;     // splits that hold tokens; the rest of the grid exits
};

__device__ inline SplitPlan plan_splits(int64_t total, int num_splits,
                                        int min_tokens, int granularity) {
  int64_t chunk = ceil_div_nonnegative(total, num_splits);
  chunk = ceil_div64(chunk, granularity) * granularity;
  if (chunk < min_tokens) chunk = min_tokens;
  SplitPlan plan;
  plan.chunk = chunk;
  plan.active = static_cast<int>(ceil_div_nonnegative(total, chunk));
  return plan;
}

// The row tile and the split of CTA x of a grid row: the splits of a row
// tile are adjacent where they form a cluster, else the row tiles of a split.
// (X is the caller's integer type, which sets the division's code.)
template <bool CLUSTER_MERGE, typename X>
__device__ inline int m_tile_of(const TreeAttnParams& p, X x) {
  return static_cast<int>(CLUSTER_MERGE ? x / p.num_splits : x % p.num_m_tiles);
}
template <bool CLUSTER_MERGE, typename X>
__device__ inline int split_of(const TreeAttnParams& p, X x) {
  return static_cast<int>(CLUSTER_MERGE ? x % p.num_splits : x / p.num_m_tiles);
}

__device__ inline int64_t load_index(const void* p, bool is_int64, int64_t off) {
  return is_int64 ? __ldg(static_cast<const long long*>(p) + off)
                  : static_cast<int64_t>(__ldg(static_cast<const int*>(p) + off));
}

template <typename T>
struct Vec2;
template <>
struct Vec2<__nv_bfloat16> {
  using type = __nv_bfloat162;
  __device__ static __nv_bfloat16 one(float a) { return __float2bfloat16_rn(a); }
  __device__ static type pack(float a, float b) {
    return __floats2bfloat162_rn(a, b);
  }
  __device__ static float2 unpack(type v) { return __bfloat1622float2(v); }
};
template <>
struct Vec2<__half> {
  using type = __half2;
  __device__ static __half one(float a) { return __float2half_rn(a); }
  __device__ static type pack(float a, float b) { return __floats2half2_rn(a, b); }
  __device__ static float2 unpack(type v) { return __half22float2(v); }
};

template <typename T>
__device__ inline uint32_t pack_pair(float a, float b) {
  typename Vec2<T>::type v = Vec2<T>::pack(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Four consecutive elements of T, loaded as 8 raw bytes (8-byte aligned).
// The merges convert them only where they use them, so that a loop of loads
// issues every load before any conversion waits for one.
template <typename T>
__device__ inline uint2 load_four(const T* src) {
  return *reinterpret_cast<const uint2*>(src);
}
template <typename T>
__device__ inline float4 four_as_floats(uint2 raw) {
  const float2 low = Vec2<T>::unpack(*reinterpret_cast<const typename Vec2<T>::type*>(&raw.x));
  const float2 high = Vec2<T>::unpack(*reinterpret_cast<const typename Vec2<T>::type*>(&raw.y));
  return make_float4(low.x, low.y, high.x, high.y);
}

__device__ inline void add_scaled(float4& acc, float w, const float4& v) {
  acc.x += w * v.x;
  acc.y += w * v.y;
  acc.z += w * v.z;
  acc.w += w * v.w;
}

template <typename T>
__device__ inline void mma_16816(float (&c)[4], const uint32_t (&a)[4],
                                 uint32_t b0, uint32_t b1);

template <>
__device__ inline void mma_16816<__nv_bfloat16>(float (&c)[4],
                                                const uint32_t (&a)[4],
                                                uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ inline void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4],
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile(
      "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(addr));
}

// 16-byte async copy; src_bytes == 0 fills the destination with zeros.
__device__ inline void cp_async_16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
               "l"(src), "r"(src_bytes));
}
__device__ inline void cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst),
               "l"(src), "r"(src_bytes));
}
__device__ inline void cp_async_8(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst),
               "l"(src), "r"(src_bytes));
}
// Special registers read afresh (asm volatile), so that the compiler does
// not keep an earlier read live across the main loop instead.
__device__ inline uint32_t special_register_ctaid_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(r));
  return r;
}
__device__ inline uint32_t special_register_ctaid_y() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(r));
  return r;
}
__device__ inline uint32_t special_register_tid_x() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(r));
  return r;
}
// Stores by shared-memory address: the kernels keep 32-bit shared
// addresses live, not 64-bit generic pointers.
__device__ inline void store_shared(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ inline void store_shared(uint32_t addr, float v) {
  asm volatile("st.shared.f32 [%0], %1;" ::"r"(addr), "f"(v) : "memory");
}
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][HEAD_DIM]
// tile. XOR-swizzling the chunk by row % 8 keeps ldmatrix conflict-free.
template <int HEAD_DIM>
__device__ inline uint32_t swizzled_rows(int row, int chunk) {
  return static_cast<uint32_t>(row * HEAD_DIM * 2 + ((chunk ^ (row & 7)) << 4));
}

// A read-only byte load that ptxas may not hoist out of its branch: the
// masked pass would otherwise run, loads and all, on every tile.
__device__ inline unsigned char load_mask_byte(const unsigned char* addr) {
  unsigned short v;
  asm volatile("ld.global.nc.u8 %0, [%1];" : "=h"(v) : "l"(addr));
  return static_cast<unsigned char>(v);
}

// 2^x in one MUFU op; exp2f adds a denormal-range fixup around it, and
// softmax weights below 2^-126 of the row maximum are zero either way.
__device__ inline float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Programmatic dependent launch (sm_90+): each kernel of the op may start
// while the kernel before it in the stream drains (a merge behind its
// attention grid, the next layer's attention behind this layer's merge), and
// waits here, before it touches global memory, until that grid is done.
__device__ inline void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ inline void wait_for_primary_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// The splits of one (request, KV head, row tile), as one cluster
// (CLUSTER_MERGE), merge here instead of through global partials and a
// merge kernel. Each CTA leaves its normalized rows (in T, as the partials
// would hold them) and their LSEs in its own K/V stages; after a cluster
// barrier, CTA `split` reduces its share of the tile's rows, reading every
// active split's through distributed shared memory, and writes them to out.
// The second barrier keeps each CTA's shared memory until the others have
// read it. Called by the threads that hold rows, whole warps: `thread` is
// warp * 32 + lane among them, 32 per 16 rows of the tile that exist; the
// splits past `active` have exited.
constexpr int kMaxClusterSplits = 8;  // the portable cluster size
constexpr int kClusterMergeBarrier = 6;  // a named barrier id the kernel leaves free

template <typename T, int HEAD_DIM, int BLOCK_M, int D_TILES>
__device__ __forceinline__ void merge_splits_in_cluster(
    const TreeAttnParams& p, const float (&o)[D_TILES][4], const float (&row_max)[2],
    const float (&row_sum)[2], uint32_t exchange_smem, int active, int split, int b,
    int kv_head, int row0, int thread) {
  constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row
  const int rows_here = min(BLOCK_M, p.rows_per_kv_head - row0);
  const uint32_t lse_smem = exchange_smem + BLOCK_M * HEAD_DIM * 2;
  const int g = thread % 32 / 4, t4 = thread % 4;
  const int threads = (rows_here + 15) / 16 * 32;
  named_barrier_sync<kClusterMergeBarrier>(threads);  // every warp has left the K/V stages
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = thread / 32 * 16 + g + 8 * h;
    const float sum = quad_sum(row_sum[h]);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;  // a row that sees no key: zeros
    if (row < rows_here) {
      if (t4 == 0)
        store_shared(lse_smem + row * 4, sum > 0.f ? row_max[h] + log2f(sum) : -INFINITY);
      // Swizzled 16-byte chunks: a warp's 32 stores hit 32 banks.
#pragma unroll
      for (int j = 0; j < D_TILES; ++j)
        store_shared(exchange_smem + swizzled_rows<HEAD_DIM>(row, j) + t4 * 4,
                     pack_pair<T>(o[j][2 * h] * inv, o[j][2 * h + 1] * inv));
    }
  }
  cluster_barrier();

  const int rows_per_split = (rows_here + active - 1) / active;
  const int first_row = split * rows_per_split;
  const int units = max(0, min(rows_here - first_row, rows_per_split)) * kChunks;
  for (int u = thread; u < units; u += threads) {
    const int row = first_row + u / kChunks, chunk = u % kChunks;
    const uint32_t lse_at = lse_smem + row * 4;
    const uint32_t rows_at = exchange_smem + swizzled_rows<HEAD_DIM>(row, chunk);
    float lse[kMaxClusterSplits];
    uint4 part[kMaxClusterSplits];
    // Every load issues before any is used: one round trip for all splits.
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      const bool in = s < active;
      lse[s] = in ? load_cluster_f32(cluster_address(lse_at, s)) : -INFINITY;
      part[s] = in ? load_cluster_16(cluster_address(rows_at, s)) : make_uint4(0, 0, 0, 0);
    }
    float max_lse = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) max_lse = fmaxf(max_lse, lse[s]);
    float4 low = make_float4(0.f, 0.f, 0.f, 0.f), high = low;
    float total_weight = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      // Splits where the row sees no key, and all of them: weight 0.
      const float w = max_lse == -INFINITY ? 0.f : fast_exp2(lse[s] - max_lse);
      total_weight += w;
      add_scaled(low, w, four_as_floats<T>(make_uint2(part[s].x, part[s].y)));
      add_scaled(high, w, four_as_floats<T>(make_uint2(part[s].z, part[s].w)));
    }
    const float inv = total_weight > 0.f ? 1.f / total_weight : 0.f;
    uint32_t draft, head_in_group;
    p.group_div.divmod(row0 + row, draft, head_in_group);
    const int64_t token = static_cast<int64_t>(b) * p.num_drafts + draft;
    const int head = kv_head * p.group + static_cast<int>(head_in_group);
    T* dst = static_cast<T*>(p.out) + token * p.out_stride_token + head * p.out_stride_head +
             chunk * 8;
    *reinterpret_cast<uint4*>(dst) =
        make_uint4(pack_pair<T>(low.x * inv, low.y * inv), pack_pair<T>(low.z * inv, low.w * inv),
                   pack_pair<T>(high.x * inv, high.y * inv),
                   pack_pair<T>(high.z * inv, high.w * inv));
  }
  cluster_barrier();
}

template <typename T, int HEAD_DIM, int KEY_SPLIT, int WARPS, bool CLUSTER_MERGE>
__global__ void __launch_bounds__(TileConfig<HEAD_DIM, KEY_SPLIT, WARPS>::kThreads,
                                  TileConfig<HEAD_DIM, KEY_SPLIT, WARPS>::kCtasPerSm)
    tree_attn_kernel(const TreeAttnParams p) {
  using Cfg = TileConfig<HEAD_DIM, KEY_SPLIT, WARPS>;
  constexpr int kBlockN = Cfg::kBlockN;
  constexpr int kKSteps = HEAD_DIM / 16;
  constexpr int kNTiles = Cfg::kKeysPerWarp / 8;  // score tiles of 8 keys, per warp
  constexpr int kDTiles = HEAD_DIM / 8;           // output tiles of 8 dims
  // The warpgroup MMA needs all four warps, padding rows or not.
  constexpr bool kWgmma = VERIFY_OPS_HAS_WGMMA && Cfg::kWarpgroupMma;
  extern __shared__ __align__(128) unsigned char smem[];
  // Wait, then let the merge kernel's CTAs queue behind this grid: once they
  // launch, the op's inputs are final, so they may read seq_lens early.
  VERIFY_OPS_STAMP(kStampEntry);
  wait_for_primary_grid();
  VERIFY_OPS_STAMP(kStampWaited);
  allow_dependent_launch();

  const int m_tile = m_tile_of<CLUSTER_MERGE>(p, blockIdx.x);
  const int split = split_of<CLUSTER_MERGE>(p, blockIdx.x);
  const int b = blockIdx.y / p.num_kv_heads;
  const int kv_head = blockIdx.y % p.num_kv_heads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row_warp = warp % Cfg::kRowWarps;  // which 16 query rows
  const int key_group = warp / Cfg::kRowWarps;  // which keys of each tile
  const int key0 = key_group * Cfg::kKeysPerWarp;

  const uint32_t smem_unaligned = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t smem_base =
      Cfg::kSmemAlign == 128 ? smem_unaligned
                             : (smem_unaligned + Cfg::kSmemAlign - 1) & ~(Cfg::kSmemAlign - 1u);
  unsigned char* const smem_aligned = smem + (smem_base - smem_unaligned);
  // Stage s holds K tile then V tile: the last stage is one span for Q.
  constexpr uint32_t kTileBytes = Cfg::kTileElems * 2;
  const uint32_t kv_smem = smem_base + Cfg::kQSmemElems * 2;
  auto k_stage_of = [&](int stage) { return kv_smem + stage * 2 * kTileBytes; };
  auto v_stage_of = [&](int stage) { return k_stage_of(stage) + kTileBytes; };
  const uint32_t q_smem = Cfg::kQInLastStage ? k_stage_of(Cfg::kStages - 1) : smem_base;

  const int row0 = m_tile * Cfg::kBlockM;  // first query row of this tile
  // Byte offset of a 16-byte chunk in a K/V tile: wgmma's slabs, or whole
  // rows, which take the mma.sync kernels fewer registers. Q is in slabs where
  // wgmma reads it from shared memory, else in whole rows for ldmatrix.
  auto tile_offset = [](int row, int chunk) {
    if constexpr (Cfg::kWarpgroupMma) return swizzled_slabs<kBlockN>(row, chunk);
    else return swizzled_rows<HEAD_DIM>(row, chunk);
  };
  auto q_offset = [](int row, int chunk) {
    if constexpr (Cfg::kWarpgroupMma && !Cfg::kQAllInRegisters)
      return swizzled_slabs<Cfg::kBlockM>(row, chunk);
    else return swizzled_rows<HEAD_DIM>(row, chunk);
  };
  // The index loads issue first, both before either is used: the slot
  // indices wait on them, and Q's copies, which need neither, issue during
  // their latency (in the other order the Q loop delayed them, NOTES v14.5).
  const int64_t prefix = load_index(p.seq_lens, p.lens_is_int64, b * p.lens_stride);
  const int64_t req_row = load_index(p.req_pool_indices, p.rpi_is_int64, b * p.rpi_stride);
  // Q tile: row r is draft r / group of query head kv_head * group + r % group.
  // With a producer warpgroup the consumers copy it, and the producer goes
  // straight on to the slot indices.
  constexpr int kQThreads = Cfg::kProducerWarps > 0 ? Cfg::kConsumerThreads : Cfg::kThreads;
  const T* q_tile = static_cast<const T*>(p.q) +
                    static_cast<int64_t>(b) * p.num_drafts * p.q_stride_token +
                    static_cast<int64_t>(kv_head) * p.group * p.q_stride_head;
  if (tid < kQThreads) {
    for (int i = tid; i < Cfg::kBlockM * Cfg::kChunks; i += kQThreads) {
      const int r = i / Cfg::kChunks, c = i % Cfg::kChunks;
      const int row = row0 + r;
      const bool valid = row < p.rows_per_kv_head;
      uint32_t draft = 0, head_in_group = 0;
      if (valid) p.group_div.divmod(row, draft, head_in_group);
      const T* src = q_tile + draft * p.q_stride_token + head_in_group * p.q_stride_head + c * 8;
      cp_async_16(q_smem + q_offset(r, c), src, valid ? 16 : 0);
    }
  }
  const int64_t total = prefix + p.num_drafts;
  const SplitPlan plan =
      plan_splits(total, p.num_splits, p.split_min_tokens, kBlockN);
  if (split >= plan.active) {
    cp_async_commit();  // Q's copies land before the CTA's shared memory is freed
    cp_async_wait<0>();
    return;
  }
  const int64_t kv_begin = split * plan.chunk;
  const int64_t kv_end = min(total, kv_begin + plan.chunk);
  const T* k = static_cast<const T*>(p.k);
  const T* v = static_cast<const T*>(p.v);

  // Pipeline: KV tiles run kPrefetch tiles ahead of the one consumed. The
  // group committed at step t holds KV tile t + kPrefetch and the slots of tile
  // t + kPrefetch + kStages (the first group also Q), so slot indices are in
  // shared memory well before the KV copies that need them are issued. Two
  // warpgroups refill only the stage both left a step earlier: one warpgroup
  // may still run its P V on the stage the other has just finished. They
  // also compute the next tile's scores during this one's softmax
  // (kScoresAhead), except at head_dim 256 without a producer warpgroup
  // (see below), where that spills (NOTES, v7): the producer takes the
  // copies' registers. Other devices never launch the producer kernel.
  constexpr bool kWarpSpecialized = Cfg::kProducerWarps > 0;
  constexpr bool kTwoWarpgroups = kWgmma && Cfg::kRowWarps == 8;
  constexpr bool kScoresAhead = kTwoWarpgroups && (HEAD_DIM <= 128 || kWarpSpecialized);
  constexpr int kPrefetch = kTwoWarpgroups ? Cfg::kStages - 2 : Cfg::kStages - 1;
  static_assert(!kWarpSpecialized || !VERIFY_OPS_HAS_WGMMA || kScoresAhead,
                "the producer feeds the scores-ahead loop only");
  // Slot entries are 8 bytes; the kernel reads the low 32 bits of each (int32
  // slots land there, and the host checks that the pool has < 2^32 slots).
  const uint32_t* slot_ring =
      reinterpret_cast<const uint32_t*>(smem_aligned + Cfg::kQSmemElems * 2 + Cfg::kKVBytes);
  const uint32_t slot_ring_smem = kv_smem + Cfg::kKVBytes;
  const int r2t_bytes = p.r2t_is_int64 ? 8 : 4;
  // Loading thread load_tid < kBlockN loads position kv_begin + tile * kBlockN
  // + load_tid; with a producer warpgroup only its threads load.
  const bool loads = !kWarpSpecialized || tid >= Cfg::kConsumerThreads;
  const int load_tid = kWarpSpecialized ? (loads ? tid - Cfg::kConsumerThreads : 0) : tid;
  const char* r2t_row = static_cast<const char*>(p.req_to_token) +
                        req_row * p.r2t_stride_row * r2t_bytes;
  const char* my_slots = r2t_row + (kv_begin + load_tid) * p.r2t_stride_pos * r2t_bytes;
  const int64_t slots_per_tile_bytes = kBlockN * p.r2t_stride_pos * r2t_bytes;
  // The loop works in token offsets within the split, which fit 32 bits: it
  // then keeps no 64-bit positions live and compares in one instruction.
  // split_prefix, the first draft's offset, lies in [1 - D, split_tokens].
  const int split_tokens = static_cast<int>(kv_end - kv_begin);
  const int split_prefix =
      static_cast<int>(min(prefix - kv_begin, static_cast<int64_t>(split_tokens)));
  const int num_tiles = (split_tokens + kBlockN - 1) / kBlockN;
  auto load_slots = [&](int tile) {
    if (loads && load_tid < kBlockN) {
      const int offset = tile * kBlockN + load_tid;  // from kv_begin
      const bool valid = offset < split_tokens;
      const int entry = (tile % Cfg::kSlotRingTiles) * kBlockN + load_tid;
      const char* src = valid ? my_slots + tile * slots_per_tile_bytes : r2t_row;
      const int bytes = valid ? r2t_bytes : 0;
      if (p.r2t_is_int64)
        cp_async_8(slot_ring_smem + entry * 8, src, bytes);
      else
        cp_async_4(slot_ring_smem + entry * 8, src, bytes);
    }
  };
  // Each thread copies chunk `load_chunk` of rows load_row0 + j * kRowsPerPass.
  const int load_chunk = load_tid % Cfg::kChunks;
  const int load_row0 = load_tid / Cfg::kChunks;
  const char* k_head =
      reinterpret_cast<const char*>(k + kv_head * p.k_stride_head + load_chunk * 8);
  const char* v_head =
      reinterpret_cast<const char*>(v + kv_head * p.v_stride_head + load_chunk * 8);
  auto issue_tile = [&](int tile) {
    const int stage = tile % Cfg::kStages;
    const uint32_t* ring = slot_ring + 2 * (tile % Cfg::kSlotRingTiles) * kBlockN;
    const int rows_left = split_tokens - tile * kBlockN;
    // A producer thread's rows lie a multiple of 8 apart at head_dim 64 and
    // 128, so they share their swizzle and one offset serves them all: offsets
    // computed row by row spilled the head_dim-64 producer's 24 registers (v29).
    constexpr bool kOneOffset = kWarpSpecialized && Cfg::kRowsPerPass % 8 == 0;
    const uint32_t first_off = tile_offset(load_row0, load_chunk);
#pragma unroll
    for (int j = 0; j < Cfg::kLoadRows; ++j) {
      const int r = load_row0 + j * Cfg::kRowsPerPass;
      const bool valid = r < rows_left;
      const uint32_t slot = valid ? ring[2 * r] : 0;
      const uint32_t off = kOneOffset ? first_off + tile_offset(j * Cfg::kRowsPerPass, 0)
                                      : tile_offset(r, load_chunk);
      // One wide multiply-add each: 32-bit slot times 32-bit bytes, 64-bit sum.
      cp_async_16(k_stage_of(stage) + off, k_head + static_cast<uint64_t>(slot) * p.k_slot_bytes,
                  valid ? 16 : 0);
      cp_async_16(v_stage_of(stage) + off, v_head + static_cast<uint64_t>(slot) * p.v_slot_bytes,
                  valid ? 16 : 0);
    }
  };

  // Stage s is full once its K/V tile has landed (the producer's threads
  // arrive), empty once both warpgroups' P V on it are done (each consumer
  // warp arrives).
  const uint32_t barriers = slot_ring_smem + Cfg::kSlotRingTiles * kBlockN * 8;
  auto full_barrier = [&](int tile) { return barriers + (tile % Cfg::kStages) * 8; };
  auto empty_barrier = [&](int tile) {
    return barriers + (Cfg::kStages + tile % Cfg::kStages) * 8;
  };
  // Slot indices reach shared memory this many tiles before the KV copies
  // that read them (one ring of kSlotRingTiles holds them).
  constexpr int kSlotLead = kPrefetch + Cfg::kStages;
  static_assert(kSlotLead < Cfg::kSlotRingTiles, "the slot ring is too short");
  // Q held in registers was staged in the last stage: the consumers arrive
  // here once they have read it, and the producer waits before it refills
  // that stage (or at its end, so that the barrier completes).
  constexpr bool kQStageHandover = kWarpSpecialized && Cfg::kQInLastStage;
  // Named barrier ids (0 is __syncthreads): the producer's threads before
  // each tile's copies (1), the Q stage's hand-over (2), per consumer
  // warpgroup g its turn (3 + g, kPingPong, below), the consumers once Q
  // has landed (5), and the cluster merge's row holders (6).
  constexpr int kProducerBarrier = 1;
  constexpr int kQReadBarrier = 2;
  constexpr int kTurnBarrier = 3;
  constexpr int kQLandedBarrier = 5;
  if constexpr (kWarpSpecialized) {
    if (tid < Cfg::kStages) {
      mbarrier_init(full_barrier(tid), Cfg::kLoadThreads);
      mbarrier_init(empty_barrier(tid), Cfg::kConsumerThreads / 32);
    }
  }

  // Prologue: Q and the first kSlotLead slot tiles, then kPrefetch KV tiles
  // unless a producer loads them. The producer commits one group per slot
  // tile, so that its wait for tile t's slots (below) waits for those alone,
  // not for the prologue's last; the consumers wait for Q themselves.
  if constexpr (kWarpSpecialized) {
    for (int t = 0; t < kSlotLead; ++t) {
      load_slots(t);
      cp_async_commit();
    }
    __syncthreads();  // the mbarriers are initialized
  } else {
    for (int t = 0; t < kSlotLead; ++t) load_slots(t);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
#pragma unroll
    for (int t = 0; t < kPrefetch; ++t) {
      if (t < num_tiles) issue_tile(t);
      cp_async_commit();
    }
  }

  if constexpr (kWarpSpecialized) {
    if (loads) {
      // The producer: tile t's copies go out once both warpgroups have left
      // the tile kStages before it in that stage, and each thread's arrival
      // on the stage's full barrier lands with its copies (no wait here, so
      // a tile is never held behind a later one). The slot ring is shared
      // among the producer's threads: each waits for the group that holds
      // tile t's slots (one group per slot tile, from the prologue on), then
      // they meet.
      shrink_registers<Cfg::kProducerRegisters>();
      for (int tile = 0; tile < num_tiles; ++tile) {
        if (tile >= Cfg::kStages)
          mbarrier_wait(empty_barrier(tile), (tile / Cfg::kStages - 1) & 1);
        if (kQStageHandover && tile == Cfg::kStages - 1)
          named_barrier_sync<kQReadBarrier, Cfg::kThreads>();
        cp_async_wait<kSlotLead - 1>();  // this tile's slots
        named_barrier_sync<kProducerBarrier, Cfg::kLoadThreads>();
        issue_tile(tile);
        cp_async_mbarrier_arrive(full_barrier(tile));
        load_slots(tile + kSlotLead);
        cp_async_commit();
      }
      cp_async_wait<0>();  // no copy outlives its thread
      if (kQStageHandover && num_tiles < Cfg::kStages)
        named_barrier_sync<kQReadBarrier, Cfg::kThreads>();
      return;
    }
    grow_registers<Cfg::kConsumerRegisters>();
  }

  // Per thread: rows g and g + 8 of its warp's 16 rows (g = lane / 4).
  const int g = lane / 4, t4 = lane % 4;
  int row_draft[2];
  bool row_valid[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = row0 + row_warp * 16 + g + 8 * h;
    row_valid[h] = row < p.rows_per_kv_head;
    row_draft[h] = row_valid[h] ? static_cast<int>(p.group_div.div(row)) : 0;
  }
  const bool warp_active = row0 + row_warp * 16 < p.rows_per_kv_head;
  const unsigned char* mask_base =
      reinterpret_cast<const unsigned char*>(p.tree_mask) + b * p.mask_stride_batch;

  float o[kDTiles][4];
#pragma unroll
  for (int i = 0; i < kDTiles; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.f, 0.f};

  uint32_t q_frag[Cfg::kQRegisterSteps > 0 ? Cfg::kQRegisterSteps : 1][4];
  auto q_frag_addr = [&](int ks) {
    return q_smem + q_offset(row_warp * 16 + (lane & 15), ks * 2 + (lane >> 4));
  };
  if constexpr (kWarpSpecialized) {
    cp_async_wait<0>();  // this thread's Q copies
    if constexpr (!Cfg::kQAllInRegisters) fence_shared_for_wgmma();  // wgmma reads Q there
    named_barrier_sync<kQLandedBarrier, Cfg::kConsumerThreads>();  // everyone's
  }
  if constexpr (Cfg::kQRegisterSteps > 0) {
#pragma unroll
    for (int ks = 0; ks < Cfg::kQRegisterSteps; ++ks) ldmatrix_x4(q_frag[ks], q_frag_addr(ks));
    // A loop step soon refills the stage that held Q.
    if constexpr (kQStageHandover)
      named_barrier_arrive<kQReadBarrier, Cfg::kThreads>();
    else if constexpr (Cfg::kQInLastStage)
      __syncthreads();
  }

  // One cp.async group: KV tile `tile + kPrefetch`, and slots further ahead.
  auto refill = [&](int tile) {
    if (tile + kPrefetch < num_tiles) issue_tile(tile + kPrefetch);
    load_slots(tile + kSlotLead);
    cp_async_commit();
  };

  // S = Q K^T of the tile in `stage` on the warpgroup's tensor cores: K-major
  // B, A from registers for the first kQRegisterSteps steps of 16 dims and
  // from shared memory past them, each step within a 128-byte swizzle row.
  // Issued and committed, not waited for.
  auto issue_qk = [&](float (&s)[kNTiles][4], int stage) {
    if constexpr (Cfg::kWarpgroupMma) {
      // Offsets within a tile are compile-time constants past its descriptor.
      const uint64_t k_tile_desc = sw128_descriptor(k_stage_of(stage));
      const uint64_t q_tile_desc = sw128_descriptor(q_smem + q_offset(warp / 4 * 64, 0));
      wgmma_fence();
      auto k_desc = [&](int ks) {
        return advance_descriptor(k_tile_desc, tile_offset(0, 2 * ks));
      };
#pragma unroll
      for (int ks = 0; ks < Cfg::kQRegisterSteps; ++ks) {
        if constexpr (kBlockN == 64)
          wgmma_m64n64k16<T, false>(s, q_frag[ks], k_desc(ks), ks > 0);
        else
          wgmma_m64n32k16<T>(s, q_frag[ks], k_desc(ks), ks > 0);
      }
      if constexpr (!Cfg::kQAllInRegisters) {
#pragma unroll
        for (int ks = Cfg::kQRegisterSteps; ks < kKSteps; ++ks)
          wgmma_m64n32k16_ss<T>(s, advance_descriptor(q_tile_desc, q_offset(0, 2 * ks)),
                                k_desc(ks), ks > 0);
      }
      wgmma_commit();
    }
  };
  // O += P V of the tile in `stage`, P from registers as 16-bit pairs; issued
  // and committed, not waited for.
  using PFrag = uint32_t[kNTiles / 2][4];
  auto issue_pv = [&](int stage, const PFrag& p_frag) {
    if constexpr (Cfg::kWarpgroupMma) {
      const uint64_t v_tile_desc = sw128_descriptor(v_stage_of(stage));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kNTiles / 2; ++kk)
#pragma unroll
        for (int slab = 0; slab < HEAD_DIM / 64; ++slab)  // V is MN-major B
          wgmma_m64n64k16<T, true>(
              reinterpret_cast<float(&)[8][4]>(o[8 * slab]), p_frag[kk],
              advance_descriptor(v_tile_desc, tile_offset(kk * 16, 8 * slab)), true);
      wgmma_commit();
    }
  };

  // How the running max moved on a tile, and the factor O and the sum take.
  struct Fold {
    bool max_moved;
    float rescale[2];
  };
  auto rescale_o = [&](const Fold& fold) {
    if (!fold.max_moved) return;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int i = 0; i < kDTiles; ++i) {
        o[i][2 * h] *= fold.rescale[h];
        o[i][2 * h + 1] *= fold.rescale[h];
      }
  };
  // A tile's probabilities against each row's reference max `ref` (log2
  // units), as MMA A fragments (16-bit pairs), and this thread's share of each
  // row's sum of them. Two partial sums per row halve the chain of dependent adds.
  auto exponentiate = [&](const float (&s)[kNTiles][4], const float (&ref)[2], PFrag& p_frag,
                          float (&sum)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float part[2] = {0.f, 0.f};
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) {
        const float p0 = fast_exp2(s[n][2 * h] * p.scale_log2 - ref[h]);
        const float p1 = fast_exp2(s[n][2 * h + 1] * p.scale_log2 - ref[h]);
        part[0] += p0;
        part[1] += p1;
        p_frag[n / 2][2 * (n % 2) + h] = pack_pair<T>(p0, p1);
      }
      sum[h] = part[0] + part[1];
    }
  };
  // Masks a tile's raw scores, folds them (scaled) into the running max and
  // sum, and writes their probabilities to p_frag. Masking is a separate pass,
  // taken only by tiles that reach the drafts or the split's end, so the
  // common path stays free of branches. With wgmma, O must then be rescaled
  // (after a wait) if the reference max moved for a row of the warp. The
  // scale is positive (the host sees to it), so it applies to the tile max
  // and inside each exponent's FFMA, not as a multiply per score.
  auto fold_scores = [&](float (&s)[kNTiles][4], PFrag& p_frag, int tile) {
    const int tile_first = tile * kBlockN;
    const bool masked = tile_first + kBlockN > split_prefix || tile_first + kBlockN > split_tokens;
    if (masked) {
      // Tile-relative bounds: keys at or past keys_left do not exist, and key
      // draft_begin + j is draft j.
      const int keys_left = min(split_tokens - tile_first, kBlockN);
      const int draft_begin = min(split_prefix - tile_first, kBlockN);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const unsigned char* mask_row = mask_base + row_draft[h] * p.mask_stride_row;
        // Every mask byte is loaded before any is used (draft index clamped,
        // so always in bounds): one memory latency per row, not one per score.
        unsigned char draft_visible[kNTiles][2];
#pragma unroll
        for (int n = 0; n < kNTiles; ++n)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int draft =
                min(max(key0 + n * 8 + 2 * t4 + e - draft_begin, 0), p.num_drafts - 1);
            draft_visible[n][e] = load_mask_byte(mask_row + draft * p.mask_stride_col);
          }
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = key0 + n * 8 + 2 * t4 + e;
            const bool visible =
                key < keys_left && (key < draft_begin || (row_valid[h] && draft_visible[n][e]));
            if (!visible) s[n][2 * h + e] = -INFINITY;
          }
        }
      }
    }
    Fold fold;
    fold.max_moved = false;
    float sum[2];
    // The common tile: unmasked, past the split's first (which was unmasked
    // too, so every row's max is finite). Its exponentials go first, against
    // row_max; the tile max, two shuffles and a vote later, is needed only
    // where a probability may exceed 2^15 (fp16's range ends at 65504): a sum
    // of them above that bound sends the warp to the full path below.
    constexpr float kFastSumBound = 32768.f;
    if (!masked && tile > 0) {
      exponentiate(s, row_max, p_frag, sum);
      if (!__any_sync(0xffffffff, sum[0] > kFastSumBound || sum[1] > kFastSumBound)) {
        row_sum[0] += sum[0];
        row_sum[1] += sum[1];
        return fold;
      }
    }
    // Exponents are taken against row_max, which moves only when a row's
    // max passes it by more than kMaxGrowthLog2: P then stays below 2^8,
    // and O (which wgmma may still be writing) needs rescaling on few tiles.
    constexpr float kMaxGrowthLog2 = 8.f;
    float tile_max[2];
    bool row_moves[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float m = -INFINITY;
#pragma unroll
      for (int n = 0; n < kNTiles; ++n) m = fmaxf(m, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      tile_max[h] = quad_max(m) * p.scale_log2;
      row_moves[h] = tile_max[h] > row_max[h] + kMaxGrowthLog2;  // -inf + 8 is -inf
    }
    fold.max_moved = __any_sync(0xffffffff, row_moves[0] || row_moves[1]);
    if (fold.max_moved) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float new_max = fmaxf(row_max[h], tile_max[h]);
        // A row that has seen only -inf keeps max -inf, with O and sum at zero.
        fold.rescale[h] = new_max == -INFINITY ? 1.f : fast_exp2(row_max[h] - new_max);
        row_sum[h] *= fold.rescale[h];
        row_max[h] = new_max;
      }
      // Without wgmma no MMA writes O now: rescale it before the exponentials,
      // where fewer registers are live.
      if constexpr (!kWgmma) {
        rescale_o(fold);
        fold.max_moved = false;
      }
    }
    // Where row_max is still -inf so is every score: use 0 so exp2 stays finite.
    float ref[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) ref[h] = row_max[h] == -INFINITY ? 0.f : row_max[h];
    exponentiate(s, ref, p_frag, sum);
    row_sum[0] += sum[0];
    row_sum[1] += sum[1];
    return fold;
  };

  if constexpr (kScoresAhead) {
    // Step t: the scores of tile t + 1 and P V of tile t - 1 run on the tensor
    // cores while the warpgroup does tile t's softmax; then it waits for both,
    // rescales O where a reference max moved, and P V of tile t goes out.
    // Score and P registers alternate between even and odd tiles.
    // The last step also scores a tile past the end, from a stage no copy is
    // writing, and drops it: no branch between the MMAs.
    float s_even[kNTiles][4], s_odd[kNTiles][4];
    PFrag p_even, p_odd;
    // The two warpgroups take turns on the tensor cores (FA3's ping-pong): a
    // turn issues P V of tile t and the scores of tile t + 2, so that one
    // warpgroup's MMAs run while the other does its softmax. Warpgroup 0 goes
    // first; named barrier kTurnBarrier + g is warpgroup g's turn. Each
    // warpgroup drains its wgmmas before its P V (above), so without turns
    // both would leave the tensor cores idle at once: at head_dim 128 the
    // turns lost while the loop voted instead (NOTES v14.1) and win 1.05x
    // since (NOTES v14.7). At head_dim 256, where each warpgroup reads Q
    // from shared memory, they lost: 0.980x against v14.7, 1.026x without
    // them (NOTES v15).
    constexpr bool kPingPong = kWarpSpecialized && HEAD_DIM <= 128;
    const bool first_warpgroup = warp / 4 == 0;
    auto wait_turn = [&]() {
      if constexpr (kPingPong) {
        if (first_warpgroup) named_barrier_sync<kTurnBarrier, Cfg::kConsumerThreads>();
        else named_barrier_sync<kTurnBarrier + 1, Cfg::kConsumerThreads>();
      }
    };
    auto pass_turn = [&]() {
      if constexpr (kPingPong) {
        if (first_warpgroup) named_barrier_arrive<kTurnBarrier + 1, Cfg::kConsumerThreads>();
        else named_barrier_arrive<kTurnBarrier, Cfg::kConsumerThreads>();
      }
    };
    auto step = [&](int tile, float (&s_now)[kNTiles][4], float (&s_next)[kNTiles][4],
                    PFrag& p_now) {
      if constexpr (kWarpSpecialized) {
        if (tile + 1 < num_tiles)
          mbarrier_wait(full_barrier(tile + 1), (tile + 1) / Cfg::kStages & 1);
        fence_shared_for_wgmma();  // the producer's copies, for wgmma's reads
      } else {
        cp_async_wait<Cfg::kStages - 4>();  // tile + 1 has landed
        fence_shared_for_wgmma();
        __syncthreads();  // ... for every thread; both warpgroups left tile - 2
        refill(tile);     // into the stage of tile - 2
      }
      issue_qk(s_next, (tile + 1) % Cfg::kStages);
      if (tile > 0) pass_turn();
      const Fold fold = fold_scores(s_now, p_now, tile);
      // Then wait for the scores of tile + 1 and P V of tile - 1, so that a
      // warp whose rows moved their max can rescale O. A wgmma wait is a
      // warpgroup instruction: waiting only where a max moved needed a vote of
      // the warpgroup's warps, a barrier per step that cost 2-3 % at head_dim
      // 64 and as much as it saved at 128 (NOTES v14.6). ptxas serializes
      // every wgmma (C7514) where O is rescaled with any wgmma in flight. P is
      // pinned first, or ptxas hoists the wait above the exponentials.
      pin_registers(p_now);
      wgmma_wait<0>();
      pin_registers(o);
      pin_registers(s_next);
      if constexpr (kWarpSpecialized) {
        if (tile > 0) mbarrier_arrive_once_per_warp(empty_barrier(tile - 1));
      }
      rescale_o(fold);
      wait_turn();
      issue_pv(tile % Cfg::kStages, p_now);
    };
    if (num_tiles > 0) {
      if constexpr (kWarpSpecialized) {
        mbarrier_wait(full_barrier(0), 0);
        fence_shared_for_wgmma();
      } else {
        cp_async_wait<Cfg::kStages - 3>();  // tile 0
        fence_shared_for_wgmma();
        __syncthreads();
      }
      issue_qk(s_even, 0);
      wgmma_wait<0>();
      if (!first_warpgroup) pass_turn();
    }
    // No branch inside the pair: ptxas serializes wgmma (C7513) where register
    // copies at a join touch the P of a P V in flight.
    int tile = 0;
    for (; tile + 1 < num_tiles; tile += 2) {
      step(tile, s_even, s_odd, p_even);
      step(tile + 1, s_odd, s_even, p_odd);
    }
    if (tile < num_tiles) step(tile, s_even, s_odd, p_even);
    // Warpgroup 1's last turn waits for warpgroup 0's last one to end.
    if (num_tiles > 0 && first_warpgroup) pass_turn();
    wgmma_wait<0>();
    pin_registers(o);
  } else if constexpr (kWgmma) {
    // P V of the last tile is issued with this tile's scores.
    PFrag p_frag;
    for (int tile = 0; tile < num_tiles; ++tile) {
      cp_async_wait<kPrefetch - 1>();  // tile has landed
      fence_shared_for_wgmma();
      __syncthreads();
      float s[kNTiles][4];
      issue_qk(s, tile % Cfg::kStages);
      if (tile > 0) {
        issue_pv((tile - 1) % Cfg::kStages, p_frag);
        wgmma_wait<1>();  // S is done; the last tile's P V may still run
      } else {
        wgmma_wait<0>();
      }
      pin_registers(s);
      // P goes to registers of its own: the last tile's P V may still read p_frag.
      PFrag p_tile;
      const Fold fold = fold_scores(s, p_tile, tile);
      // The last tile's P V: O may be rescaled, a stage refilled (ptxas 13.0
      // leaves this wait after the softmax, which overlaps that P V).
      wgmma_wait<0>();
      pin_registers(o);
      refill(tile);  // into the stage of tile - 1, or tile - 2 with two warpgroups
      rescale_o(fold);
#pragma unroll
      for (int kk = 0; kk < kNTiles / 2; ++kk)
#pragma unroll
        for (int i = 0; i < 4; ++i) p_frag[kk][i] = p_tile[kk][i];
    }
    if (num_tiles > 0) {
      issue_pv((num_tiles - 1) % Cfg::kStages, p_frag);
      wgmma_wait<0>();
      pin_registers(o);
    }
  } else {
    for (int tile = 0; tile < num_tiles; ++tile) {
      const int stage = tile % Cfg::kStages;
      refill(tile);  // into the stage consumed last step
      cp_async_wait<Cfg::kStages - 1>();
      __syncthreads();
      if (warp_active) {
        const uint32_t k_stage = k_stage_of(stage);
        const uint32_t v_stage = v_stage_of(stage);
        float s[kNTiles][4];
#pragma unroll
        for (int n = 0; n < kNTiles; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
          uint32_t a_reg[4];
          if constexpr (Cfg::kQAllInRegisters) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a_reg[i] = q_frag[ks][i];
          } else {
            ldmatrix_x4(a_reg, q_frag_addr(ks));
          }
#pragma unroll
          for (int n2 = 0; n2 < kNTiles / 2; ++n2) {
            uint32_t kb[4];
            const int krow = key0 + n2 * 16 + (lane & 7) + ((lane >> 4) << 3);
            ldmatrix_x4(kb, k_stage + tile_offset(krow, ks * 2 + ((lane >> 3) & 1)));
            mma_16816<T>(s[2 * n2], a_reg, kb[0], kb[1]);
            mma_16816<T>(s[2 * n2 + 1], a_reg, kb[2], kb[3]);
          }
        }
        PFrag p_frag;
        fold_scores(s, p_frag, tile);
#pragma unroll
        for (int kk = 0; kk < kNTiles / 2; ++kk) {
          const int vrow = key0 + kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
          for (int d2 = 0; d2 < kDTiles / 2; ++d2) {
            uint32_t vb[4];
            ldmatrix_x4_trans(vb, v_stage + tile_offset(vrow, d2 * 2 + (lane >> 4)));
            mma_16816<T>(o[2 * d2], p_frag[kk], vb[0], vb[1]);
            mma_16816<T>(o[2 * d2 + 1], p_frag[kk], vb[2], vb[3]);
          }
        }
      }
      __syncthreads();  // the stage is refilled next iteration
    }
  }
  cp_async_wait<0>();
  VERIFY_OPS_STAMP(kStampLoopEnd);
  VERIFY_OPS_STAMP_SM_AND(kStampSmAndTiles, num_tiles);

  if constexpr (KEY_SPLIT > 1) {
    // Fold the other key groups' softmax state into key group 0, lane by lane
    // (same fragment layout), through the now idle K/V stages.
    __syncthreads();  // the last slot copies have landed; smem is free
    constexpr int kLaneFloats = Cfg::kStateFloats;
    float* exchange = reinterpret_cast<float*>(smem_aligned + Cfg::kQSmemElems * 2);
    auto state_of = [&](int group) {
      return exchange + ((group - 1) * Cfg::kRowWarps + row_warp) * 32 * kLaneFloats + lane;
    };
    if (key_group > 0 && warp_active) {
      float* mine = state_of(key_group);
#pragma unroll
      for (int i = 0; i < kDTiles; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mine[(i * 4 + j) * 32] = o[i][j];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mine[(kDTiles * 4 + h) * 32] = row_max[h];
        mine[(kDTiles * 4 + 2 + h) * 32] = row_sum[h];
      }
    }
    __syncthreads();
    if (key_group > 0) return;
    if (warp_active) {
#pragma unroll
      for (int group = 1; group < KEY_SPLIT; ++group) {
        const float* theirs = state_of(group);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float their_max = theirs[(kDTiles * 4 + h) * 32];
          const float both = fmaxf(row_max[h], their_max);
          const float ref = both == -INFINITY ? 0.f : both;
          const float mine_scale = fast_exp2(row_max[h] - ref);
          const float their_scale = fast_exp2(their_max - ref);
          row_max[h] = both;
          row_sum[h] = row_sum[h] * mine_scale +
                       theirs[(kDTiles * 4 + 2 + h) * 32] * their_scale;
#pragma unroll
          for (int i = 0; i < kDTiles; ++i)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              o[i][2 * h + e] = o[i][2 * h + e] * mine_scale +
                                theirs[(i * 4 + 2 * h + e) * 32] * their_scale;
        }
      }
    }
  }

  if (!warp_active) return;
  const bool direct = plan.active == 1;
  // Where the CTA and the thread are, read again: kept from the start, these
  // values took registers from the loop (the two-warpgroup kernel spilled).
  const uint32_t cta_x = special_register_ctaid_x(), cta_y = special_register_ctaid_y();
  const int out_split = split_of<CLUSTER_MERGE>(p, static_cast<int>(cta_x));
  const int out_b = static_cast<int>(cta_y) / p.num_kv_heads;
  const int out_kv_head = static_cast<int>(cta_y) % p.num_kv_heads;
  const uint32_t out_tid = special_register_tid_x();
  const int out_m_tile = m_tile_of<CLUSTER_MERGE>(p, static_cast<int>(cta_x));
  if constexpr (CLUSTER_MERGE) {
    if (!direct) {
      merge_splits_in_cluster<T, HEAD_DIM, Cfg::kBlockM>(
          p, o, row_max, row_sum, kv_smem, plan.active, out_split, out_b, out_kv_head,
          out_m_tile * Cfg::kBlockM,
          static_cast<int>(out_tid / 32 % Cfg::kRowWarps * 32 + out_tid % 32));
      VERIFY_OPS_STAMP(kStampEnd);
      return;
    }
  }
  const int quad_lane = static_cast<int>(out_tid % 4);
  const int out_row0 = out_m_tile * Cfg::kBlockM +
                       static_cast<int>(out_tid / 32 % Cfg::kRowWarps) * 16 +
                       static_cast<int>(out_tid % 32 / 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float sum = quad_sum(row_sum[h]);
    // A row that sees no key outputs zeros.
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    T* dst = nullptr;
    const int row = out_row0 + 8 * h;
    if (row < p.rows_per_kv_head) {
      uint32_t draft, head_in_group;
      p.group_div.divmod(row, draft, head_in_group);
      const int64_t token = static_cast<int64_t>(out_b) * p.num_drafts + draft;
      const int head = out_kv_head * p.group + static_cast<int>(head_in_group);
      if (direct) {
        dst = static_cast<T*>(p.out) + token * p.out_stride_token + head * p.out_stride_head;
      } else {
        const int64_t partial = (token * p.num_q_heads + head) * p.num_splits + out_split;
        dst = static_cast<T*>(p.partial_out) + partial * HEAD_DIM;
        if (quad_lane == 0)
          p.partial_lse[partial] = sum > 0.f ? row_max[h] + log2f(sum) : -INFINITY;
      }
    }
    // A quad holds a row's 16 columns of tiles 2j and 2j + 1 as 4-byte pairs.
    // Two exchanges give each lane 4 adjacent columns, so that the quad writes
    // whole 32-byte sectors: the L2 merges 16-byte pieces with a
    // read-modify-write each (NOTES, v10).
    const int odd_tile = quad_lane >> 1, high_cols = quad_lane & 1;
#pragma unroll
    for (int j = 0; j < kDTiles / 2; ++j) {
      const uint32_t even = pack_pair<T>(o[2 * j][2 * h] * inv, o[2 * j][2 * h + 1] * inv);
      const uint32_t odd =
          pack_pair<T>(o[2 * j + 1][2 * h] * inv, o[2 * j + 1][2 * h + 1] * inv);
      // Lanes 0-1 gather tile 2j, lanes 2-3 tile 2j + 1: each keeps its own
      // pair of that tile and takes its partner's (lane ^ 2).
      const uint32_t kept = odd_tile ? odd : even;
      const uint32_t taken = __shfl_xor_sync(0xffffffff, odd_tile ? even : odd, 2);
      const uint32_t low = odd_tile ? taken : kept, high = odd_tile ? kept : taken;
      // Then lanes 0 and 2 keep columns 0-3 of their tile, lanes 1 and 3 columns 4-7.
      const uint32_t other = __shfl_xor_sync(0xffffffff, high_cols ? low : high, 1);
      if (dst)
        *reinterpret_cast<uint2*>(dst + (2 * j + odd_tile) * 8 + 4 * high_cols) =
            high_cols ? make_uint2(other, high) : make_uint2(low, other);
    }
  }
  VERIFY_OPS_STAMP(kStampEnd);
}

// The (token, q head) row a merge warp or CTA owns, and how many splits hold
// partials for it; returns once the attention grid's partials are visible.
struct MergeRow {
  int64_t token;
  int head;
  int active_splits;  // 1: the attention kernel wrote the row itself
};

// The row's coordinates and split count, from the op's inputs only, so that
// a merge kernel may compute them before it waits for the attention grid
// (wait_for_primary_grid). Every merge CTA waits, so that a merge grid never
// completes before the attention grid.
template <int HEAD_DIM>
__device__ inline MergeRow merge_row(const TreeAttnParams& p, int64_t q_row) {
  allow_dependent_launch();  // what the stream runs next may queue behind this grid
  MergeRow row;
  // q_row < 2^31 (the host checks the row count).
  uint32_t token, head;
  p.q_heads_div.divmod(static_cast<uint32_t>(q_row), token, head);
  row.token = token;
  row.head = static_cast<int>(head);
  const int b = static_cast<int>(p.drafts_div.div(token));
  const int64_t prefix = load_index(p.seq_lens, p.lens_is_int64, b * p.lens_stride);
  row.active_splits = plan_splits(prefix + p.num_drafts, p.num_splits, p.split_min_tokens,
                                  TileConfig<HEAD_DIM>::kBlockN).active;
  return row;
}

// Merges the normalized split outputs of each (token, q head) row with their
// LSEs when one CTA's threads hold a row's splits (few_splits_capacity: 256
// at head_dim 64, 128 at 128, 64 at 256). A row's threads, whole warps, each own
// four of its dims for splits lane_split, lane_split + split lanes, ...
// (at most kFewSplitsPerThread), and load those partials and their LSEs at
// once: the merge costs one L2 latency however many splits there are. Each
// split lane weighs its splits against its own LSE max, so no thread waits
// on another before its sums; with more than one split lane, they combine
// through shared memory.
constexpr int kFewSplitThreads = 256;
constexpr int kFewSplitsPerThread = 16;

__host__ __device__ constexpr int few_splits_capacity(int head_dim) {
  return kFewSplitsPerThread * kFewSplitThreads / (head_dim / 4);
}

// Split lanes per row in merge_few_splits_kernel: the fewest (a power of two)
// that hold the splits, and enough for a row to fill a warp.
__host__ __device__ constexpr int few_split_lanes(int num_splits, int head_dim) {
  int lanes = 1;
  while (lanes * kFewSplitsPerThread < num_splits || lanes * (head_dim / 4) < 32) lanes *= 2;
  return lanes;
}

template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(kFewSplitThreads)
    merge_few_splits_kernel(const TreeAttnParams p) {
  constexpr int kColumns = HEAD_DIM / 4;  // float4s per row
  static_assert(few_split_lanes(few_splits_capacity(HEAD_DIM), HEAD_DIM) * kColumns <=
                    kFewSplitThreads,
                "a CTA must hold the splits of one row");
  __shared__ float4 lane_acc[kFewSplitThreads];
  __shared__ float2 lane_max_and_sum[kFewSplitThreads];
  const int split_lanes = few_split_lanes(p.num_splits, HEAD_DIM);
  const int row_threads = split_lanes * kColumns;
  const int tid = threadIdx.x;
  const int column = tid % kColumns;
  const int lane_split = tid % row_threads / kColumns;
  const int64_t n_rows = static_cast<int64_t>(p.batch) * p.num_drafts * p.num_q_heads;
  const int64_t q_row = static_cast<int64_t>(blockIdx.x) * (kFewSplitThreads / row_threads) +
                        tid / row_threads;
  MergeRow row{};
  if (q_row < n_rows) row = merge_row<HEAD_DIM>(p, q_row);
  // Uniform per warp: a warp holds threads of one row only.
  const bool merging = q_row < n_rows && row.active_splits > 1;
  const int active = merging ? row.active_splits : 0;
  // This thread's first split; the next are split_lanes apart.
  const int64_t first = q_row * p.num_splits + lane_split;
  const float* lse = p.partial_lse + first;
  const T* part = static_cast<const T*>(p.partial_out) + first * HEAD_DIM + column * 4;
  // Every CTA has a row (the grid is rounded up by rows), so every CTA waits.
  wait_for_primary_grid();

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float max_lse = -INFINITY, total_weight = 0.f;
  if (merging) {
    uint2 x[kFewSplitsPerThread];
    float split_lse[kFewSplitsPerThread];
    // Running pointers: one 64-bit add per split, no address rebuilt per load.
    const T* part_k = part;
    const float* lse_k = lse;
    const int part_step = split_lanes * HEAD_DIM;
#pragma unroll
    for (int k = 0; k < kFewSplitsPerThread; ++k) {
      // Predicated, not branched: every load issues before any lands.
      const bool in = lane_split + k * split_lanes < active;
      x[k] = in ? load_four(part_k) : make_uint2(0, 0);  // +0.0
      split_lse[k] = in ? *lse_k : -INFINITY;
      part_k += part_step;
      lse_k += split_lanes;
    }
#pragma unroll
    for (int k = 0; k < kFewSplitsPerThread; ++k) max_lse = fmaxf(max_lse, split_lse[k]);
#pragma unroll
    for (int k = 0; k < kFewSplitsPerThread; ++k) {
      if (k * split_lanes >= active) break;
      // Splits where the row sees no key, and all of them: weight 0.
      const float w = max_lse == -INFINITY ? 0.f : fast_exp2(split_lse[k] - max_lse);
      total_weight += w;
      add_scaled(acc, w, four_as_floats<T>(x[k]));
    }
  }
  if (split_lanes > 1) {  // the same for the whole grid
    lane_acc[tid] = acc;
    lane_max_and_sum[tid] = make_float2(max_lse, total_weight);
    __syncthreads();
    if (!merging || lane_split != 0) return;
    float row_max = max_lse;
    for (int l = 1; l < split_lanes; ++l)
      row_max = fmaxf(row_max, lane_max_and_sum[tid + l * kColumns].x);
    // A split lane without a finite LSE (nor one at all) holds zeros.
    auto scale_to_row = [&](float lane_max) {
      return lane_max == -INFINITY ? 0.f : fast_exp2(lane_max - row_max);
    };
    const float own = scale_to_row(max_lse);
    acc = make_float4(acc.x * own, acc.y * own, acc.z * own, acc.w * own);
    total_weight *= own;
    for (int l = 1; l < split_lanes; ++l) {
      const float2 lane = lane_max_and_sum[tid + l * kColumns];
      const float w = scale_to_row(lane.x);
      add_scaled(acc, w, lane_acc[tid + l * kColumns]);
      total_weight += w * lane.y;
    }
  }
  if (!merging) return;
  const float inv = total_weight > 0.f ? 1.f / total_weight : 0.f;
  T* dst = static_cast<T*>(p.out) + row.token * p.out_stride_token +
           row.head * p.out_stride_head + column * 4;
  *reinterpret_cast<uint2*>(dst) =
      make_uint2(pack_pair<T>(acc.x * inv, acc.y * inv), pack_pair<T>(acc.z * inv, acc.w * inv));
}

// The same for more splits than few_splits_capacity. CTA (row, chunk) owns kMergeDims dims of
// the row; its threads read all splits at once (kSplitLanes splits side by
// side, kMergeUnroll deep), so the partials, which sit in L2, stream at the
// memory's rate rather than its latency.
constexpr int kMergeThreads = 256;
constexpr int kMergeDims = 32;
constexpr int kMergeChunks = kMergeDims / 4;  // float4 per split and CTA
constexpr int kSplitLanes = kMergeThreads / kMergeChunks;
constexpr int kMergeUnroll = 8;
constexpr int kMaxSplits = 1024;
constexpr int kLsePerThread = kMaxSplits / kMergeThreads;

__device__ inline float block_reduce(float x, bool is_max, float* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float y = __shfl_xor_sync(0xffffffff, x, off);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
#pragma unroll
  for (int w = 1; w < kMergeThreads / 32; ++w) x = is_max ? fmaxf(x, scratch[w]) : x + scratch[w];
  __syncthreads();  // scratch is reused by the next reduction
  return x;
}

template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(kMergeThreads)
    merge_splits_kernel(const TreeAttnParams p) {
  const int64_t q_row = blockIdx.x;
  const int dim0 = blockIdx.y * kMergeDims;
  const int tid = threadIdx.x;
  const MergeRow row = merge_row<HEAD_DIM>(p, q_row);
  wait_for_primary_grid();
  const int active = row.active_splits;
  if (active == 1) return;

  __shared__ float weight[kMaxSplits];
  __shared__ float scratch[kMergeThreads / 32];
  __shared__ __align__(16) float lane_acc[kSplitLanes * kMergeDims];

  const float* lse = p.partial_lse + q_row * p.num_splits;
  float my_lse[kLsePerThread];
  float max_lse = -INFINITY;
#pragma unroll
  for (int i = 0; i < kLsePerThread; ++i) {
    const int s = tid + i * kMergeThreads;
    my_lse[i] = s < active ? lse[s] : -INFINITY;
    max_lse = fmaxf(max_lse, my_lse[i]);
  }
  max_lse = block_reduce(max_lse, true, scratch);
  float my_weight = 0.f;
#pragma unroll
  for (int i = 0; i < kLsePerThread; ++i) {
    const int s = tid + i * kMergeThreads;
    // All splits empty (a row that sees no key): every weight 0, output 0.
    const float w = max_lse == -INFINITY ? 0.f : fast_exp2(my_lse[i] - max_lse);
    if (s < active) weight[s] = w;
    my_weight += w;
  }
  const float total_weight = block_reduce(my_weight, false, scratch);  // also syncs weight[]

  const int chunk = tid % kMergeChunks, lane_split = tid / kMergeChunks;
  const T* part =
      static_cast<const T*>(p.partial_out) + q_row * p.num_splits * HEAD_DIM + dim0 + chunk * 4;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int s0 = lane_split; s0 < active; s0 += kSplitLanes * kMergeUnroll) {
    uint2 x[kMergeUnroll];
    float w[kMergeUnroll];
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
      const int s = s0 + u * kSplitLanes;
      const bool in = s < active;
      w[u] = in ? weight[s] : 0.f;
      x[u] = in ? load_four(part + static_cast<int64_t>(s) * HEAD_DIM) : make_uint2(0, 0);
    }
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) add_scaled(acc, w[u], four_as_floats<T>(x[u]));
  }
  *reinterpret_cast<float4*>(lane_acc + lane_split * kMergeDims + chunk * 4) = acc;
  __syncthreads();
  if (tid >= kMergeDims) return;
  float sum = 0.f;
#pragma unroll 8
  for (int l = 0; l < kSplitLanes; ++l) sum += lane_acc[l * kMergeDims + tid];
  const float inv = total_weight > 0.f ? 1.f / total_weight : 0.f;
  T* dst = static_cast<T*>(p.out) + row.token * p.out_stride_token + row.head * p.out_stride_head;
  dst[dim0 + tid] = Vec2<T>::one(sum * inv);
}

}  // namespace verify_ops
