// Error checks for CUDA and NCCL calls: throw with the call, the error text, file and line. Never exit.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "core/common.h"

#define RR_CUDA_CHECK(call)                                                                            \
  do {                                                                                                 \
    const cudaError_t rr_status = (call);                                                              \
    if (rr_status != cudaSuccess) {                                                                    \
      throw std::runtime_error(::ringreduce::detail::concat("ringreduce: ", #call, " failed: ",        \
                                                            cudaGetErrorString(rr_status), " (", __FILE__, \
                                                            ":", __LINE__, ")"));                      \
    }                                                                                                  \
  } while (0)

namespace ringreduce {
namespace cuda {

// Makes `device` current for a scope and restores the caller's device after, so that the engine
// never changes which GPU a user's thread is on.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    RR_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) RR_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace cuda
}  // namespace ringreduce
