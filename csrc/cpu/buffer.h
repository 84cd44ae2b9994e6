// Scratch memory of the CPU kernel: grows on demand and never shrinks, so
// that one per thread serves call after call without allocating; 64-byte
// aligned (a cache line, an AVX-512 vector, an AMX tile row), where malloc's
// 16 bytes would let tile rows straddle cache lines by an amount that changes
// from one process to the next.
#pragma once

#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

namespace verify_ops::cpu {

template <typename T>
class Buffer {
  static_assert(std::is_trivially_copyable_v<T>, "zero bytes must be a valid T");

 public:
  T* data() const { return data_.get(); }
  T& operator[](int64_t i) const { return data_.get()[i]; }

  // At least `size` elements, zero when first allocated; the contents do not
  // survive growth.
  void grow(int64_t size) {
    if (size <= size_) return;
    constexpr size_t kAlignment = 64;
    const size_t bytes = (size * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
    T* fresh = static_cast<T*>(std::aligned_alloc(kAlignment, bytes));
    TORCH_CHECK(fresh != nullptr, "verify_ops: cannot allocate ", bytes,
                " bytes of CPU kernel scratch");
    std::memset(fresh, 0, bytes);
    data_.reset(fresh);
    size_ = size;
  }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data_;
  int64_t size_ = 0;
};

}  // namespace verify_ops::cpu
