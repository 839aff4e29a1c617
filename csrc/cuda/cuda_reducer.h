// The Reducer contract on a GPU: each call launches the reduction kernel on the queue's selected
// lane, behind the transfer that brought its input.
#pragma once

#include <memory>

#include "core/reducer.h"
#include "cuda/device_queue.h"

namespace ringreduce {
namespace cuda {

// Throws std::invalid_argument for AVG on an integer dtype, as the host reducer does.
std::unique_ptr<Reducer> make_cuda_reducer(DType dtype, ReduceOp op, int world, const DeviceQueue& queue);

}  // namespace cuda
}  // namespace ringreduce
