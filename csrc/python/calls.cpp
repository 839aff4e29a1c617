#include "python/calls.h"

#if defined(RINGREDUCE_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <algorithm>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <ATen/record_function.h>

#include "python/glue.h"

namespace py = pybind11;

namespace ringreduce {

ReduceOp checked_op(int op_code) {
  if (op_code < 0 || op_code >= kReduceOpCount) throw std::invalid_argument(detail::concat("ringreduce: bad op code ", op_code));
  return static_cast<ReduceOp>(op_code);
}

namespace {

// How often Work.wait(timeout) looks at the collective: short beside any timeout a caller would
// give, long beside a check of a flag.
constexpr std::chrono::microseconds kWaitPoll{100};

// Orders a call on a CUDA tensor against the caller's stream, as torch's NCCL backend does: the
// collective starts after what the caller queued before it, and the caller's later work waits
// for its result; both through events, never by blocking the host. For host tensors it does nothing.
class StreamJoin {
 public:
  // `touched`: every tensor the collective reads or writes, the caller's first. The simulated
  // device serves host tensors, whose callers have no stream: its communicator waits for each
  // collective itself (StreamContext::host_wait), and nothing is joined here.
  StreamJoin(StreamContext* engine, const std::vector<at::Tensor>& touched)
      : engine_(engine != nullptr && engine->host_wait().count() == 0 ? engine : nullptr) {
    for (const at::Tensor& tensor : touched) {
      if (tensor.is_cuda() != (engine_ != nullptr)) {
        throw py::value_error(detail::concat("ringreduce: this communicator serves ", engine_ ? "cuda" : "cpu",
                                             " tensors, got a tensor on ", tensor.device(),
                                             "; pass transport=None to choose one that serves it"));
      }
    }
#if defined(RINGREDUCE_WITH_CUDA)
    if (engine_ == nullptr) return;
    device_ = touched.front().device();
    const c10::cuda::CUDAGuard on_device(device_);  // the event is made on the tensor's GPU
    caller_ = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
    start_ = engine_->mark(caller_);
    // The caching allocator must not hand these blocks out again before the engine's stream is done.
    const auto engine_stream = c10::cuda::getStreamFromExternal(static_cast<cudaStream_t>(engine_->stream()), device_.index());
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

  // Tells whether the device has done the collective (call after it, on the engine's stream); null
  // for host tensors, whose work is done when the job returns.
  std::function<bool()> done_probe() const { return engine_ != nullptr ? engine_->done_probe() : nullptr; }

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
  // `device_done` is set, for a CUDA call, before the future completes.
  CollectiveWork(c10::intrusive_ptr<c10::ivalue::Future> future, std::shared_ptr<std::function<bool()>> device_done)
      : future_(std::move(future)), device_done_(std::move(device_done)) {}

  // As torch's NCCL backend answers: a CUDA collective is completed once the GPU has done it, not
  // when the host has queued it, so a caller who polls this and then reads the tensor on another
  // stream reads the result.
  bool isCompleted() override { return future_->completed() && (!*device_done_ || (*device_done_)()); }
  bool isSuccess() const override { return future_->hasValue(); }
  std::exception_ptr exception() const override { return future_->exception_ptr(); }
  std::vector<at::Tensor> result() override { return future_->value().toTensorVector(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // Blocks until the collective has been queued (CPU: done), makes the current CUDA streams wait
  // for its result, and rethrows its error. A finite `timeout` raises CommTimeoutError when the
  // collective has not finished by then (the collective itself goes on, bounded by the group's).
  bool wait(std::chrono::milliseconds timeout) override {
    if (timeout != ::kNoTimeout) {
      const auto deadline = std::chrono::steady_clock::now() + timeout;
      while (!future_->completed()) {
        if (std::chrono::steady_clock::now() > deadline) {
          throw TimeoutError(detail::concat(timed_out_after(timeout), "Work.wait(); the collective is still running"));
        }
        std::this_thread::sleep_for(kWaitPoll);
      }
    }
    future_->waitAndThrow();
    return true;
  }

 private:
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<std::function<bool()>> device_done_;
};

// Every tensor a call reads or writes, the caller's first.
std::vector<at::Tensor> touched_by(const Call& call) {
  std::vector<at::Tensor> touched = call.results;
  touched.insert(touched.end(), call.reads.begin(), call.reads.end());
  for (const std::vector<Copy>* copies : {&call.before, &call.after}) {
    for (const Copy& copy : *copies) touched.insert(touched.end(), {copy.from, copy.into});
  }
  return touched;
}

// The simulated device's stand-in for the caching allocator's recordStream: after a failure, work
// still queued on its streams may write a call's host tensors, so they stay alive until the device
// has done it. Looked at after every call on the simulated device, failed or not, so they go with
// the next call once the device is done.
class KeptTensors {
 public:
  void keep(std::function<bool()> done, std::vector<at::Tensor> tensors) {
    const std::lock_guard<std::mutex> lock(mutex_);
    release_done_locked();
    kept_.emplace_back(std::move(done), std::move(tensors));
    count_.store(kept_.size());
  }
  void release_done() {
    if (count_.load() == 0) return;
    const std::lock_guard<std::mutex> lock(mutex_);
    release_done_locked();
  }
  std::size_t count() const { return count_.load(); }

 private:
  void release_done_locked() {
    kept_.erase(std::remove_if(kept_.begin(), kept_.end(), [](const auto& entry) { return entry.first(); }),
                kept_.end());
    count_.store(kept_.size());
  }

  std::mutex mutex_;
  std::vector<std::pair<std::function<bool()>, std::vector<at::Tensor>>> kept_;
  std::atomic<std::size_t> count_{0};
};

// Never destroyed: tensors still kept at exit go with the process.
KeptTensors& kept_tensors() {
  static auto* kept = new KeptTensors;
  return *kept;
}

void run_call(Communicator& communicator, const StreamJoin& join, const Call& call) {
  at::NoGradGuard no_grad;
  StreamContext* engine = communicator.stream_context();
  const bool on_simulated_device = engine != nullptr && engine->host_wait().count() > 0;
  try {
    join.on_engine_stream([&] {
      join.begin();
      for (const Copy& copy : call.before) copy.into.copy_(copy.from);
      communicator.run(call.args);
      for (const Copy& copy : call.after) copy.into.copy_(copy.from);
    });
  } catch (...) {
    if (on_simulated_device) kept_tensors().keep(engine->done_probe(), touched_by(call));
    throw;
  }
  if (on_simulated_device) kept_tensors().release_done();
}

}  // namespace

namespace {

const char* profiler_range(Collective collective) {
  switch (collective) {
    case Collective::AllReduce: return "ringreduce:all_reduce";
    case Collective::ReduceScatter: return "ringreduce:reduce_scatter";
    case Collective::AllGather: return "ringreduce:all_gather";
    case Collective::Broadcast: return "ringreduce:broadcast";
    case Collective::Reduce: return "ringreduce:reduce";
  }
  return "ringreduce:collective";
}

// Opens the range on `range` when a profiler listens: the tensors as inputs, and the algorithm,
// transport and bytes as keyword inputs (recorded with record_shapes=True).
void open_profiler_range(at::RecordFunction& range, const Communicator& communicator, const Call& call) {
  if (!range.needsInputs()) {
    range.before(profiler_range(call.args.collective));
    return;
  }
  const std::vector<c10::IValue> tensors(call.results.begin(), call.results.end());
  const std::unordered_map<std::string, c10::IValue> details = {
      {"algorithm", std::string(algorithm_of(call.args))},
      {"transport", std::string(communicator.transport_name())},
      {"bytes", static_cast<std::int64_t>(call.args.numel * element_size(call.args.dtype))},
  };
  range.before(profiler_range(call.args.collective), &tensors, &details);
}

}  // namespace

namespace {

// submit(), and for a blocking call the device's answer to "done?" in `device_done`.
c10::intrusive_ptr<c10d::Work> issue(Communicator& communicator, Call call, bool async_op,
                                     std::function<bool()>* device_done) {
  // torch.profiler shows the call as a range "ringreduce:<collective>" (all of it when it blocks,
  // its hand-over to the worker when async), with its tensors, algorithm, transport and bytes.
  at::RecordFunction range(at::RecordScope::USER_SCOPE);
  if (range.isActive()) open_profiler_range(range, communicator, call);
  const StreamJoin join(communicator.stream_context(), touched_by(call));
  call.args.segment_bytes = resolve_segment_bytes(call.args.segment_bytes);
  if (!async_op) {
    std::optional<py::gil_scoped_release> release;  // a c10d backend is called without the GIL
    if (PyGILState_Check()) release.emplace();
    communicator.executor().run([&] { run_call(communicator, join, call); });
    join.release();
    if (device_done != nullptr) join.on_engine_stream([&] { *device_done = join.done_probe(); });
    return {};
  }
  // Issued from a completion on the worker (a callback that makes another collective), the call
  // runs at once on that thread; without the GIL, which ranks that are threads of this process need.
  std::optional<py::gil_scoped_release> release;
  if (communicator.executor().on_worker() && PyGILState_Check()) release.emplace();
  Communicator* comm = &communicator;  // outlives its jobs: its executor drains before it dies
  auto future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), join.devices());
  auto device = std::make_shared<std::function<bool()>>();
  const std::vector<at::Tensor> results = call.results;
  comm->executor().submit([comm, join, call] { run_call(*comm, join, call); },
                          [future, device, join, results](std::exception_ptr error) {
                            if (error) {
                              future->setError(for_torch(error));
                            } else {
                              // A CUDA future records its events on the current stream: the
                              // engine's, where the result is.
                              join.on_engine_stream([&] {
                                *device = join.done_probe();
                                future->markCompleted(c10::IValue(results));
                              });
                            }
                          });
  return c10::make_intrusive<CollectiveWork>(future, device);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> submit(Communicator& communicator, Call call, bool async_op) {
  return issue(communicator, std::move(call), async_op, nullptr);
}

std::size_t calls_kept_for_the_device() { return kept_tensors().count(); }

c10::intrusive_ptr<c10d::Work> run_now(Communicator& communicator, Call call) {
  const std::vector<at::Tensor> results = call.results;
  std::vector<c10::Device> devices;
  if (!results.empty() && results[0].is_cuda()) devices.push_back(results[0].device());
  auto device = std::make_shared<std::function<bool()>>();
  try {
    issue(communicator, std::move(call), false, device.get());
  } catch (const RanksLostError& lost) {
    throw TorchRanksLostError(lost);
  }
  auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devices);
  future->markCompleted(c10::IValue(results));  // on the caller's stream, which now waits for the result
  return c10::make_intrusive<CollectiveWork>(future, device);
}

namespace {

// Rank `rank`'s share of a contiguous buffer of world shares, shaped like `like`.
at::Tensor share(const at::Tensor& buffer, int rank, const at::Tensor& like) {
  return buffer.reshape({-1}).narrow(0, rank * like.numel(), like.numel()).view(like.sizes());
}

// Whether the memory of two contiguous tensors overlaps.
bool overlap(const at::Tensor& a, const at::Tensor& b) {
  const auto* a_first = static_cast<const char*>(a.data_ptr());
  const auto* b_first = static_cast<const char*>(b.data_ptr());
  return a_first < b_first + b.nbytes() && b_first < a_first + a.nbytes();
}

// A working buffer like `like` that the communicator's calls share (they run one at a time, in
// order): a 64 MiB buffer allocated afresh per call cost more in page faults than the collective.
at::Tensor scratch_like(Communicator& communicator, const at::Tensor& like) {
  static std::mutex mutex;  // calls may be made on one group from several threads
  const std::lock_guard<std::mutex> lock(mutex);
  std::shared_ptr<void>& slot = communicator.caller_state();
  const std::int64_t bytes = like.numel() * static_cast<std::int64_t>(like.element_size());
  auto* held = static_cast<at::Tensor*>(slot.get());
  if (held == nullptr || held->device() != like.device() || held->numel() < bytes) {
    slot = std::shared_ptr<void>(new at::Tensor(at::empty({std::max<std::int64_t>(bytes, 1)}, like.options().dtype(at::kByte))),
                                 [](void* tensor) { delete static_cast<at::Tensor*>(tensor); });
    held = static_cast<at::Tensor*>(slot.get());
  }
  return held->narrow(0, 0, bytes).view(like.scalar_type()).view(like.sizes());
}

// A contiguous tensor that stands in for `tensor` (itself when it is contiguous already).
at::Tensor contiguous_stand_in(const at::Tensor& tensor) { return tensor.is_contiguous() ? tensor : tensor.contiguous(); }

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

// "this group's pg communicator has 2 hosts x 2 ranks", for errors.
std::string hosts_of(const Communicator& communicator) {
  const HostLayout* layout = communicator.host_layout();
  return detail::concat("this group's ", communicator.transport_name(), " communicator has ",
                        layout != nullptr ? layout->describe() : "every rank on one host (or no host layout)");
}

// The algorithm a reduce-scatter or all-gather (`name`) runs: auto's choice, ring, or hierarchical
// where it moves fewer bytes across hosts (HostLayout::chunked_hierarchy_pays).
Algorithm chunked_algorithm(const Communicator& communicator, Algorithm algorithm, const char* name) {
  if (algorithm == Algorithm::Auto) return communicator.chunked_auto();
  if (algorithm == Algorithm::Ring) return algorithm;
  if (algorithm == Algorithm::Hierarchical && communicator.has_chunked_hierarchy()) return algorithm;
  if (algorithm == Algorithm::Hierarchical) {
    throw py::value_error(detail::concat(
        "ringreduce.", name, ": algorithm 'hierarchical' runs where it moves fewer bytes across hosts than the ring: "
        "several hosts of 2 or more ranks, the most ranks on a host times (hosts - 1) below ranks - 1 (2x2, 3+2, "
        "4+4+3); ", hosts_of(communicator), ". Use 'auto' or 'ring'"));
  }
  throw py::value_error(detail::concat("ringreduce.", name, ": algorithm '", algorithm_name(algorithm),
                                       "' does not run here; use 'auto', 'ring' or 'hierarchical'"));
}

// The compression an all-reduce or reduce-scatter runs with: the one asked for where there is a
// link between hosts to compress and the values gain from it (float32 SUM or AVG), with the
// algorithm that compresses; elsewhere none, said once under RINGREDUCE_DEBUG=INFO. An algorithm
// that never crosses compressed is refused.
Compression link_compression(const Communicator& communicator, Compression asked, Collective collective, DType dtype,
                             ReduceOp op, Algorithm* algorithm) {
  if (asked == Compression::None) return asked;
  if (*algorithm != Algorithm::Auto && *algorithm != Algorithm::Hierarchical) {
    throw std::invalid_argument(detail::concat(
        "ringreduce: compress='", compression_name(asked), "' runs on the hierarchical ", collective_name(collective),
        "'s link between hosts; algorithm '", algorithm_name(*algorithm), "' moves every value exact. Use algorithm "
        "'auto' or 'hierarchical' with it, or compress=None"));
  }
  const char* exact_because = nullptr;
  if (!communicator.spans_hosts()) {
    exact_because = "there is no link between hosts to compress";
  } else if (collective == Collective::ReduceScatter && asked == Compression::Int8) {
    exact_because = "int8 compresses all-reduces only (a reduce-scatter takes bf16 or fp16)";
  } else if (collective == Collective::ReduceScatter && !communicator.has_chunked_hierarchy()) {
    exact_because = "a reduce-scatter runs hierarchical, and compressed, only where that moves fewer bytes across "
                    "hosts than the ring (every host with the same number, 2 or more, of ranks, or nearly)";
  } else if (dtype != DType::Float32) {
    exact_because = "only float32 values are compressed (16-bit ones already cross in 16 bits)";
  } else if (op != ReduceOp::Sum && op != ReduceOp::Avg) {
    exact_because = "only SUM and AVG are compressed";
  }
  if (exact_because != nullptr) {
    debug_info(detail::concat("compress='", compression_name(asked), "' on ", hosts_of(communicator), ": a ",
                              dtype_name(dtype), " ", op_name(op), " ", collective_name(collective), " runs exact, as ",
                              exact_because));
    return Compression::None;
  }
  *algorithm = Algorithm::Hierarchical;
  return asked;
}

// A residual for error feedback: a contiguous float32 CPU tensor of the tensor's elements, apart
// from it, on a SUM (an AVG's last rounding is of the sum divided, in other units).
void check_residual(const at::Tensor& residual, const at::Tensor& tensor, ReduceOp op) {
  const char* wrong = nullptr;
  if (op != ReduceOp::Sum) {
    wrong = "keeps the rounding errors of a SUM only; divide the values first (as ringreduce.hooks.compressed_hook "
            "does) and reduce with SUM";
  } else if (residual.scalar_type() != at::kFloat || !residual.device().is_cpu() || !residual.is_contiguous()) {
    wrong = "must be a contiguous float32 CPU tensor";
  } else if (residual.numel() != tensor.numel()) {
    wrong = "must hold as many elements as the tensor";
  } else if (residual.numel() > 0 && tensor.device().is_cpu()) {
    const auto* first = static_cast<const char*>(residual.data_ptr());
    const auto* last = first + residual.nbytes();
    const auto* from = static_cast<const char*>(tensor.data_ptr());
    const auto* to = from + tensor.element_size() * static_cast<std::size_t>(tensor.numel());
    if (first < to && from < last) wrong = "must not share memory with the tensor";
  }
  if (wrong != nullptr) {
    throw py::value_error(detail::concat("ringreduce.all_reduce: residual ", wrong, "; got ", residual.numel(), " x ",
                                         residual.scalar_type(), " on ", residual.device(), " for a tensor of ",
                                         tensor.numel(), " elements, op ", op_name(op)));
  }
}

}  // namespace

std::size_t caller_working_bytes(Communicator& communicator) {
  const auto* held = static_cast<const at::Tensor*>(communicator.caller_state().get());
  return held == nullptr ? 0 : held->nbytes();
}

Call all_reduce_call(Communicator& communicator, const at::Tensor& tensor, ReduceOp op, Algorithm algorithm,
                     std::size_t segment_bytes, int root, Compression compression,
                     const std::optional<at::Tensor>& residual) {
  const DType dtype = to_dtype(tensor, op);
  if (residual) check_residual(*residual, tensor, op);
  compression = link_compression(communicator, compression, Collective::AllReduce, dtype, op, &algorithm);
  if (host_memory_only(algorithm) && communicator.stream_context() != nullptr) {
    throw std::invalid_argument(detail::concat("ringreduce: algorithm '", algorithm_name(algorithm), "' runs on host "
                                               "transports only; use 'auto', 'ring' or 'central' on a device (CUDA, "
                                               "or the simulated one)"));
  }
  if (algorithm == Algorithm::Hierarchical && !communicator.has_hierarchy()) {
    throw std::invalid_argument(detail::concat(
        "ringreduce: algorithm 'hierarchical' needs a group whose ranks span several hosts, with several ranks on "
        "some host; ", hosts_of(communicator), ". Use 'auto', 'ring', 'central', 'one_shot' or 'doubling'"));
  }
  // Under torch.use_deterministic_algorithms(True) auto does not learn: each size keeps one
  // algorithm (the table's or the prior's) for the whole run, so sums repeat from run to run.
  if (algorithm == Algorithm::Auto && at::globalContext().deterministicAlgorithms()) {
    algorithm = communicator.fixed_auto(static_cast<std::uint64_t>(tensor.numel()) * tensor.element_size());
  }
  // (auto may try central: its root must be a rank too)
  if ((algorithm == Algorithm::Central || algorithm == Algorithm::Auto) && (root < 0 || root >= communicator.size())) {
    throw std::invalid_argument(detail::concat("ringreduce: central root ", root, " is not a rank of this group (size ",
                                               communicator.size(), ")"));
  }
  // Non-contiguous tensors are reduced in a contiguous copy that is written back afterwards.
  Call call;
  const at::Tensor buffer = contiguous_stand_in(tensor);
  call.args = {Collective::AllReduce, buffer.data_ptr(), static_cast<std::size_t>(buffer.numel()), dtype, op, algorithm,
               segment_bytes, root};
  call.args.compression = compression;
  // (where the call runs exact, nothing was dropped: the residual stays as it is)
  if (residual && compression != Compression::None) {
    if (communicator.stream_context() != nullptr) {
      throw py::value_error("ringreduce.all_reduce: a residual keeps the rounding errors of CPU tensors only; this "
                            "communicator serves a device");
    }
    call.args.residual = residual->data_ptr<float>();
    call.reads = {*residual};
  }
  call.results = {tensor};
  if (!buffer.is_same(tensor)) call.after = {{buffer, tensor}};
  return call;
}

Call reduce_scatter_call(Communicator& communicator, const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                         Algorithm algorithm, std::size_t segment_bytes, Compression compression) {
  const DType dtype = to_dtype(input, op);
  compression = link_compression(communicator, compression, Collective::ReduceScatter, dtype, op, &algorithm);
  const std::int64_t world = communicator.size();
  if (input.numel() != output.numel() * world || input.scalar_type() != output.scalar_type() ||
      input.device() != output.device()) {
    throw py::value_error(detail::concat(
        "ringreduce.reduce_scatter_tensor: the input must hold world size (", world, ") times the output's elements, "
        "of the same dtype and device; got input ", input.numel(), " x ", input.scalar_type(), " on ", input.device(),
        " and output ", output.numel(), " x ", output.scalar_type(), " on ", output.device()));
  }
  // The input stays as it was. On the host the ring reads it where it is and reduces into working
  // memory; on a device it reduces a copy. Rank r's chunk of the working memory is the output. The
  // hierarchical one on the host needs no such memory: it reads the input and writes the output.
  Call call;
  const Algorithm chosen = chunked_algorithm(communicator, algorithm, "reduce_scatter_tensor");
  const bool on_host = communicator.stream_context() == nullptr;
  if (on_host && chosen == Algorithm::Hierarchical && input.is_contiguous() && output.is_contiguous() &&
      !overlap(input, output)) {
    call.args = {Collective::ReduceScatter, nullptr, static_cast<std::size_t>(input.numel()), dtype, op, chosen,
                 segment_bytes, 0};
    call.args.compression = compression;
    call.args.input = input.data_ptr();
    call.args.output = output.data_ptr();
    call.reads = {input};
    call.results = {output};
    return call;
  }
  const at::Tensor buffer = scratch_like(communicator, input);
  call.args = {Collective::ReduceScatter, buffer.data_ptr(), static_cast<std::size_t>(buffer.numel()), dtype, op,
               chosen, segment_bytes, 0};
  call.args.compression = compression;
  if (on_host && input.is_contiguous()) {
    call.args.input = input.data_ptr();
    call.reads = {input};
  } else {
    call.before = {{input, buffer}};
  }
  call.after = {{share(buffer, communicator.rank(), output), output}};
  call.results = {output};
  return call;
}

Call all_gather_call(Communicator& communicator, const at::Tensor& output, const at::Tensor& input,
                     Algorithm algorithm, std::size_t segment_bytes) {
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
  call.args = {Collective::AllGather, buffer.data_ptr(), numel, dtype, ReduceOp::Sum,
               chunked_algorithm(communicator, algorithm, "all_gather_into_tensor"), segment_bytes, 0};
  call.before = {{input, share(buffer, communicator.rank(), input)}};
  if (!buffer.is_same(output)) call.after = {{buffer, output}};
  call.results = {output};
  return call;
}

Call broadcast_call(Communicator& communicator, const at::Tensor& tensor, int root, std::size_t segment_bytes) {
  if (root < 0 || root >= communicator.size()) {
    throw py::value_error(detail::concat("ringreduce.broadcast: root ", root, " is not a rank of this group (size ",
                                         communicator.size(), ")"));
  }
  Call call;
  const at::Tensor buffer = contiguous_stand_in(tensor);
  std::size_t numel = 0;
  const DType dtype = copy_dtype(buffer, &numel);
  call.args = {Collective::Broadcast, buffer.data_ptr(), numel, dtype, ReduceOp::Sum, Algorithm::Ring, segment_bytes, root};
  call.results = {tensor};
  if (!buffer.is_same(tensor)) call.after = {{buffer, tensor}};
  return call;
}

Call reduce_call(Communicator& communicator, const at::Tensor& tensor, ReduceOp op, int root, std::size_t segment_bytes) {
  const DType dtype = to_dtype(tensor, op);
  if (root < 0 || root >= communicator.size()) {
    throw py::value_error(detail::concat("ringreduce.reduce: root ", root, " is not a rank of this group (size ",
                                         communicator.size(), ")"));
  }
  // Every rank reduces a copy (a GPU average scales its input first), and only the root's comes back.
  Call call;
  const at::Tensor buffer = scratch_like(communicator, tensor);
  call.args = {Collective::Reduce, buffer.data_ptr(), static_cast<std::size_t>(buffer.numel()), dtype, op,
               Algorithm::Central, segment_bytes, root};
  call.before = {{tensor, buffer}};
  if (communicator.rank() == root) call.after = {{buffer, tensor}};
  call.results = {tensor};
  return call;
}

}  // namespace ringreduce
