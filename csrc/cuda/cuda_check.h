// Error checks for CUDA and NCCL calls: throw with the call, the error text, file and line. Never exit.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

#include "../common.h"

#define RR_CUDA_CHECK(call)                                                                            \
  do {                                                                                                 \
    const cudaError_t rr_status = (call);                                                              \
    if (rr_status != cudaSuccess) {                                                                    \
      throw std::runtime_error(::ringreduce::detail::concat("ringreduce: ", #call, " failed: ",        \
                                                            cudaGetErrorString(rr_status), " (", __FILE__, \
                                                            ":", __LINE__, ")"));                      \
    }                                                                                                  \
  } while (0)
