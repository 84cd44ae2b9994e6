// VERIFY_CHECK: TORCH_CHECK whose message turns numbers and shapes into text
// with std::to_string instead of iostreams. The H200 build box's toolchain
// (/opt/gcc) links a private static libstdc++ into extensions, and its stream
// number formatting segfaults there (seen 2026-11-30: c10::str of an int64_t
// crashed inside std::ostream::_M_insert<long>); strings stream fine.
#pragma once

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <string>
#include <type_traits>

namespace verify_ops {

template <typename T>
auto message_part(const T& value) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    return std::to_string(value);
  } else if constexpr (std::is_same_v<T, c10::IntArrayRef>) {
    std::string text = "[";
    for (size_t i = 0; i < value.size(); ++i)
      text += (i ? ", " : "") + std::to_string(value[i]);
    return text + "]";
  } else {
    return value;  // strings, dtypes and devices print without number formatting
  }
}

template <typename... Args>
std::string check_message(const Args&... args) {
  return c10::str(message_part(args)...);
}

}  // namespace verify_ops

#define VERIFY_CHECK(cond, ...) TORCH_CHECK((cond), ::verify_ops::check_message(__VA_ARGS__))

namespace verify_ops {

// An index range [lo, hi] (slots, request rows) that must lie in [0, bound).
inline void check_in_range(const char* op, const char* what, int64_t lo, int64_t hi,
                           int64_t bound, const char* bound_name) {
  VERIFY_CHECK(lo >= 0 && hi < bound, op, ": ", what, " must lie in [0, ", bound, ") (",
              bound_name, "), got values in [", lo, ", ", hi, "]");
}

}  // namespace verify_ops
