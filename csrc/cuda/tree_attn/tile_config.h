// The tile configurations of the attention kernel: rows and warps per CTA,
// KV tokens per tile, pipeline stages, and the shared memory they take.
#pragma once

namespace verify_ops {

// KV_BYTES: bytes per K/V element, 2 (q's dtype) or 1 (an fp8 pool, which
// runs the mma.sync kernels: Hopper's fp8 wgmma would need Q in fp8 too).
template <int HEAD_DIM, int KEY_SPLIT = 1, int WARPS = 4, int KV_BYTES = 2>
struct TileConfig {
  static constexpr int kHeadDim = HEAD_DIM;
  static constexpr int kKeySplit = KEY_SPLIT;
  static constexpr int kKVElemBytes = KV_BYTES;
  static_assert(KV_BYTES == 2 || (KV_BYTES == 1 && WARPS == 4), "fp8 KV runs four warps");
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
  static constexpr bool kWarpgroupMma = KEY_SPLIT == 1 && KV_BYTES == 2;
  // At head_dim 256 the wgmma kernels (one CTA per SM, Q in shared memory)
  // keep three 32-token tiles in flight with one warpgroup, two with two or
  // with a producer (see kPrefetch); the key-split mma.sync kernels have two
  // stages, so that two CTAs share an SM.
  // fp8 tiles are half the bytes: four stages keep as many in flight.
  static constexpr int kStages =
      KV_BYTES == 1 ? 4 : HEAD_DIM <= 128 ? (WARPS == 4 ? 3 : 6) : (kWarpgroupMma ? 4 : 2);
  static constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row of Q
  static constexpr int kKVChunks = HEAD_DIM * KV_BYTES / 16;  // and of K and V
  static constexpr int kRowsPerPass = kLoadThreads / kKVChunks;
  static constexpr int kLoadRows = kBlockN / kRowsPerPass;  // rows per thread
  // The 16-dim steps of Q K^T whose Q fragments stay in registers for the
  // whole loop: all of them up to head_dim 128; at 256, half in the wgmma
  // kernels without a producer (all 64 registers of them do not fit beside 128
  // of O: ptxas spills in the loop), none elsewhere. A wgmma that reads Q from
  // shared memory reads three times the bytes per score at 32 keys a tile
  // (graph_tests' wgmma_sass_check guards the registers, which ptxas once
  // reused).
  static constexpr int kQRegisterSteps =
      HEAD_DIM <= 128 ? HEAD_DIM / 16 : (kWarpgroupMma && kProducerWarps == 0 ? 8 : 0);
  static constexpr bool kQAllInRegisters = kQRegisterSteps == HEAD_DIM / 16;
  static constexpr int kTileElems = kBlockN * HEAD_DIM;
  // Q held in registers is staged through the last stage (its K and V tiles
  // are adjacent) where it fits, which the pipeline fills only after Q has
  // been read: two four-warp CTAs then fit an SM. Otherwise Q has its own region.
  static constexpr bool kQInLastStage =
      kQAllInRegisters && kBlockM <= 2 * kBlockN && KV_BYTES == 2;
  static constexpr int kQSmemElems = kQInLastStage ? 0 : kBlockM * HEAD_DIM;
  // Slot indices run kStages tiles ahead of the KV they address, through a
  // ring of 2 * kStages tiles of 8-byte entries (int32 slots are zero-extended).
  static constexpr int kSlotRingTiles = 2 * kStages;
  static constexpr int kKVBytes = 2 * kStages * kTileElems * KV_BYTES;
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

}  // namespace verify_ops
