// Pinned host memory that kernels write and the host reads without a copy (cudaHostAllocMapped):
// the mismatch report, and the flag a test kernel waits on.
#pragma once

#include "cuda/cuda_check.h"

namespace ringreduce {
namespace cuda {

template <typename T>
struct Mapped {
  T* host = nullptr;    // free with DeviceApi::free_mapped, which waits for the GPU: the owner decides when
  T* device = nullptr;  // the same bytes, as kernels address them
};

// One zeroed T in mapped memory.
template <typename T>
Mapped<T> allocate_mapped(DeviceApi& api) {
  void* host = nullptr;
  void* device = nullptr;
  RR_CUDA_CHECK(api.allocate_mapped(sizeof(T), &host, &device));
  return {static_cast<T*>(host), static_cast<T*>(device)};
}

}  // namespace cuda
}  // namespace ringreduce
