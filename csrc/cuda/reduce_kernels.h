// Host entry point of the reduction kernels (reduce_kernels.cu). No torch, no CUDA types beyond the
// stream handle, so the torch glue and the transports can include it cheaply.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "core/common.h"

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

}  // namespace cuda
}  // namespace ringreduce
