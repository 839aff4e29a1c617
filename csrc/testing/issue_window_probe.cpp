#include "testing/issue_window_probe.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <vector>

#include "core/common.h"
#include "transports/issue_window.h"

namespace py = pybind11;

namespace ringreduce {

void bind_issue_window_probe(py::module_& m) {
  m.def(
      "issue_window_run",
      [](std::size_t capacity, const std::vector<std::size_t>& script, int pauses_per_marker) {
        // The fake device passes markers in order, one per `pauses_per_marker` pauses of the host.
        // With 0, it passes none, and the host gives up after kStalledPauses, as the watchdog would.
        constexpr int kStalledPauses = 1000;
        std::size_t markers = 0, passed = 0, most = 0;
        int pauses = 0, total_pauses = 0;
        IssueWindow window(
            capacity,
            [&](const std::shared_ptr<void>& marker) { return *static_cast<std::size_t*>(marker.get()) < passed; },
            [&] {
              ++total_pauses;
              if (pauses_per_marker == 0 && total_pauses == kStalledPauses) {
                throw std::runtime_error(detail::concat("stalled with ", most, " operations in flight"));
              }
              if (++pauses == pauses_per_marker) {
                pauses = 0;
                passed = std::min(passed + 1, markers);
              }
            });
        for (std::size_t ops : script) {
          if (ops == 0) {
            window.mark(std::make_shared<std::size_t>(markers++));
            continue;
          }
          window.make_room(ops);
          window.queued(ops);
          most = std::max(most, window.in_flight());
        }
        return py::make_tuple(most, total_pauses);
      },
      py::arg("capacity"), py::arg("script"), py::arg("pauses_per_marker"),
      "Runs `script` (n > 0: queue n operations; 0: a marker) through an IssueWindow of `capacity` "
      "against a device that passes a marker every `pauses_per_marker` pauses (0: never; then it raises "
      "RuntimeError after 1000 pauses). Returns (the most operations in flight, the pauses).");
}

}  // namespace ringreduce
