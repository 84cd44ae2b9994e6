// Device attributes the launchers need, queried once per device.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <mutex>
#include <vector>

namespace verify_ops {

// A positive per-device value, computed once per device by `query`. Each
// call site (template instantiation) keeps its own table.
template <typename Query>
int cached_per_device(std::vector<int>& table, std::mutex& mu, int device, Query query) {
  std::lock_guard<std::mutex> lock(mu);
  if (device >= static_cast<int>(table.size())) table.resize(device + 1, 0);
  if (table[device] == 0) table[device] = query();
  return table[device];
}

template <cudaDeviceAttr ATTR>
int device_attribute(int device) {
  static std::mutex mu;
  static std::vector<int> table;
  return cached_per_device(table, mu, device, [&] {
    int value = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, ATTR, device));
    return value;
  });
}

// Programmatic dependent launch needs sm_90 or newer.
inline bool supports_dependent_launch(int device) {
  return device_attribute<cudaDevAttrComputeCapabilityMajor>(device) >= 9;
}

}  // namespace verify_ops
