#include "testing/shm_wait_probe.h"

#include <pybind11/stl.h>

#include <chrono>
#include <exception>
#include <thread>
#include <vector>

#include "core/rendezvous.h"
#include "transports/shm.h"

namespace py = pybind11;

namespace ringreduce {
namespace {

using Micros = std::chrono::duration<double, std::micro>;

// Two shm ranks as threads: rank 1 sleeps each of `delays_us` before sending rank 0 a word; rank 0
// receives each (waiting about that long) and records the time it spent in yields that handed its
// core to no one, in microseconds, under the wait plan RINGREDUCE_WAIT names (unset: the default).
std::vector<double> shm_idle_yield_per_wait(const std::vector<double>& delays_us) {
  constexpr std::chrono::milliseconds kTimeout{10000};
  MemoryRendezvous keys(kTimeout);
  std::vector<double> idle;
  std::exception_ptr failed;
  auto sender = [&] {
    try {
      ShmTransport transport(keys, 1, 2, kTimeout);
      for (double delay : delays_us) {
        std::this_thread::sleep_for(Micros(delay));
        const int word = 1;
        transport.wait(transport.isend(0, &word, sizeof word));
      }
    } catch (...) {
      failed = std::current_exception();
    }
  };
  std::thread other(sender);
  try {
    ShmTransport transport(keys, 0, 2, kTimeout);
    for (std::size_t i = 0; i < delays_us.size(); ++i) {
      int word = 0;
      const auto before = transport.idle_yielded();
      transport.wait(transport.irecv(1, &word, sizeof word));
      idle.push_back(Micros(transport.idle_yielded() - before).count());
    }
  } catch (...) {
    other.join();
    throw;
  }
  other.join();
  if (failed) std::rethrow_exception(failed);
  return idle;
}

}  // namespace

void bind_shm_wait_probe(py::module_& m) {
  m.def(
      "yield_phase_length",
      [](double yield_us, double idle_yield_us, const std::vector<double>& yields_us) {
        const auto ns = [](double us) { return std::chrono::duration_cast<std::chrono::nanoseconds>(Micros(us)); };
        WaitPlan plan{{}, ns(yield_us), ns(idle_yield_us)};
        YieldPhase phase(plan);
        double elapsed = 0;
        for (std::size_t i = 0; i < yields_us.size(); ++i) {
          elapsed += yields_us[i];
          if (!phase.again(ns(yields_us[i]), ns(elapsed))) return i + 1;
        }
        return yields_us.size();
      },
      py::arg("yield_us"), py::arg("idle_yield_us"), py::arg("yields_us"),
      "How many of yields lasting `yields_us` a wait makes before it sleeps, under a plan of `yield_us` of "
      "yielding and `idle_yield_us` of yields that hand the core to no one (all of them when it never stops).");
  m.def("shm_idle_yield_per_wait", &shm_idle_yield_per_wait, py::arg("delays_us"),
        py::call_guard<py::gil_scoped_release>(),
        "Rank 0 of two shm ranks (threads) receives a word after each of `delays_us`; the time (us) it spent in "
        "yields that handed its core to no one, per receive.");
}

}  // namespace ringreduce
