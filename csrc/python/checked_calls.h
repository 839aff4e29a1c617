// The drop-in all_reduce's fast path: calls whose arguments passed every check once are run again
// straight from their Python arguments, without the checks, the group lookup or a Python key.
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

// Adds _C.CheckedCalls to `module`.
void bind_checked_calls(pybind11::module_& module);

}  // namespace ringreduce
