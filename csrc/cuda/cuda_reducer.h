// The Reducer contract on a GPU: each call launches the reduction kernel on the queue's stream.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>

#include "../reducer.h"

namespace ringreduce {
namespace cuda {

// Throws std::invalid_argument for AVG on an integer dtype, as the host reducer does.
std::unique_ptr<Reducer> make_cuda_reducer(DType dtype, ReduceOp op, int world, cudaStream_t stream);

}  // namespace cuda
}  // namespace ringreduce
