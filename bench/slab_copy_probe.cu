// How fast one SM can gather a KV tile of scattered pool slots into wgmma's
// 128-byte-swizzled shared-memory layout, by copy instruction, with no math.
// It asks whether the head_dim-128 producer kernel is held by the issue and
// drain of its 16-byte cp.async copies (NOTES, the probes after v29), and
// whether the bulk tensor copy engine (TMA) moves the same bytes faster.
//
// Build and run (sm_90a; the tensor map comes from the driver at run time):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 \
//        bench/slab_copy_probe.cu -o slab_copy_probe && ./slab_copy_probe
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
//   cp.async_64   the same from 64 producer threads
//   cp.async_split K and V handed over apart (K freed once scored), K issued
//                 k_lead tiles ahead of V
//   bulk          1-D bulk copies of each 256-byte row (lands unswizzled:
//                 wgmma could not read it; a bound on per-copy cost only)
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
#include <vector>

#define CHECK_CUDA(x)                                                              \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

namespace {

constexpr int kHeadDim = 128, kNumKvHeads = 8, kBlockN = 64, kStages = 6;
constexpr int kTokensPerCta = 4096;
constexpr int kTileBytes = kBlockN * kHeadDim * 2;  // one of K or V
constexpr int kSlabBytes = kBlockN * 128;           // 64 dims of every token
constexpr int kThreads = 384, kConsumerThreads = 256, kProducerThreads = 128;
constexpr int kSmemBytes = 1024 + kStages * 2 * kTileBytes + kTokensPerCta * 4 + 4 * kStages * 8;

enum Mode { kCpAsync, kTmaWarpgroup, kTmaWarp, kTmaThread, kBulk, kCpAsyncSplit, kCpAsyncHalf, kNumModes };
const char* const kModeNames[] = {"cp.async", "tma_wg", "tma_warp", "tma_thread", "bulk", "cp.async_split",
                                  "cp.async_64"};

// The kernel's layout: 64-dim slabs of all rows, 16-byte chunks XORed by row.
__host__ __device__ uint32_t swizzled_slabs(int row, int chunk) {
  return (chunk / 8) * kBlockN * 128 + row * 128 + (((chunk % 8) ^ (row % 8)) << 4);
}

__device__ void mbarrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
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
__device__ void cp_async_mbarrier_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
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
  bool sleep_hold;
  bool check;
};

template <Mode MODE>
__global__ void __launch_bounds__(kThreads, 1)
    slab_copy_probe(ProbeArgs a, const __grid_constant__ CUtensorMap k_map,
                    const __grid_constant__ CUtensorMap v_map) {
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
    const unsigned long long start = clock64(), start_ns = global_ns();
    // 8 rows x one 16-byte chunk of K or V per thread.
    auto issue_rows = [&](uint32_t stage, const char* head, const int* tile_slots) {
      const int chunk = p % 16;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int row = p / 16 + 8 * j;
        const uint64_t slot = static_cast<uint32_t>(tile_slots[row]);
        cp_async_16(stage + swizzled_slabs(row, chunk), head + slot * kv_slot_bytes + chunk * 16);
      }
    };
    for (int i = 0; kSplit && i < kNumTiles + a.k_lead; ++i) {
      if (i < kNumTiles) {
        if (i >= kStages) mbarrier_wait(empty(i), (i / kStages - 1) & 1);
        issue_rows(k_stage(i % kStages), k_head, slots + i * kBlockN);
        cp_async_mbarrier_arrive(full(i));
      }
      const int j = i - a.k_lead;
      if (j >= 0) {
        if (j >= kStages) mbarrier_wait(empty_v(j), (j / kStages - 1) & 1);
        issue_rows(v_stage(j % kStages), v_head, slots + j * kBlockN);
        cp_async_mbarrier_arrive(full_v(j));
      }
    }
    for (int tile = 0; !kSplit && tile < kNumTiles; ++tile) {
      if (tile >= kStages) mbarrier_wait(empty(tile), (tile / kStages - 1) & 1);
      const int s = tile % kStages;
      const int* tile_slots = slots + tile * kBlockN;
      if constexpr (kCpAsyncCopies) {
        const int chunk = p % 16;
#pragma unroll
        for (int j = 0; j < kBlockN * 16 / kCopiers; ++j) {
          const int row = p / 16 + kCopiers / 16 * j;
          const uint64_t slot = static_cast<uint32_t>(tile_slots[row]);
          const uint32_t off = swizzled_slabs(row, chunk);
          cp_async_16(k_stage(s) + off, k_head + slot * kv_slot_bytes + chunk * 16);
          cp_async_16(v_stage(s) + off, v_head + slot * kv_slot_bytes + chunk * 16);
        }
        cp_async_mbarrier_arrive(full(tile));
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
  // Polling the clock keeps the warp issuing; sleep_hold checks it every
  // 100 ns instead, leaving the issue slots to the producer.
  auto spin = [&](int cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
      if (a.sleep_hold) __nanosleep(100);
    }
  };
  // Compares K or V of `tile` in shared memory with the pool.
  auto check = [&](int tile, bool is_v) {
    if (!a.check) return;
    const int s = tile % kStages;
    const char* head = is_v ? v_head : k_head;
    const uint32_t stage = is_v ? v_stage(s) : k_stage(s);
    int bad = 0;
    for (int u = tid; u < kBlockN * 16; u += kConsumerThreads) {
      const int row = u / 16, chunk = u % 16;
      const uint64_t slot = static_cast<uint32_t>(slots[tile * kBlockN + row]);
      const uint32_t off = MODE == kBulk ? row * kHeadDim * 2 + chunk * 16 : swizzled_slabs(row, chunk);
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

template <Mode MODE>
void launch(int num_ctas, const ProbeArgs& a, const CUtensorMap& km, const CUtensorMap& vm) {
  CHECK_CUDA(cudaFuncSetAttribute(slab_copy_probe<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  kSmemBytes));
  slab_copy_probe<MODE><<<num_ctas, kThreads, kSmemBytes>>>(a, km, vm);
}

void launch_mode(int mode, int num_ctas, const ProbeArgs& a, const CUtensorMap& km, const CUtensorMap& vm) {
  switch (mode) {
    case kCpAsync: return launch<kCpAsync>(num_ctas, a, km, vm);
    case kTmaWarpgroup: return launch<kTmaWarpgroup>(num_ctas, a, km, vm);
    case kTmaWarp: return launch<kTmaWarp>(num_ctas, a, km, vm);
    case kTmaThread: return launch<kTmaThread>(num_ctas, a, km, vm);
    case kBulk: return launch<kBulk>(num_ctas, a, km, vm);
    case kCpAsyncHalf: return launch<kCpAsyncHalf>(num_ctas, a, km, vm);
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
  auto measure = [&](int layout, int mode, int hold_cycles, int k_lead, bool release_early = false,
                     bool sleep_hold = false) {
    ProbeArgs a{k, v, slots, mismatches, cycles, nanos, hold_cycles, k_lead, release_early, sleep_hold, true};
    CHECK_CUDA(cudaMemset(mismatches, 0, 4));
    launch_mode(mode, num_ctas, a, k_map, v_map);
    CHECK_CUDA(cudaGetLastError());
    CHECK_CUDA(cudaDeviceSynchronize());
    int bad = 0;
    CHECK_CUDA(cudaMemcpy(&bad, mismatches, 4, cudaMemcpyDeviceToHost));
    a.check = false;
    std::vector<float> ms;
    for (int i = 0; i < 25; ++i) {
      CHECK_CUDA(cudaEventRecord(e0));
      launch_mode(mode, num_ctas, a, k_map, v_map);
      CHECK_CUDA(cudaEventRecord(e1));
      CHECK_CUDA(cudaEventSynchronize(e1));
      float t;
      CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
      if (i >= 5) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med_us = ms[ms.size() / 2] * 1e3;
    std::vector<unsigned long long> cyc(num_ctas), ns(num_ctas);
    CHECK_CUDA(cudaMemcpy(cyc.data(), cycles, num_ctas * 8, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(ns.data(), nanos, num_ctas * 8, cudaMemcpyDeviceToHost));
    std::vector<double> ghz(num_ctas);
    for (int c = 0; c < num_ctas; ++c) ghz[c] = static_cast<double>(cyc[c]) / ns[c];
    std::sort(cyc.begin(), cyc.end());
    std::sort(ghz.begin(), ghz.end());
    constexpr int kTilesPerCta = kTokensPerCta / kBlockN;
    const double sm_ghz = ghz[num_ctas / 2];  // the last launch's median CTA
    std::printf("%s{\"layout\": \"%s\", \"mode\": \"%s\", \"hold_cycles\": %d, \"k_lead\": %d, \"release_early\": %d, \"sleep_hold\": %d, \"mismatches\": %d, "
                "\"median_us\": %.1f, \"tb_per_s\": %.3f, \"ns_per_tile\": %.0f, "
                "\"producer_cycles_per_tile\": %.0f, \"sm_ghz\": %.2f}",
                first ? "" : ",\n", layout == 0 ? "random" : "contiguous", kModeNames[mode], hold_cycles,
                k_lead, static_cast<int>(release_early), static_cast<int>(sleep_hold), bad, med_us, bytes / (med_us * 1e-6) / 1e12, med_us * 1e3 / (4 * kTilesPerCta),
                static_cast<double>(cyc[num_ctas / 2]) / kTilesPerCta, sm_ghz);
    first = false;
  };
  for (int layout = 0; layout < 2; ++layout) {
    CHECK_CUDA(cudaMemcpy(slots, (layout == 0 ? random_slots : run_slots).data(), tokens * 4,
                          cudaMemcpyHostToDevice));
    for (int mode = 0; mode < kNumModes; ++mode) measure(layout, mode, 0, 2);
    if (layout == 0)
      for (int hold : {1000, 1400, 1600, 1800}) {
        measure(layout, kCpAsync, hold, 0);
        measure(layout, kCpAsync, hold, 0, true);
        measure(layout, kCpAsync, hold, 0, false, true);
        measure(layout, kCpAsyncHalf, hold, 0);
        for (int lead : {0, 2}) measure(layout, kCpAsyncSplit, hold, lead);
      }
  }
  std::printf("\n]}\n");
  return 0;
}
