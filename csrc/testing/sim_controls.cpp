#include "testing/sim_controls.h"

#if defined(RINGREDUCE_WITH_SIM)

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "core/common.h"
#include "cuda/sim_device.h"
#include "python/calls.h"
#endif

namespace py = pybind11;

namespace ringreduce {
#if defined(RINGREDUCE_WITH_SIM)
namespace {

cuda::SimFault fault_named(const std::string& name) {
  static const std::map<std::string, cuda::SimFault> faults = {{"stall", cuda::SimFault::Stall},
                                                               {"silent_send", cuda::SimFault::SilentSend},
                                                               {"exit", cuda::SimFault::Exit},
                                                               {"async_error", cuda::SimFault::AsyncError}};
  auto found = faults.find(name);
  if (found == faults.end()) {
    throw py::value_error(detail::concat("unknown simulated fault '", name, "'; known: stall, silent_send, exit, async_error"));
  }
  return found->second;
}

}  // namespace

void bind_sim_controls(py::module_& m) {
  m.def(
      "sim_configure",
      [](std::uint64_t seed, double max_delay_us) {
        cuda::configure_sim(seed, std::chrono::microseconds(static_cast<std::int64_t>(max_delay_us)));
      },
      py::arg("seed"), py::arg("max_delay_us"),
      "Seeds the simulated device's random delays (at most max_delay_us before a stream operation; 0: none).");
  m.def(
      "sim_inject",
      [](int device, const std::string& fault, std::size_t after, double seconds) {
        cuda::inject_sim_fault(device, fault_named(fault), after,
                               std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0)));
      },
      py::arg("device"), py::arg("fault"), py::arg("after") = 0, py::arg("seconds") = 0.0,
      "Arms a fault on simulated GPU `device`: 'stall' (a kernel stops for `seconds`), 'silent_send' (no send is "
      "posted from an NCCL group on), 'exit' or 'async_error' (an NCCL group's). It strikes the `after`-th such "
      "operation queued from now, once.");
  m.def("sim_clear", &cuda::clear_sim_faults,
        "Disarms every fault, forgets the simulated GPUs' errors and the most operations queued.");
  m.def("sim_stream_threads", &cuda::sim_stream_threads, "Threads the simulated device runs, one per stream made.");
  m.def("sim_busy_streams", &cuda::sim_busy_streams, "Simulated streams that hold work now.");
  m.def("sim_kept_calls", &calls_kept_for_the_device,
        "Failed calls whose tensors are still kept for work queued on the simulated device.");
  m.def("sim_most_queued", &cuda::sim_most_queued,
        "The most operations one simulated stream has held at once since sim_clear().");
}
#else
void bind_sim_controls(py::module_&) {}
#endif

}  // namespace ringreduce
