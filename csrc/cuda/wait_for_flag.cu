#include "cuda/reduce_kernels.h"

namespace ringreduce {
namespace cuda {
namespace {

__global__ void wait_for_flag_kernel(const volatile int* flag) {
  while (*flag == 0) {
    __nanosleep(1000);
  }
}

}  // namespace

cudaError_t launch_wait_for_flag(const volatile int* flag, cudaStream_t stream) {
  wait_for_flag_kernel<<<1, 1, 0, stream>>>(flag);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace ringreduce
