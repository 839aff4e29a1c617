// The engine's test-only door: probes that drive its parts from Python (the watchdog, the issue
// window, auto's learner, the CUDA kernels on the host, the simulated device's faults, the
// schedules). They live in _C._testing, apart from the product's surface in csrc/python/.
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

// Adds the submodule _testing, with every probe, to `parent`.
void bind_testing(pybind11::module_& parent);

}  // namespace ringreduce
