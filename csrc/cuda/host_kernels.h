// The reduction kernel's body run on the CPU over a simulated grid, for the tests: the same code
// the GPU runs (reduce_body.cuh), compiled for the host.
#pragma once

#include <cstddef>

#include "core/common.h"

namespace ringreduce {
namespace cuda {

// As launch_reduce(), on host memory, running threads 0 .. blocks * threads_per_block - 1 of the
// grid one after another. Throws std::invalid_argument for AVG on integers or an empty grid.
void host_reduce(DType dtype, ReduceOp op, void* dst, const void* src, void* copy, std::size_t count, int world,
                 bool last, std::size_t blocks, std::size_t threads_per_block);

// As launch_scale(), on host memory, over a simulated grid.
void host_scale(DType dtype, void* data, std::size_t count, float factor, std::size_t blocks,
                std::size_t threads_per_block);

}  // namespace cuda
}  // namespace ringreduce
