// Element conversions between T (bf16 or fp16) and fp32, and reductions
// over the four lanes (a quad) that share a row of an MMA fragment.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace verify_ops {

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

__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

}  // namespace verify_ops
