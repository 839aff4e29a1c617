// An instrument for the tests and the benchmarks: a torch.distributed store that forwards every
// call to another and counts them, one per request the store serves (a multi_get is one), so
// what a group asks of its store (set-up, membership) can be counted exactly, per rank.
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

// Adds CountingStore to `module` (_C._testing).
void bind_counting_store(pybind11::module_& module);

}  // namespace ringreduce
