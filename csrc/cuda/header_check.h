// The device side of the call check: each rank sends its header to the next rank through NCCL
// before the data, a one-thread kernel compares the previous rank's with its own, and a
// disagreement is reported through mapped host memory (MismatchReport), which the watchdog reads.
// When every neighbour agrees, all ranks agree. The host never waits for the GPU.
#pragma once

#include "core/host_device.h"
#include "cuda/device_api.h"

namespace ringreduce {
namespace cuda {

// The compare kernel's body, for the GPU (header_check.cu) and the simulated device alike: fills
// the report's pair when the slots differ and no disagreement was reported yet. Returns whether it
// did; the caller then makes the pair visible to the host before it sets the flag.
RR_HOST_DEVICE bool fill_mismatch_report(const HeaderSlots* slots, MismatchReport* report) {
  if (slots->mine == slots->theirs || report->flag != 0) return false;
  report->mine = slots->mine;
  report->theirs = slots->theirs;
  return true;
}

}  // namespace cuda
}  // namespace ringreduce
