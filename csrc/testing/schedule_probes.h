// Probes for the tests: the pure schedule functions, the exchange groups traced through the real
// algorithms, and the trace file's time format, as Python lists and strings.
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

// Adds ring_schedule, doubling_schedule, central_schedule, exchange_groups and trace_microseconds to `module`.
void bind_schedule_probes(pybind11::module_& module);

}  // namespace ringreduce
