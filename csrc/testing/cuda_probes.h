// Probes for the tests and benchmarks/kernel_bench.py: the CUDA kernels, the device header check,
// one-GPU NCCL transfers and the watchdog on a stalled stream, each on its own.
#pragma once

#include <pybind11/pybind11.h>

namespace ringreduce {

// Adds the probes to `module` in a CUDA build; nothing otherwise.
void bind_cuda_probes(pybind11::module_& module);

}  // namespace ringreduce
