#include "testing/auto_learner_probe.h"

#include <pybind11/stl.h>

#include <string>
#include <tuple>
#include <vector>

#include "core/common.h"
#include "engine/auto_choice.h"

namespace py = pybind11;

namespace ringreduce {

void bind_auto_learner_probe(py::module_& m) {
  py::class_<AutoLearner>(m, "AutoLearnerProbe",
                          "auto's learner on its own: pick() says what the next call of `bytes` would run; "
                          "time() hands it that call's time (in place of the group's) and decides at the end of a round.")
      .def(py::init<std::string, int, bool>(), py::arg("transport"), py::arg("world"), py::arg("host_memory"))
      .def(py::init<std::string, int, bool, bool, bool, std::vector<int>>(), py::arg("transport"), py::arg("world"),
           py::arg("host_memory"), py::arg("hierarchy"), py::arg("spans_hosts"), py::arg("host_of_rank"),
           "A learner of a group across hosts: rank r on host host_of_rank[r].")
      .def("pick",
           [](AutoLearner& learner, std::uint64_t bytes) {
             const AutoLearner::Pick pick = learner.pick(bytes);
             return std::make_tuple(std::string(algorithm_name(pick.algorithm)), pick.exploring);
           },
           py::arg("bytes"))
      .def("rates",
           [](const AutoLearner& learner) {
             const CostRates& r = learner.rates();
             return std::make_tuple(r.link_latency_s, r.link_s_per_byte, r.local_latency_s, r.local_s_per_byte,
                                    r.reduce_s_per_byte);
           },
           "the rates new size classes are priced at: link round, link s/B, shared-memory step, its s/B, reduced s/B")
      .def("time",
           [](AutoLearner& learner, std::uint64_t bytes, std::int64_t nanoseconds) {
             if (learner.record(bytes, nanoseconds)) learner.decide(bytes);
           },
           py::arg("bytes"), py::arg("nanoseconds"));
}

}  // namespace ringreduce
