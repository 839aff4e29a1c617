// The device side of the call check: each rank sends its header to the next rank through NCCL
// before the data, a one-thread kernel compares the previous rank's with its own, and a
// disagreement is reported through mapped host memory, which the watchdog reads. When every
// neighbour agrees, all ranks agree. The host never waits for the GPU.
#pragma once

#include <cuda_runtime_api.h>

#include "core/header.h"

namespace ringreduce {
namespace cuda {

// Lives in mapped (pinned, device-visible) host memory. The kernel fills the pair, then sets the flag.
struct MismatchReport {
  volatile int flag;  // 0 until a disagreement is found
  CollectiveHeader mine;
  CollectiveHeader theirs;  // the previous rank's
};

// The two device slots of the exchange: this rank's header, and the previous rank's as received.
struct HeaderSlots {
  CollectiveHeader mine;
  CollectiveHeader theirs;
};

// slots->mine = header, in stream order (the header rides in the kernel's arguments).
cudaError_t launch_write_header(HeaderSlots* slots, const CollectiveHeader& header, cudaStream_t stream);

// Compares the two slots and fills `report` (a device pointer to mapped memory) when they differ.
cudaError_t launch_compare_headers(const HeaderSlots* slots, MismatchReport* report, cudaStream_t stream);

}  // namespace cuda
}  // namespace ringreduce
