#include "cuda/device_memory.h"

#include "cuda/cuda_check.h"

namespace ringreduce {
namespace cuda {

void DeviceMemory::copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes > 0) RR_CUDA_CHECK(queue_.api().copy(dst, src, bytes, queue_.cuda_stream()));
}

}  // namespace cuda
}  // namespace ringreduce
