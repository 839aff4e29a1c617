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
  StreamJoin(StreamContext* engine, const at::Tensor& tensor, const at::Tensor& buffer) : engine_(engine) {
    if (tensor.is_cuda() != (engine != nullptr)) {
      throw py::value_error(detail::concat("ringreduce: this communicator serves ", engine ? "cuda" : "cpu",
                                           " tensors, got a tensor on ", tensor.device(),
                                           "; pass transport=None to choose one that serves it"));
    }
#if defined(RINGREDUCE_WITH_CUDA)
    if (engine == nullptr) return;
    device_ = tensor.device();
    const c10::cuda::CUDAGuard on_device(device_);  // the event is made on the tensor's GPU
    caller_ = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    start_ = engine->mark(caller_);
    // The caching allocator must not hand these blocks out again before the engine's stream is done.
    const auto engine_stream = c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(engine->stream()), device_.index());
    c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), engine_stream);
    if (!buffer.is_same(tensor)) c10::cuda::CUDACachingAllocator::recordStream(buffer.storage().data_ptr(), engine_stream);
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
class AllReduceWork final : public c10d::Work {
 public:
  explicit AllReduceWork(c10::intrusive_ptr<c10::ivalue::Future> future) : future_(std::move(future)) {}

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

// One call's work: reduce `buffer`, then copy it into `tensor` when it is a contiguous stand-in.
void reduce_and_write_back(Communicator& communicator, const StreamJoin& join, const AllReduceArgs& args,
                           const at::Tensor& tensor, const at::Tensor& buffer) {
  at::NoGradGuard no_grad;
  join.on_engine_stream([&] {
    join.begin();
    communicator.all_reduce(args);
    if (!buffer.is_same(tensor)) tensor.copy_(buffer);
  });
}

py::object all_reduce(Communicator& communicator, const at::Tensor& tensor, int op_code, int algorithm_code,
                      std::size_t segment_bytes, int root, bool async_op) {
  if (op_code < 0 || op_code >= kReduceOpCount || algorithm_code < 0 || algorithm_code > 1) {
    throw std::invalid_argument(detail::concat("ringreduce: bad op code ", op_code, " or algorithm code ", algorithm_code));
  }
  const auto op = static_cast<ReduceOp>(op_code);
  const auto algorithm = static_cast<Algorithm>(algorithm_code);
  const DType dtype = to_dtype(tensor, op);
  if (algorithm == Algorithm::Central && (root < 0 || root >= communicator.size())) {
    throw std::invalid_argument(detail::concat("ringreduce: central root ", root, " is not a rank of this group (size ",
                                               communicator.size(), ")"));
  }
  at::NoGradGuard no_grad;
  // Non-contiguous tensors are reduced in a contiguous copy that is written back afterwards.
  at::Tensor buffer = tensor.is_contiguous() ? tensor : tensor.contiguous();
  const StreamJoin join(communicator.stream_context(), tensor, buffer);
  AllReduceArgs args;
  args.data = buffer.data_ptr();
  args.numel = static_cast<std::size_t>(buffer.numel());
  args.dtype = dtype;
  args.op = op;
  args.algorithm = algorithm;
  args.segment_bytes = resolve_segment_bytes(segment_bytes);
  args.root = root;
  if (!async_op) {
    py::gil_scoped_release release;
    communicator.executor().run([&] { reduce_and_write_back(communicator, join, args, tensor, buffer); });
    join.release();
    return py::none();
  }
  Communicator* comm = &communicator;  // outlives its jobs: its executor drains before it dies
  auto job = [comm, join, args, tensor, buffer] { reduce_and_write_back(*comm, join, args, tensor, buffer); };
  auto future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), join.devices());
  comm->executor().submit(std::move(job), [future, join, tensor](std::exception_ptr error) {
    if (error) {
      future->setError(error);
    } else {
      // A CUDA future records its events on the current stream: the engine's, where the result is.
      join.on_engine_stream([&] { future->markCompleted(c10::IValue(std::vector<at::Tensor>{tensor})); });
    }
  });
  return py::cast(c10::intrusive_ptr<c10d::Work>(c10::make_intrusive<AllReduceWork>(future)));
}

py::list ring_schedule_py(std::size_t numel, std::size_t elem_size, int world, int rank, std::size_t segment_bytes,
                          std::size_t lanes) {
  py::list out;
  for (const RingTransfer& t : ring_schedule(numel, elem_size, world, rank, segment_bytes, lanes)) {
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
           py::arg("root"), py::arg("async_op"));

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
        py::arg("segment_bytes"), py::arg("lanes") = 1);
  m.def("exchange_groups", &exchange_groups_py, py::arg("numel"), py::arg("world"), py::arg("rank"),
        py::arg("segment_bytes"), py::arg("lanes"), py::arg("algorithm"),
        "The groups of (is_send, peer, bytes) a transport that groups like nccl hands over, for one float32 call.");
  m.def("central_schedule", &central_schedule_py, py::arg("numel"), py::arg("elem_size"), py::arg("segment_bytes"));
  m.def("build_info", &build_info);
  bind_watchdog_probe(m);
  bind_cuda_probes(m);
}
