// The `nccl` backend (CUDA builds only): one rank per GPU, buffers in device
// memory. The NCCL unique id travels through the Store; the communicator is
// non-blocking (config.blocking = 0) and every wait polls
// ncclCommGetAsyncError and its own stream against the op's deadline and the
// abort flag, calling ncclCommAbort on either.
//
// Point-to-point: NCCL carries no tags; messages between two ranks match in
// posting order, and the tag is checked only by the CPU backends.
#pragma once

#include <memory>

#include "comm/communicator.hpp"

namespace troupe::comm {

std::unique_ptr<Communicator> make_nccl_communicator(const CommConfig& cfg);

// CUDA devices visible to this process; 0 when there is no device or driver.
int nccl_device_count();

}  // namespace troupe::comm
