#include "testing/testing.h"

#include "core/kill_points.h"

#include "testing/auto_learner_probe.h"
#include "testing/counting_store.h"
#include "testing/cuda_probes.h"
#include "testing/issue_window_probe.h"
#include "testing/schedule_probes.h"
#include "testing/shm_wait_probe.h"
#include "testing/sim_controls.h"
#include "testing/watchdog_probe.h"

namespace ringreduce {

void bind_testing(pybind11::module_& parent) {
  pybind11::module_ testing = parent.def_submodule("_testing", "Test-only probes of the engine's parts (csrc/testing/).");
  bind_watchdog_probe(testing);
  bind_issue_window_probe(testing);
  bind_cuda_probes(testing);
  bind_sim_controls(testing);
  bind_auto_learner_probe(testing);
  bind_schedule_probes(testing);
  bind_counting_store(testing);
  bind_shm_wait_probe(testing);
  testing.def(
      "arm_ring_all_gather_kill",
      [](int skip) { arm_kill_point(KillPoint::RingAllGather, skip); }, pybind11::arg("skip") = 0,
      "This process SIGKILLs itself in its (skip + 1)-th ring all-reduce from now on, once it has passed its reduced "
      "chunk on and before the all-gather (core/kill_points.h).");
}

}  // namespace ringreduce
