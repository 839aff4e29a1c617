// A probe for the tests: the IssueWindow the nccl transport keeps, driven on the CPU by a script of
// operations and a fake device that passes each marker only after the host has paused a while.
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

// Adds issue_window_run to `module` (_C._testing).
void bind_issue_window_probe(pybind11::module_& module);

}  // namespace ringreduce
