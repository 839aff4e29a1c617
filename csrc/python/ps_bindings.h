// The parameter server's Python face (ringreduce/ps.py wraps it): its links, the server and the
// remote worker.
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

void bind_parameter_server(pybind11::module_& module);

}  // namespace ringreduce
