// The simulated device's controls for the tests: its timing, the faults it injects, its threads.
// Nothing in a build without the simulated device (setup.py says when).
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

void bind_sim_controls(pybind11::module_& module);

}  // namespace ringreduce
