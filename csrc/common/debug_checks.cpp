#include "common/debug_checks.h"

#include <cstdlib>
#include <cstring>

namespace verify_ops {

bool debug_checks_enabled() {
  const char* v = std::getenv("VERIFY_OPS_DEBUG");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace verify_ops
