// Probes for the tests: how long the shm transport's waits yield, for yields of given lengths
// (YieldPhase alone) and inside two shm ranks that are threads of this process.
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

// Adds yield_phase_length and shm_idle_yield_per_wait to `module` (_C._testing).
void bind_shm_wait_probe(pybind11::module_& module);

}  // namespace ringreduce
