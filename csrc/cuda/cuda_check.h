// Error checks for calls through the device seam: throw with the call, the error text, file and
// line. Never exit.
#pragma once

#include <stdexcept>
#include <string>

#include "core/common.h"
#include "cuda/device_api.h"

#define RR_CUDA_CHECK(call)                                                                            \
  do {                                                                                                 \
    const ::ringreduce::cuda::Failure rr_failure = (call);                                             \
    if (rr_failure != nullptr) {                                                                       \
      throw std::runtime_error(::ringreduce::detail::concat("ringreduce: ", #call, " failed: ", rr_failure, \
                                                            " (", __FILE__, ":", __LINE__, ")"));      \
    }                                                                                                  \
  } while (0)

namespace ringreduce {
namespace cuda {

// Makes `device` current for a scope and restores the caller's device after, so that the engine
// never changes which GPU a user's thread is on.
class DeviceScope {
 public:
  DeviceScope(DeviceApi& api, int device) : api_(api) {
    RR_CUDA_CHECK(api.get_device(&previous_));
    if (previous_ != device) RR_CUDA_CHECK(api.set_device(device));
  }
  ~DeviceScope() { api_.set_device(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  DeviceApi& api_;
  int previous_ = 0;
};

}  // namespace cuda
}  // namespace ringreduce
