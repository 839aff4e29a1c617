// A probe for the tests: the Watchdog driven by a fake completion source from Python, so its
// timing, ordering and abort rules are checked on machines without a GPU.
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

// Adds WatchdogProbe to `module` (_C._testing).
void bind_watchdog_probe(pybind11::module_& module);

}  // namespace ringreduce
