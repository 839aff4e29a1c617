// Pinned host memory that kernels write and the host reads without a copy (cudaHostAllocMapped):
// the mismatch report, and the flag a test kernel waits on.
#pragma once

#include <cuda_runtime_api.h>

#include <cstring>

#include "cuda/cuda_check.h"

namespace ringreduce {
namespace cuda {

template <typename T>
struct Mapped {
  T* host = nullptr;    // free with cudaFreeHost, which waits for the GPU: the owner decides when
  T* device = nullptr;  // the same bytes, as kernels address them
};

// One zeroed T in mapped memory.
template <typename T>
Mapped<T> allocate_mapped() {
  Mapped<T> mapped;
  RR_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&mapped.host), sizeof(T), cudaHostAllocMapped));
  std::memset(static_cast<void*>(mapped.host), 0, sizeof(T));
  const cudaError_t pointed = cudaHostGetDevicePointer(reinterpret_cast<void**>(&mapped.device), mapped.host, 0);
  if (pointed != cudaSuccess) {
    cudaFreeHost(mapped.host);
    RR_CUDA_CHECK(pointed);
  }
  return mapped;
}

}  // namespace cuda
}  // namespace ringreduce
