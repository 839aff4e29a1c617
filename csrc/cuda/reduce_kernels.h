// Host entry points of the kernels (reduce_kernels.cu, header_check.cu, wait_for_flag.cu), for
// the real device (real_api.cpp) and the kernel probes. No torch, no CUDA types beyond the stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/common.h"
#include "cuda/device_api.h"

namespace ringreduce {
namespace cuda {

// dst[i] = dst[i] op src[i] for i < count on `stream`, also writing the result to `copy` when it is
// not null (the fused reduce-and-copy). With `last`, AVG divides by `world`. Pointers may have any
// alignment: 16-byte-aligned ones take the vectorised path.
cudaError_t launch_reduce(DType dtype, ReduceOp op, void* dst, const void* src, void* copy, std::size_t count,
                          int world, bool last, cudaStream_t stream);

// data[i] = data[i] * factor on `stream`, rounded once: AVG's pre-multiply, for float16 and
// bfloat16 (cudaErrorInvalidValue for other dtypes).
cudaError_t launch_scale(DType dtype, void* data, std::size_t count, float factor, cudaStream_t stream);

// slots->mine = header, in stream order (the header rides in the kernel's arguments).
cudaError_t launch_write_header(HeaderSlots* slots, const CollectiveHeader& header, cudaStream_t stream);

// Compares the two slots and fills `report` (a device pointer to mapped memory) when they differ.
cudaError_t launch_compare_headers(const HeaderSlots* slots, MismatchReport* report, cudaStream_t stream);

// Waits on the device until *flag (mapped host memory) is non-zero.
cudaError_t launch_wait_for_flag(const volatile int* flag, cudaStream_t stream);

}  // namespace cuda
}  // namespace ringreduce
