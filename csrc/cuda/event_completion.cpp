#include "cuda/event_completion.h"

namespace ringreduce {
namespace cuda {

void EventCompletion::attach() {
  cudaSetDevice(queue_.device());
  cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&relaxed);
}

std::shared_ptr<void> EventCompletion::mark() { return queue_.events().record(queue_.lane_stream(0)); }

bool EventCompletion::reached(const std::shared_ptr<void>& marker) {
  const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(marker.get()));
  if (state == cudaSuccess) return true;
  if (state != cudaErrorNotReady) device_error_ = state;
  return false;
}

std::optional<AbortNotice> EventCompletion::failure() {
  if (device_error_ == cudaSuccess) return std::nullopt;
  return AbortNotice{AbortNotice::Kind::Failure,
                     detail::concat("ringreduce: ", who_, ": the GPU reported ", cudaGetErrorString(device_error_),
                                    " while running a collective")};
}

}  // namespace cuda
}  // namespace ringreduce
