#include "testing/schedule_probes.h"

#include <pybind11/stl.h>

#include <cstddef>
#include <string>
#include <vector>

#include "algorithms/schedule.h"
#include "core/trace.h"
#include "testing/exchange_trace.h"

namespace py = pybind11;

namespace ringreduce {
namespace {

// The schedule of one rank: `phases` "all_reduce", or "reduce_scatter" / "all_gather" over `world`
// chunks of numel / world.
py::list ring_schedule_py(std::size_t numel, std::size_t elem_size, int world, int rank, std::size_t segment_bytes,
                          std::size_t lanes, const std::string& phases) {
  std::vector<RingTransfer> transfers;
  if (phases == "all_reduce") {
    transfers = ring_schedule(numel, elem_size, world, rank, segment_bytes, lanes);
  } else if ((phases == "reduce_scatter" || phases == "all_gather") && world > 0 && numel % world == 0) {
    transfers = ring_schedule(chunk_layout(numel / world, elem_size, world, segment_bytes), world, rank, lanes,
                              phases == "reduce_scatter" ? RingPhases::ReduceScatter : RingPhases::AllGather);
  } else {
    throw py::value_error("phases must be all_reduce, or reduce_scatter or all_gather of world chunks");
  }
  py::list out;
  for (const RingTransfer& t : transfers) {
    out.append(py::make_tuple(t.send.offset, t.send.count, t.recv.offset, t.recv.count, t.reduce, t.last, t.send_own,
                              t.forward, t.lane));
  }
  return out;
}

py::list exchange_groups_py(std::size_t numel, int world, int rank, std::size_t segment_bytes, std::size_t lanes,
                            const std::string& algorithm) {
  if (algorithm != "ring" && algorithm != "central") throw py::value_error("algorithm must be 'ring' or 'central'");
  py::list out;
  for (const auto& group : trace_exchange_groups(numel, world, rank, segment_bytes, lanes, algorithm == "ring")) {
    py::list transfers;
    for (const TracedTransfer& t : group) transfers.append(py::make_tuple(t.is_send, t.peer, t.bytes));
    out.append(transfers);
  }
  return out;
}

py::list central_schedule_py(std::size_t numel, std::size_t elem_size, std::size_t segment_bytes) {
  py::list out;
  for (const Span& span : central_schedule(numel, elem_size, segment_bytes)) out.append(py::make_tuple(span.offset, span.count));
  return out;
}

// DoublingRole's names, in its order.
const char* const kDoublingRoles[] = {"hand_over", "take_over", "exchange", "hand_back", "take_back"};

py::list doubling_schedule_py(int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world) throw py::value_error("need 0 <= rank < world");
  py::list out;
  for (const DoublingStep& step : doubling_schedule(world, rank)) {
    out.append(py::make_tuple(step.peer, kDoublingRoles[static_cast<int>(step.role)]));
  }
  return out;
}

py::list halving_doubling_schedule_py(std::size_t numel, std::size_t elem_size, int world, int rank) {
  if (world < 1 || rank < 0 || rank >= world) throw py::value_error("need 0 <= rank < world");
  py::list out;
  for (const HalvingStep& step : halving_doubling_schedule(numel, elem_size, world, rank)) {
    out.append(py::make_tuple(step.peer, kDoublingRoles[static_cast<int>(step.role)],
                              py::make_tuple(step.send.offset, step.send.count),
                              py::make_tuple(step.recv.offset, step.recv.count), step.reduce, step.last));
  }
  return out;
}

}  // namespace

void bind_schedule_probes(py::module_& m) {
  m.def("ring_schedule", &ring_schedule_py, py::arg("numel"), py::arg("elem_size"), py::arg("world"), py::arg("rank"),
        py::arg("segment_bytes"), py::arg("lanes") = 1, py::arg("phases") = "all_reduce");
  m.def("exchange_groups", &exchange_groups_py, py::arg("numel"), py::arg("world"), py::arg("rank"),
        py::arg("segment_bytes"), py::arg("lanes"), py::arg("algorithm"),
        "The groups of (is_send, peer, bytes) a transport that groups like nccl hands over, for one float32 call.");
  m.def("doubling_schedule", &doubling_schedule_py, py::arg("world"), py::arg("rank"),
        "One rank's recursive-doubling steps as (peer, role).");
  m.def("halving_doubling_schedule", &halving_doubling_schedule_py, py::arg("numel"), py::arg("elem_size"),
        py::arg("world"), py::arg("rank"),
        "One rank's halving-doubling steps as (peer, role, (send offset, count), (recv offset, count), reduce, last).");
  m.def("central_schedule", &central_schedule_py, py::arg("numel"), py::arg("elem_size"), py::arg("segment_bytes"));
  m.def("trace_microseconds", &trace_microseconds, py::arg("ns"),
        "How a trace file writes `ns` nanoseconds (Chrome's microseconds).");
}

}  // namespace ringreduce
