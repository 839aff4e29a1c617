// A probe for the tests: the IssueWindow the nccl transport keeps, driven on the CPU by a script of
// operations and a fake device that passes each marker only after the host has paused a while.
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

// Adds _C.issue_window_run to `module`.
void bind_issue_window_probe(pybind11::module_& module);

}  // namespace ringreduce
