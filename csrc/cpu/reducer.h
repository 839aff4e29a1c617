// Host reduction loops for every dtype and op.
#pragma once

#include <memory>

#include "core/reducer.h"

namespace ringreduce {

// Throws std::invalid_argument for AVG on an integer dtype (torch refuses it too).
std::unique_ptr<Reducer> make_cpu_reducer(DType dtype, ReduceOp op, int world);

}  // namespace ringreduce
