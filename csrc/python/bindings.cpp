// Python bindings: tensor checks, the job that runs an all-reduce, and the group factories.
#include <torch/extension.h>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <memory>

#include "algorithms/schedule.h"
#include "cpu/reducer.h"
#include "engine/communicator.h"
#include "python/cuda_probes.h"
#include "python/exchange_trace.h"
#include "python/glue.h"
#include "python/watchdog_probe.h"
#include "transports/local.h"
#include "transports/pg.h"
#include "transports/shm.h"

#if defined(RINGREDUCE_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "cuda/cuda_reducer.h"
#include "cuda/device_memory.h"
#include "cuda/device_queue.h"
#include "cuda/nccl_transport.h"
#endif

namespace py = pybind11;

namespace ringreduce {
namespace {

// Deletes a communicator without the GIL: its worker may be finishing a job whose completion
// runs Python callbacks.
void delete_without_gil(Communicator* communicator) {
  if (PyGILState_Check()) {
    py::gil_scoped_release release;
    delete communicator;
  } else {
    delete communicator;
  }
}

std::shared_ptr<Communicator> make_communicator(std::unique_ptr<Transport> transport,
                                               Communicator::ReducerFactory make_reducer = &make_cpu_reducer,
                                               std::unique_ptr<StreamContext> stream = nullptr) {
  return std::shared_ptr<Communicator>(new Communicator(std::move(transport), std::move(make_reducer), std::move(stream)),
                                       &delete_without_gil);
}

// Orders a call on a CUDA tensor against the caller's stream, as torch's NCCL backend does: the
// collective starts after what the caller queued before it, and the caller's later work waits
// for its result; both through events, never by blocking the host. For host tensors it does nothing.
class StreamJoin {
 public:
  // `touched`: every tensor the collective reads or writes, the caller's first.
  StreamJoin(StreamContext* engine, const std::vector<at::Tensor>& touched) : engine_(engine) {
    for (const at::Tensor& tensor : touched) {
      if (tensor.is_cuda() != (engine != nullptr)) {
        throw py::value_error(detail::concat("ringreduce: this communicator serves ", engine ? "cuda" : "cpu",
                                             " tensors, got a tensor on ", tensor.device(),
                                             "; pass transport=None to choose one that serves it"));
      }
    }
#if defined(RINGREDUCE_WITH_CUDA)
    if (engine == nullptr) return;
    device_ = touched.front().device();
    const c10::cuda::CUDAGuard on_device(device_);  // the event is made on the tensor's GPU
    caller_ = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    start_ = engine->mark(caller_);
    // The caching allocator must not hand these blocks out again before the engine's stream is done.
    const auto engine_stream = c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(engine->stream()), device_.index());
    for (const at::Tensor& tensor : touched) {
      c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), engine_stream);
    }
#endif
  }

  // Inside the job, before any engine work: wait for the caller's stream as it was at the call.
  void begin() const {
    if (engine_ != nullptr) engine_->wait(start_);
  }

  // After a blocking call: the caller's stream waits for the engine's.
  void release() const {
    if (engine_ != nullptr) on_engine_stream([&] { engine_->release_to(caller_); });
  }

  // Runs `work` with the tensor's GPU and the engine's stream current (on whichever thread runs
  // it), so torch work it launches (the write-back of a non-contiguous tensor, the events a CUDA
  // future records) is ordered after the collective.
  template <typename F>
  void on_engine_stream(F&& work) const {
#if defined(RINGREDUCE_WITH_CUDA)
    if (engine_ != nullptr) {
      c10::cuda::CUDAStreamGuard guard(
          c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(engine_->stream()), device_.index()));
      work();
      return;
    }
#endif
    work();
  }

  std::vector<c10::Device> devices() const {
    return engine_ != nullptr ? std::vector<c10::Device>{device_} : std::vector<c10::Device>{};
  }

 private:
  StreamContext* engine_;
  c10::Device device_{c10::kCPU};
  void* caller_ = nullptr;
  std::shared_ptr<void> start_;
};

// The handle of an async call. c10d's own future-wrapping Work only waits; this one also raises the
// collective's error from wait(), as a torch.distributed Work does.
class CollectiveWork final : public c10d::Work {
 public:
  explicit CollectiveWork(c10::intrusive_ptr<c10::ivalue::Future> future) : future_(std::move(future)) {}

  bool isCompleted() override { return future_->completed(); }
  bool isSuccess() const override { return future_->hasValue(); }
  std::exception_ptr exception() const override { return future_->exception_ptr(); }
  std::vector<at::Tensor> result() override { return future_->value().toTensorVector(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Blocks until the collective has been queued (CPU: done), makes the current CUDA streams wait
  // for its result, and rethrows its error.
  bool wait(std::chrono::milliseconds timeout) override {
    TORCH_CHECK(timeout == ::kNoTimeout, "ringreduce: Work.wait() takes no timeout; the group's timeout applies");
    future_->waitAndThrow();
    return true;
  }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// One call as its job runs it: copy `stage_from` into `stage_into` (an input into the working
// buffer), run the collective on the buffer, then copy `result_from` into `result` (the output,
// when the buffer stands in for it). An undefined tensor skips its copy. `result` is what the
// future holds.
struct Call {
  CollectiveArgs args;
  at::Tensor stage_from, stage_into;
  at::Tensor result_from, result;
};

void run_call(Communicator& communicator, const StreamJoin& join, const Call& call) {
  at::NoGradGuard no_grad;
  join.on_engine_stream([&] {
    join.begin();
    if (call.stage_into.defined()) call.stage_into.copy_(call.stage_from);
    communicator.run(call.args);
    if (call.result_from.defined()) call.result.copy_(call.result_from);
  });
}

// Runs the call now (blocking) or on the communicator's worker (async_op), as torch.distributed
// does: an async call returns a Work whose future holds [call.result].
py::object submit(Communicator& communicator, Call call, bool async_op) {
  std::vector<at::Tensor> touched{call.result};
  for (const at::Tensor& t : {call.stage_from, call.stage_into, call.result_from}) {
    if (t.defined()) touched.push_back(t);
  }
  const StreamJoin join(communicator.stream_context(), touched);
  call.args.segment_bytes = resolve_segment_bytes(call.args.segment_bytes);
  if (!async_op) {
    py::gil_scoped_release release;
    communicator.executor().run([&] { run_call(communicator, join, call); });
    join.release();
    return py::none();
  }
  Communicator* comm = &communicator;  // outlives its jobs: its executor drains before it dies
  auto future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), join.devices());
  const at::Tensor result = call.result;
  comm->executor().submit([comm, join, call] { run_call(*comm, join, call); },
                          [future, join, result](std::exception_ptr error) {
                            if (error) {
                              future->setError(error);
                            } else {
                              // A CUDA future records its events on the current stream: the
                              // engine's, where the result is.
                              join.on_engine_stream(
                                  [&] { future->markCompleted(c10::IValue(std::vector<at::Tensor>{result})); });
                            }
                          });
  return py::cast(c10::intrusive_ptr<c10d::Work>(c10::make_intrusive<CollectiveWork>(future)));
}

// A contiguous tensor that stands in for `tensor` (itself when it is contiguous already).
at::Tensor contiguous_stand_in(const at::Tensor& tensor) { return tensor.is_contiguous() ? tensor : tensor.contiguous(); }

ReduceOp checked_op(int op_code) {
  if (op_code < 0 || op_code >= kReduceOpCount) throw std::invalid_argument(detail::concat("ringreduce: bad op code ", op_code));
  return static_cast<ReduceOp>(op_code);
}

// How a collective that only copies (all-gather, broadcast) moves `tensor`: in its own dtype when
// the engine has it, else as bytes, which carries any dtype (bool, complex, ...). Sets `numel`.
DType copy_dtype(const at::Tensor& tensor, std::size_t* numel) {
  *numel = static_cast<std::size_t>(tensor.numel());
  switch (tensor.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kChar: case at::kByte: case at::kInt: case at::kLong:
      return to_dtype(tensor, ReduceOp::Sum);
    default:
      require_dense(tensor);
      *numel *= tensor.element_size();
      return DType::UInt8;
  }
}

py::object all_reduce(Communicator& communicator, const at::Tensor& tensor, int op_code, int algorithm_code,
                      std::size_t segment_bytes, int root, bool async_op) {
  const ReduceOp op = checked_op(op_code);
  if (algorithm_code < 0 || algorithm_code > 1) {
    throw std::invalid_argument(detail::concat("ringreduce: bad algorithm code ", algorithm_code));
  }
  const auto algorithm = static_cast<Algorithm>(algorithm_code);
  const DType dtype = to_dtype(tensor, op);
  if (algorithm == Algorithm::Central && (root < 0 || root >= communicator.size())) {
    throw std::invalid_argument(detail::concat("ringreduce: central root ", root, " is not a rank of this group (size ",
                                               communicator.size(), ")"));
  }
  // Non-contiguous tensors are reduced in a contiguous copy that is written back afterwards.
  Call call;
  const at::Tensor buffer = contiguous_stand_in(tensor);
  call.args = {Collective::AllReduce, buffer.data_ptr(), static_cast<std::size_t>(buffer.numel()), dtype, op, algorithm,
               segment_bytes, root};
  call.result = tensor;
  if (!buffer.is_same(tensor)) call.result_from = buffer;
  return submit(communicator, std::move(call), async_op);
}

py::object reduce_scatter(Communicator& communicator, const at::Tensor& output, const at::Tensor& input, int op_code,
                          std::size_t segment_bytes, bool async_op) {
  const ReduceOp op = checked_op(op_code);
  const DType dtype = to_dtype(input, op);
  const std::int64_t world = communicator.size();
  if (input.numel() != output.numel() * world || input.scalar_type() != output.scalar_type() ||
      input.device() != output.device()) {
    throw py::value_error(detail::concat(
        "ringreduce.reduce_scatter_tensor: the input must hold world size (", world, ") times the output's elements, "
        "of the same dtype and device; got input ", input.numel(), " x ", input.scalar_type(), " on ", input.device(),
        " and output ", output.numel(), " x ", output.scalar_type(), " on ", output.device()));
  }
  // The input stays as it was: the ring reduces a copy, and rank r's chunk of it is the output.
  Call call;
  const at::Tensor buffer = at::empty(input.sizes(), input.options().memory_format(at::MemoryFormat::Contiguous));
  call.args = {Collective::ReduceScatter, buffer.data_ptr(), static_cast<std::size_t>(buffer.numel()), dtype, op,
               Algorithm::Ring, segment_bytes, 0};
  call.stage_from = input;
  call.stage_into = buffer;
  call.result = output;
  call.result_from = buffer.reshape({-1}).narrow(0, communicator.rank() * output.numel(), output.numel()).view(output.sizes());
  return submit(communicator, std::move(call), async_op);
}

py::object all_gather(Communicator& communicator, const at::Tensor& output, const at::Tensor& input,
                      std::size_t segment_bytes, bool async_op) {
  const std::int64_t world = communicator.size();
  if (output.numel() != input.numel() * world || input.scalar_type() != output.scalar_type() ||
      input.device() != output.device()) {
    throw py::value_error(detail::concat(
        "ringreduce.all_gather_into_tensor: the output must hold world size (", world, ") times the input's elements, "
        "of the same dtype and device; got output ", output.numel(), " x ", output.scalar_type(), " on ",
        output.device(), " and input ", input.numel(), " x ", input.scalar_type(), " on ", input.device()));
  }
  Call call;
  const at::Tensor buffer = contiguous_stand_in(output);
  std::size_t numel = 0;
  const DType dtype = copy_dtype(buffer, &numel);
  call.args = {Collective::AllGather, buffer.data_ptr(), numel, dtype, ReduceOp::Sum, Algorithm::Ring, segment_bytes, 0};
  call.stage_from = input;
  call.stage_into = buffer.reshape({-1}).narrow(0, communicator.rank() * input.numel(), input.numel()).view(input.sizes());
  call.result = output;
  if (!buffer.is_same(output)) call.result_from = buffer;
  return submit(communicator, std::move(call), async_op);
}

py::object broadcast(Communicator& communicator, const at::Tensor& tensor, int root, std::size_t segment_bytes,
                     bool async_op) {
  if (root < 0 || root >= communicator.size()) {
    throw py::value_error(detail::concat("ringreduce.broadcast: root ", root, " is not a rank of this group (size ",
                                         communicator.size(), ")"));
  }
  Call call;
  const at::Tensor buffer = contiguous_stand_in(tensor);
  std::size_t numel = 0;
  const DType dtype = copy_dtype(buffer, &numel);
  call.args = {Collective::Broadcast, buffer.data_ptr(), numel, dtype, ReduceOp::Sum, Algorithm::Ring, segment_bytes, root};
  call.result = tensor;
  if (!buffer.is_same(tensor)) call.result_from = buffer;
  return submit(communicator, std::move(call), async_op);
}

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

py::dict build_info() {
  py::dict info;
  info["version"] = RINGREDUCE_VERSION;
  info["torch"] = RINGREDUCE_TORCH_VERSION;
#if defined(RINGREDUCE_WITH_CUDA)
  info["cuda"] = true;
  info["nccl"] = cuda::nccl_version();
  info["transports"] = py::make_tuple("local", "pg", "shm", "nccl");
#else
  info["cuda"] = false;
  info["nccl"] = py::none();
  info["transports"] = py::make_tuple("local", "pg", "shm");
#endif
  return info;
}

#if defined(RINGREDUCE_WITH_CUDA)
// A GPU communicator on `device`: its streams (one per lane), the transport on them, and reducers
// that launch on them. The communicator owns the queue and destroys it after the transport and reducers.
std::shared_ptr<Communicator> make_device_communicator(
    int device, const std::function<std::unique_ptr<Transport>(cuda::DeviceQueue&)>& transport) {
  auto queue = std::make_unique<cuda::DeviceQueue>(device, cuda::kDeviceLanes);
  const cuda::DeviceQueue* streams = queue.get();
  auto made = transport(*queue);
  return make_communicator(
      std::move(made),
      [streams](DType dtype, ReduceOp op, int world) { return cuda::make_cuda_reducer(dtype, op, world, *streams); },
      std::move(queue));
}

#endif

}  // namespace
}  // namespace ringreduce

PYBIND11_MODULE(_C, m) {
  using namespace ringreduce;
  m.doc() = "ringreduce engine: ring and central all-reduce over pluggable transports";
  py::register_exception<TimeoutError>(m, "CommTimeoutError", PyExc_RuntimeError);
  py::register_exception<MismatchError>(m, "MismatchError", PyExc_RuntimeError);

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("transport", &Communicator::transport_name)
      .def("all_reduce", &all_reduce, py::arg("tensor"), py::arg("op"), py::arg("algorithm"), py::arg("segment_bytes"),
           py::arg("root"), py::arg("async_op"))
      .def("reduce_scatter", &reduce_scatter, py::arg("output"), py::arg("input"), py::arg("op"),
           py::arg("segment_bytes"), py::arg("async_op"))
      .def("all_gather", &all_gather, py::arg("output"), py::arg("input"), py::arg("segment_bytes"), py::arg("async_op"))
      .def("broadcast", &broadcast, py::arg("tensor"), py::arg("root"), py::arg("segment_bytes"), py::arg("async_op"));

  m.def(
      "local_world",
      [](int world, double timeout_s, int device) {
        auto hub = std::make_shared<LocalHub>(world, to_millis(timeout_s));
        std::vector<std::shared_ptr<Communicator>> ranks;
        for (int rank = 0; rank < world; ++rank) {
          if (device < 0) {
            ranks.push_back(make_communicator(std::make_unique<LocalTransport>(hub, rank, std::make_unique<HostMemory>())));
            continue;
          }
#if defined(RINGREDUCE_WITH_CUDA)
          ranks.push_back(make_device_communicator(device, [&](cuda::DeviceQueue& queue) {
            return std::make_unique<LocalTransport>(hub, rank, std::make_unique<cuda::DeviceMemory>(queue));
          }));
#else
          throw py::value_error("ringreduce was built without CUDA: a LocalWorld can only hold CPU ranks");
#endif
        }
        return ranks;
      },
      py::arg("world"), py::arg("timeout_s"), py::arg("device") = -1,
      "Communicators for `world` ranks that are threads of this process (virtual ranks on GPU `device` if >= 0).");

  m.def(
      "pg_communicator",
      [](c10d::Backend& backend, c10d::Store& store, double timeout_s) {
        auto owned = c10::intrusive_ptr<c10d::Backend>::reclaim_copy(&backend);
        return make_communicator(std::make_unique<ProcessGroupTransport>(
            std::move(owned), std::make_unique<StoreRendezvous>(store), to_millis(timeout_s)));
      },
      py::arg("backend"), py::arg("store"), py::arg("timeout_s"),
      "A communicator over a torch.distributed backend (e.g. gloo); `store` carries abort notices.");

  m.def(
      "shm_communicator",
      [](c10d::Store& store, int rank, int world, double timeout_s) {
        StoreRendezvous rendezvous(store);
        return make_communicator(std::make_unique<ShmTransport>(rendezvous, rank, world, to_millis(timeout_s)));
      },
      py::arg("store"), py::arg("rank"), py::arg("world"), py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
      "A communicator over shared memory; every rank of the group must be on this host.");

#if defined(RINGREDUCE_WITH_CUDA)
  m.def(
      "nccl_communicator",
      [](c10d::Store& store, int rank, int world, int device, double timeout_s) {
        return make_device_communicator(device, [&](cuda::DeviceQueue& queue) {
          return std::make_unique<cuda::NcclTransport>(std::make_unique<StoreRendezvous>(store), rank, world, queue,
                                                       caching_allocator(device), to_millis(timeout_s));
        });
      },
      py::arg("store"), py::arg("rank"), py::arg("world"), py::arg("device"), py::arg("timeout_s"),
      py::call_guard<py::gil_scoped_release>(), "A communicator over NCCL point-to-point on GPU `device`.");
#endif

  m.def("ring_schedule", &ring_schedule_py, py::arg("numel"), py::arg("elem_size"), py::arg("world"), py::arg("rank"),
        py::arg("segment_bytes"), py::arg("lanes") = 1, py::arg("phases") = "all_reduce");
  m.def("exchange_groups", &exchange_groups_py, py::arg("numel"), py::arg("world"), py::arg("rank"),
        py::arg("segment_bytes"), py::arg("lanes"), py::arg("algorithm"),
        "The groups of (is_send, peer, bytes) a transport that groups like nccl hands over, for one float32 call.");
  m.def("central_schedule", &central_schedule_py, py::arg("numel"), py::arg("elem_size"), py::arg("segment_bytes"));
  m.def("build_info", &build_info);
  bind_watchdog_probe(m);
  bind_cuda_probes(m);
}
