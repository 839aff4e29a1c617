#include "testing/watchdog_probe.h"

#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "transports/watchdog.h"

namespace py = pybind11;

namespace ringreduce {
namespace {

// What the fake source reports, set from Python.
struct FakeState {
  std::mutex mutex;
  std::uint64_t marked = 0;   // markers handed out
  std::uint64_t reached = 0;  // markers below this have "finished"
  std::optional<AbortNotice> failure;
  int aborts = 0;
};

class FakeCompletion final : public CompletionSource {
 public:
  explicit FakeCompletion(std::shared_ptr<FakeState> state) : state_(std::move(state)) {}
  std::shared_ptr<void> mark() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return std::make_shared<std::uint64_t>(state_->marked++);
  }
  bool reached(const std::shared_ptr<void>& marker) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return *static_cast<const std::uint64_t*>(marker.get()) < state_->reached;
  }
  std::optional<AbortNotice> failure() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->failure;
  }
  AbortNotice abort(const AbortNotice& notice) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    ++state_->aborts;
    return notice;
  }

 private:
  std::shared_ptr<FakeState> state_;
};

AbortNotice::Kind kind_named(const std::string& kind) {
  if (kind == "mismatch") return AbortNotice::Kind::Mismatch;
  if (kind == "timeout") return AbortNotice::Kind::Timeout;
  if (kind == "failure") return AbortNotice::Kind::Failure;
  throw py::value_error("kind must be 'mismatch', 'timeout' or 'failure'");
}

class WatchdogProbe {
 public:
  explicit WatchdogProbe(double timeout_s)
      : state_(std::make_shared<FakeState>()),
        watchdog_(std::make_unique<FakeCompletion>(state_),
                  std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000))) {}

  Watchdog& watchdog() { return watchdog_; }
  void complete(std::uint64_t markers) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->reached = markers;
  }
  void report(const std::string& kind, const std::string& message) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->failure = AbortNotice{kind_named(kind), message};
  }
  int aborts() {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->aborts;
  }

 private:
  std::shared_ptr<FakeState> state_;
  Watchdog watchdog_;
};

}  // namespace

void bind_watchdog_probe(py::module_& module) {
  py::class_<WatchdogProbe>(module, "WatchdogProbe",
                            "A Watchdog over a fake completion source: markers finish when complete(n) says so.")
      .def(py::init<double>(), py::arg("timeout_s"))
      .def("begin", [](WatchdogProbe& p, std::uint64_t sequence, std::string what) {
        p.watchdog().begin(sequence, std::move(what));
      })
      .def("end", [](WatchdogProbe& p, std::uint64_t sequence) { p.watchdog().end(sequence); })
      .def("complete", &WatchdogProbe::complete, py::arg("markers"), "Markers below `markers` have finished.")
      .def("report", &WatchdogProbe::report, py::arg("kind"), py::arg("message"),
           "The source reports a failure on its next poll.")
      .def("check", [](WatchdogProbe& p) { p.watchdog().check(); })
      .def("abort", [](WatchdogProbe& p, const std::string& message) {
        return p.watchdog().abort({AbortNotice::Kind::Failure, message}).message;
      })
      .def("drain", [](WatchdogProbe& p) { return p.watchdog().drain(); }, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("aborts", &WatchdogProbe::aborts)
      .def_property_readonly("in_flight", [](WatchdogProbe& p) { return p.watchdog().in_flight(); });
}

}  // namespace ringreduce
