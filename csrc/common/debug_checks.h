// VERIFY_OPS_DEBUG=1 turns on the checks of index values (slots inside the
// pool, request rows in range), which read tensors and so synchronize with
// the device; the CUDA kernels run them only then, the CPU kernels always.
#pragma once

namespace verify_ops {

bool debug_checks_enabled();

}  // namespace verify_ops
