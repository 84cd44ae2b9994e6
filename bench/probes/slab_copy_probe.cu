// How fast one SM can gather a KV tile of scattered pool slots into wgmma's
// 128-byte-swizzled shared-memory layout, by copy instruction, with no math.
// It asks whether the head_dim-128 producer kernel is held by the issue and
// drain of its 16-byte cp.async copies (history/NOTES.md, the probes after v29), and
// whether the bulk tensor copy engine (TMA) moves the same bytes faster.
//
// Build and run (sm_90a; the tensor map comes from the driver at run time):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -Icsrc \
//        bench/probes/slab_copy_probe.cu -o slab_copy_probe && ./slab_copy_probe
//
// Each CTA (384 threads: two consumer warpgroups and a producer warpgroup,
// as in the kernel) streams kTokensPerCta tokens of one KV head, K and V,
// head_dim 128, through six stages of 64-token tiles. Consumers hold stages
// as the kernel's do, and spin hold_cycles per tile in place of its math
// (a sweep, cp.async only). Modes:
//   cp.async      16-byte copies from the 128 producer threads (the kernel's way)
//   tma_wg        1 x 64-element boxes, SWIZZLE_128B: 2 per producer thread
//   tma_warp      the same boxes from one producer warp, 8 per lane
//   tma_thread    the same boxes from one thread, 256 per tile
//   cp.async_64   the cp.async copies from 64 producer threads
//   cp.async_split K and V handed over apart (K freed once scored), K issued
//                 k_lead tiles ahead of V
//   no_copy       stages handed over with no copies: the consumers' loop alone
//   bulk          1-D bulk copies of each 256-byte row (lands unswizzled:
//                 wgmma could not read it; a bound on per-copy cost only)
// The cp.async stream also runs with 32-token tiles twelve deep (the same
// 192 KB) and with five or four 64-token stages; hold is per 64 tokens.
// Last, one wave of one CTA per SM, with all SMs streaming or every other
// one (the rest idle), timed per CTA by %globaltimer.
// Slots are a random permutation of the pool or contiguous runs. A check
// launch compares every landed tile with the kernel's swizzled_slabs layout.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "cuda/ptx/mbarrier.cuh"  // the kernel's mbarriers and its swizzled_slabs layout

#define CHECK_CUDA(x)                                                              \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

namespace {

constexpr int kHeadDim = 128, kNumKvHeads = 8;
constexpr int kTokensPerCta = 4096;
constexpr int kThreads = 384, kConsumerThreads = 256, kProducerThreads = 128;
// Tiles of BLOCK_N tokens (64 as in the kernel, or 32), STAGES deep.
constexpr int smem_bytes(int block_n, int stages) {
  return 1024 + stages * 2 * block_n * kHeadDim * 2 + kTokensPerCta * 4 + 4 * stages * 8;
}

enum Mode { kCpAsync, kTmaWarpgroup, kTmaWarp, kTmaThread, kBulk, kCpAsyncSplit, kCpAsyncHalf, kNoCopy, kNumModes };
const char* const kModeNames[] = {"cp.async", "tma_wg", "tma_warp", "tma_thread", "bulk", "cp.async_split",
                                  "cp.async_64", "no_copy"};

using verify_ops::cp_async_mbarrier_arrive;
using verify_ops::mbarrier_init;
using verify_ops::mbarrier_wait;
using verify_ops::swizzled_slabs;

__device__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ void mbarrier_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}
__device__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
__device__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}

struct ProbeArgs {
  const __nv_bfloat16* k;
  const __nv_bfloat16* v;
  const int* slots;  // [num_ctas, kTokensPerCta]
  int* mismatches;   // check launch only
  unsigned long long* cycles;  // per CTA: SM cycles from first issue to last tile
  unsigned long long* nanos;   // and the global timer's nanoseconds over the same span
  int hold_cycles;             // consumers' work per tile
  int k_lead;                  // cp.async_split: K copies run this many tiles ahead of V
  bool release_early;          // free tile t - 1 at the start of step t, not halfway
  int active_every;            // only every n-th CTA streams; the others hold their SM idle
  unsigned* active_done;       // active CTAs finished, zeroed before each launch
  bool check;
};

template <Mode MODE, int BLOCK_N, int STAGES>
__global__ void __launch_bounds__(kThreads, 1)
    slab_copy_probe(ProbeArgs a, const __grid_constant__ CUtensorMap k_map,
                    const __grid_constant__ CUtensorMap v_map) {
  constexpr int kBlockN = BLOCK_N, kStages = STAGES;
  constexpr int kTileBytes = kBlockN * kHeadDim * 2;  // one of K or V
  constexpr int kSlabBytes = kBlockN * 128;           // 64 dims of every token
  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t smem_raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t base = (smem_raw + 1023) & ~1023u;
  unsigned char* const smem_aligned = smem + (base - smem_raw);
  auto k_stage = [&](int s) { return base + s * 2 * kTileBytes; };
  auto v_stage = [&](int s) { return k_stage(s) + kTileBytes; };
  int* const slots = reinterpret_cast<int*>(smem_aligned + kStages * 2 * kTileBytes);
  const uint32_t bars = base + kStages * 2 * kTileBytes + kTokensPerCta * 4;
  auto full = [&](int t) { return bars + (t % kStages) * 8; };
  auto empty = [&](int t) { return bars + (kStages + t % kStages) * 8; };
  // cp.async_split hands K and V over apart: full and empty above are K's.
  auto full_v = [&](int t) { return bars + (2 * kStages + t % kStages) * 8; };
  auto empty_v = [&](int t) { return bars + (3 * kStages + t % kStages) * 8; };
  constexpr bool kSplit = MODE == kCpAsyncSplit;
  constexpr bool kCpAsyncCopies = MODE == kCpAsync || kSplit || MODE == kCpAsyncHalf;
  constexpr int kCopiers = MODE == kCpAsyncHalf ? 64 : kProducerThreads;  // cp.async threads
  const int tid = threadIdx.x;
  if (blockIdx.x % a.active_every != 0) {  // every CTA is resident: one wave, one per SM
    if (tid == 0) {
      a.nanos[blockIdx.x] = 0;
      while (atomicAdd(a.active_done, 0) < gridDim.x / a.active_every) __nanosleep(1000);
    }
    return;
  }
  auto finish = [&]() {
    if (tid == 0) atomicAdd(a.active_done, 1);
  };
  const int kv_head = blockIdx.x % kNumKvHeads;
  constexpr int kNumTiles = kTokensPerCta / kBlockN;

  const int* my_slots = a.slots + static_cast<int64_t>(blockIdx.x) * kTokensPerCta;
  for (int i = tid; i < kTokensPerCta; i += kThreads) slots[i] = my_slots[i];
  if (tid < kStages) {
    mbarrier_init(full(tid), kCpAsyncCopies ? kCopiers : 1);
    mbarrier_init(empty(tid), kConsumerThreads / 32);
    mbarrier_init(full_v(tid), kProducerThreads);
    mbarrier_init(empty_v(tid), kConsumerThreads / 32);
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  __syncthreads();

  const uint32_t kv_slot_bytes = kNumKvHeads * kHeadDim * 2;
  const char* k_head = reinterpret_cast<const char*>(a.k) + kv_head * kHeadDim * 2;
  const char* v_head = reinterpret_cast<const char*>(a.v) + kv_head * kHeadDim * 2;

  if (tid >= kConsumerThreads) {
    const int p = tid - kConsumerThreads;
    if (MODE == kTmaWarp && p >= 32) return;
    if (MODE == kTmaThread && p >= 1) return;
    if (MODE == kCpAsyncHalf && p >= 64) return;
    if (MODE == kNoCopy && p >= 1) return;
    const unsigned long long start = clock64(), start_ns = global_ns();
    // One 16-byte chunk of every (kCopiers / 16)-th row of stage s, K and/or V,
    // per cp.async thread; with both, each row's K and V copies go out together.
    auto issue_rows = [&](int s, const int* tile_slots, auto copy_k, auto copy_v) {
      const int chunk = p % 16;
#pragma unroll
      for (int j = 0; j < kBlockN * 16 / kCopiers; ++j) {
        const int row = p / 16 + kCopiers / 16 * j;
        const uint64_t slot = static_cast<uint32_t>(tile_slots[row]);
        const uint32_t off = swizzled_slabs<kBlockN>(row, chunk);
        if constexpr (decltype(copy_k)::value)
          cp_async_16(k_stage(s) + off, k_head + slot * kv_slot_bytes + chunk * 16);
        if constexpr (decltype(copy_v)::value)
          cp_async_16(v_stage(s) + off, v_head + slot * kv_slot_bytes + chunk * 16);
      }
    };
    constexpr std::true_type kWith{};
    constexpr std::false_type kWithout{};
    for (int i = 0; kSplit && i < kNumTiles + a.k_lead; ++i) {
      if (i < kNumTiles) {
        if (i >= kStages) mbarrier_wait(empty(i), (i / kStages - 1) & 1);
        issue_rows(i % kStages, slots + i * kBlockN, kWith, kWithout);
        cp_async_mbarrier_arrive(full(i));
      }
      const int j = i - a.k_lead;
      if (j >= 0) {
        if (j >= kStages) mbarrier_wait(empty_v(j), (j / kStages - 1) & 1);
        issue_rows(j % kStages, slots + j * kBlockN, kWithout, kWith);
        cp_async_mbarrier_arrive(full_v(j));
      }
    }
    for (int tile = 0; !kSplit && tile < kNumTiles; ++tile) {
      if (tile >= kStages) mbarrier_wait(empty(tile), (tile / kStages - 1) & 1);
      const int s = tile % kStages;
      const int* tile_slots = slots + tile * kBlockN;
      if constexpr (kCpAsyncCopies) {
        issue_rows(s, tile_slots, kWith, kWith);
        cp_async_mbarrier_arrive(full(tile));
      } else if constexpr (MODE == kNoCopy) {
        mbarrier_arrive(full(tile));
      } else if constexpr (MODE == kBulk) {
        if (p == 0) mbarrier_arrive_expect_tx(full(tile), 2 * kTileBytes);
        asm volatile("bar.sync 1, 128;" ::: "memory");  // expect_tx before any completes
        if (p < kBlockN) {
          const uint64_t slot = static_cast<uint32_t>(tile_slots[p]);
          bulk_load(k_stage(s) + p * kHeadDim * 2, k_head + slot * kv_slot_bytes, kHeadDim * 2,
                    full(tile));
          bulk_load(v_stage(s) + p * kHeadDim * 2, v_head + slot * kv_slot_bytes, kHeadDim * 2,
                    full(tile));
        }
      } else {
        // Box (64 dims, 1 slot) at (kv_head * 128 + slab * 64, slot) lands at
        // slab * kSlabBytes + row * 128: its swizzle follows the address.
        constexpr int kIssuers = MODE == kTmaWarpgroup ? 128 : MODE == kTmaWarp ? 32 : 1;
        if (p == 0) mbarrier_arrive_expect_tx(full(tile), 2 * kTileBytes);
        if constexpr (kIssuers > 1) {
          if constexpr (kIssuers == 128) asm volatile("bar.sync 1, 128;" ::: "memory");
          else __syncwarp();
        }
#pragma unroll 4
        for (int i = p; i < 2 * kBlockN; i += kIssuers) {
          const int row = i / 2, slab = i % 2;
          const int slot = tile_slots[row];
          const uint32_t off = slab * kSlabBytes + row * 128;
          tma_load_2d(k_stage(s) + off, &k_map, kv_head * kHeadDim + slab * 64, slot, full(tile));
          tma_load_2d(v_stage(s) + off, &v_map, kv_head * kHeadDim + slab * 64, slot, full(tile));
        }
      }
    }
    if constexpr (kCpAsyncCopies) asm volatile("cp.async.wait_all;" ::: "memory");
    if (p == 0) {
      a.cycles[blockIdx.x] = clock64() - start;
      a.nanos[blockIdx.x] = global_ns() - start_ns;
    }
    return;
  }

  // Consumers, paced like the kernel's: step t waits for tile t + 1, works
  // hold_cycles on tile t, and releases tile t - 1 halfway; the second
  // warpgroup runs half a step behind the first (its ping-pong turns).
  auto spin = [](int cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
  };
  // Compares K or V of `tile` in shared memory with the pool.
  auto check = [&](int tile, bool is_v) {
    if (!a.check || MODE == kNoCopy) return;
    const int s = tile % kStages;
    const char* head = is_v ? v_head : k_head;
    const uint32_t stage = is_v ? v_stage(s) : k_stage(s);
    int bad = 0;
    for (int u = tid; u < kBlockN * 16; u += kConsumerThreads) {
      const int row = u / 16, chunk = u % 16;
      const uint64_t slot = static_cast<uint32_t>(slots[tile * kBlockN + row]);
      const uint32_t off = MODE == kBulk ? row * kHeadDim * 2 + chunk * 16 : swizzled_slabs<kBlockN>(row, chunk);
      const uint4 want = *reinterpret_cast<const uint4*>(head + slot * kv_slot_bytes + chunk * 16);
      const uint4 got = *reinterpret_cast<const uint4*>(smem_aligned + (stage - base) + off);
      bad += (want.x != got.x) | (want.y != got.y) | (want.z != got.z) | (want.w != got.w);
    }
    if (bad) atomicAdd(a.mismatches, bad);
    __syncwarp();
  };
  const bool warp_leader = tid % 32 == 0;
  if (tid >= 128) spin(a.hold_cycles / 2);
  if constexpr (kSplit) {
    // K is free once the scores that read it are done (halfway through the
    // step before its own), V once its P V is (halfway through the next).
    mbarrier_wait(full(0), 0);
    check(0, false);
    if (warp_leader) mbarrier_arrive(empty(0));
    for (int tile = 0; tile < kNumTiles; ++tile) {
      if (tile + 1 < kNumTiles) {
        mbarrier_wait(full(tile + 1), ((tile + 1) / kStages) & 1);
        check(tile + 1, false);
      }
      spin(a.hold_cycles / 2);
      if (tile + 1 < kNumTiles && warp_leader) mbarrier_arrive(empty(tile + 1));
      if (tile > 0 && warp_leader) mbarrier_arrive(empty_v(tile - 1));
      mbarrier_wait(full_v(tile), (tile / kStages) & 1);
      check(tile, true);
      spin(a.hold_cycles / 2);
    }
    finish();
    return;
  }
  mbarrier_wait(full(0), 0);
  for (int tile = 0; tile < kNumTiles; ++tile) {
    if (tile + 1 < kNumTiles) mbarrier_wait(full(tile + 1), ((tile + 1) / kStages) & 1);
    check(tile, false);
    check(tile, true);
    if (a.release_early && tile > 0 && warp_leader) mbarrier_arrive(empty(tile - 1));
    spin(a.hold_cycles / 2);
    if (!a.release_early && tile > 0 && warp_leader) mbarrier_arrive(empty(tile - 1));
    spin(a.hold_cycles / 2);
  }
  finish();
}

__global__ void fill_random(uint32_t* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(i >> 32) ^ (seed * 0x9e3779b9u);
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    p[i] = x;
  }
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                 CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                 CUtensorMapFloatOOBfill);

CUtensorMap make_pool_map(EncodeTiled encode, void* pool, uint64_t num_slots) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {kNumKvHeads * kHeadDim, num_slots};
  const cuuint64_t strides[1] = {kNumKvHeads * kHeadDim * 2};
  const cuuint32_t box[2] = {64, 1};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, pool, dims, strides, box,
                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed: %d\n", static_cast<int>(r));
    std::exit(1);
  }
  return map;
}

template <Mode MODE, int BLOCK_N = 64, int STAGES = 6>
void launch(int num_ctas, const ProbeArgs& a, const CUtensorMap& km, const CUtensorMap& vm) {
  constexpr int kSmemBytes = smem_bytes(BLOCK_N, STAGES);
  CHECK_CUDA(cudaFuncSetAttribute(slab_copy_probe<MODE, BLOCK_N, STAGES>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  slab_copy_probe<MODE, BLOCK_N, STAGES><<<num_ctas, kThreads, kSmemBytes>>>(a, km, vm);
}

// Tile shapes for the cp.async stream: {tokens per tile, stages}.
constexpr int kTilings[][2] = {{64, 6}, {32, 12}, {64, 5}, {64, 4}};

void launch_mode(int mode, int tiling, int num_ctas, const ProbeArgs& a, const CUtensorMap& km,
                 const CUtensorMap& vm) {
  if (mode == kCpAsync && tiling == 1) return launch<kCpAsync, 32, 12>(num_ctas, a, km, vm);
  if (mode == kCpAsync && tiling == 2) return launch<kCpAsync, 64, 5>(num_ctas, a, km, vm);
  if (mode == kCpAsync && tiling == 3) return launch<kCpAsync, 64, 4>(num_ctas, a, km, vm);
  switch (mode) {
    case kCpAsync: return launch<kCpAsync>(num_ctas, a, km, vm);
    case kTmaWarpgroup: return launch<kTmaWarpgroup>(num_ctas, a, km, vm);
    case kTmaWarp: return launch<kTmaWarp>(num_ctas, a, km, vm);
    case kTmaThread: return launch<kTmaThread>(num_ctas, a, km, vm);
    case kBulk: return launch<kBulk>(num_ctas, a, km, vm);
    case kCpAsyncHalf: return launch<kCpAsyncHalf>(num_ctas, a, km, vm);
    case kNoCopy: return launch<kNoCopy>(num_ctas, a, km, vm);
    default: return launch<kCpAsyncSplit>(num_ctas, a, km, vm);
  }
}

}  // namespace

int main() {
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const int num_ctas = prop.multiProcessorCount * 4;  // four equal waves, one CTA per SM
  const uint64_t tokens = static_cast<uint64_t>(num_ctas) * kTokensPerCta;
  const uint64_t num_slots = 1 << 22;  // 8 GB per K and V pool: no slot read twice
  const uint64_t pool_elems = num_slots * kNumKvHeads * kHeadDim;
  __nv_bfloat16 *k, *v;
  CHECK_CUDA(cudaMalloc(&k, pool_elems * 2));
  CHECK_CUDA(cudaMalloc(&v, pool_elems * 2));
  fill_random<<<4 * prop.multiProcessorCount, 256>>>(reinterpret_cast<uint32_t*>(k), pool_elems / 2, 1);
  fill_random<<<4 * prop.multiProcessorCount, 256>>>(reinterpret_cast<uint32_t*>(v), pool_elems / 2, 2);
  CHECK_CUDA(cudaGetLastError());
  // Each CTA's tokens: distinct slots, random or in one contiguous run.
  std::vector<int> random_slots(tokens), run_slots(tokens);
  {
    std::vector<int> perm(num_slots);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(2));
    for (uint64_t i = 0; i < tokens; ++i) random_slots[i] = perm[i % num_slots];
    for (int c = 0; c < num_ctas; ++c)
      for (int t = 0; t < kTokensPerCta; ++t)
        run_slots[static_cast<uint64_t>(c) * kTokensPerCta + t] =
            static_cast<int>((static_cast<uint64_t>(c / kNumKvHeads) * kTokensPerCta + t) % num_slots);
  }
  int *slots, *mismatches;
  unsigned long long *cycles, *nanos;
  CHECK_CUDA(cudaMalloc(&nanos, num_ctas * 8));
  unsigned* active_done;
  CHECK_CUDA(cudaMalloc(&active_done, 4));
  CHECK_CUDA(cudaMalloc(&slots, tokens * 4));
  CHECK_CUDA(cudaMalloc(&mismatches, 4));
  CHECK_CUDA(cudaMalloc(&cycles, num_ctas * 8));

  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  const auto encode = reinterpret_cast<EncodeTiled>(fn);
  const CUtensorMap k_map = make_pool_map(encode, k, num_slots);
  const CUtensorMap v_map = make_pool_map(encode, v, num_slots);

  const double bytes = static_cast<double>(tokens) * 2 * kHeadDim * 2;
  std::printf("{\"device\": \"%s\", \"sms\": %d, \"ctas\": %d, \"bytes_per_launch\": %.0f, \"rows\": [\n",
              prop.name, prop.multiProcessorCount, num_ctas, bytes);
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  bool first = true;
  // hold_cycles is per 64 tokens; a 32-token tile holds half of it.
  // grid_ctas < num_ctas: one wave, every CTA resident, active_every of them streaming.
  auto measure = [&](int layout, int mode, int hold_cycles, int k_lead, bool release_early = false,
                     int tiling = 0, int grid_ctas = 0, int active_every = 1) {
    const int block_n = kTilings[tiling][0];
    const int grid = grid_ctas > 0 ? grid_ctas : num_ctas;
    ProbeArgs a{k,      v,      slots,         mismatches, cycles,
                nanos,  hold_cycles * block_n / 64, k_lead, release_early, active_every,
                active_done, true};
    CHECK_CUDA(cudaMemset(mismatches, 0, 4));
    CHECK_CUDA(cudaMemset(active_done, 0, 4));
    launch_mode(mode, tiling, grid, a, k_map, v_map);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    int bad = 0;
    CHECK_CUDA(cudaMemcpy(&bad, mismatches, 4, cudaMemcpyDeviceToHost));
    a.check = false;
    std::vector<float> ms;
    for (int i = 0; i < 25; ++i) {
      CHECK_CUDA(cudaMemset(active_done, 0, 4));
      CHECK_CUDA(cudaEventRecord(e0));
      launch_mode(mode, tiling, grid, a, k_map, v_map);
      CHECK_CUDA(cudaEventRecord(e1));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float t;
      CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
      if (i >= 5) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med_us = ms[ms.size() / 2] * 1e3;
    // Per active CTA (the last launch): SM cycles and nanoseconds of its stream.
    std::vector<unsigned long long> cyc(grid), ns(grid);
    CHECK_CUDA(cudaMemcpy(cyc.data(), cycles, grid * 8, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(ns.data(), nanos, grid * 8, cudaMemcpyDeviceToHost));
    std::vector<double> ghz, cta_ns, cta_cycles;
    for (int c = 0; c < grid; c += active_every) {
      ghz.push_back(static_cast<double>(cyc[c]) / ns[c]);
      cta_ns.push_back(static_cast<double>(ns[c]));
      cta_cycles.push_back(static_cast<double>(cyc[c]));
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    const int tiles_per_cta = kTokensPerCta / 64;  // 64-token units
    const int waves = grid / prop.multiProcessorCount;
    const double active_bytes = bytes * (grid / active_every) / num_ctas;
    std::printf("%s{\"layout\": \"%s\", \"mode\": \"%s\", \"tile_tokens\": %d, \"stages\": %d, "
                "\"hold_cycles_per_64_tokens\": %d, \"k_lead\": %d, \"release_early\": %d, "
                "\"grid_ctas\": %d, \"active_every\": %d, "
                "\"mismatches\": %d, \"median_us\": %.1f, \"tb_per_s\": %.3f, \"ns_per_64_tokens\": %.0f, "
                "\"cta_ns_per_64_tokens\": %.0f, \"producer_cycles_per_64_tokens\": %.0f, \"sm_ghz\": %.2f}",
                first ? "" : ",\n", layout == 0 ? "random" : "contiguous", kModeNames[mode], block_n,
                kTilings[tiling][1], hold_cycles, k_lead, static_cast<int>(release_early), grid, active_every,
                bad, med_us, active_bytes / (med_us * 1e-6) / 1e12, med_us * 1e3 / (waves * tiles_per_cta),
                median(cta_ns) / tiles_per_cta, median(cta_cycles) / tiles_per_cta, median(ghz));
    first = false;
  };
  for (int layout = 0; layout < 2; ++layout) {
    CHECK_CUDA(cudaMemcpy(slots, (layout == 0 ? random_slots : run_slots).data(), tokens * 4,
                          cudaMemcpyHostToDevice));
    for (int mode = 0; mode < kNumModes; ++mode)
      if (mode != kNoCopy) measure(layout, mode, 0, 2);
    if (layout == 0)
      for (int hold : {0, 1000, 1400, 1600, 1800}) {
        for (int tiling = hold == 0 ? 1 : 0; tiling < 4; ++tiling)
          measure(layout, kCpAsync, hold, 0, false, tiling);
        if (hold == 0) continue;
        measure(layout, kCpAsync, hold, 0, true);
        measure(layout, kCpAsyncHalf, hold, 0);
        for (int lead : {0, 2}) measure(layout, kCpAsyncSplit, hold, lead);
      }
    // One wave: all SMs streaming, or every other one (the rest idle), so that
    // a stream paced by its consumers is seen with and without HBM's limit.
    if (layout == 0)
      for (int hold : {0, 1000, 1400, 1800})
        for (int every : {1, 2})
          for (int mode : {kCpAsync, kNoCopy})
            measure(layout, mode, hold, 0, false, 0, prop.multiProcessorCount, every);
  }
  std::printf("\n]}\n");
  return 0;
}
