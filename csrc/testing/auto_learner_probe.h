// A probe for the tests: auto's learner fed with made-up times, so its decisions can be checked
// without depending on this machine's speed.
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

// Adds AutoLearnerProbe to `module` (_C._testing).
void bind_auto_learner_probe(pybind11::module_& module);

}  // namespace ringreduce
