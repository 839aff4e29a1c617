#include "python/backend.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <optional>
#include <set>
#include <thread>

#include "python/calls.h"
#include "python/glue.h"

namespace ringreduce {
namespace {

// How often barrier() looks at a GPU that has not finished: short beside a barrier's round trip,
// long beside an event query (about a microsecond).
constexpr std::chrono::microseconds kBarrierPoll{50};

ReduceOp engine_op(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return ReduceOp::Sum;
    case c10d::ReduceOp::AVG: return ReduceOp::Avg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::Product;
    case c10d::ReduceOp::MIN: return ReduceOp::Min;
    case c10d::ReduceOp::MAX: return ReduceOp::Max;
    default:
      TORCH_CHECK(false, "the ringreduce backend supports ReduceOp SUM, AVG, PRODUCT, MIN and MAX; "
                         "use a gloo or nccl group for the bitwise and premultiplied ops");
  }
}

// Complex tensors are reduced through their real view, as torch's own backends do: exact for SUM
// and AVG, meaningless for the others, which are refused.
at::Tensor reducible(const at::Tensor& tensor, ReduceOp op) {
  if (!tensor.is_complex()) return tensor;
  TORCH_CHECK(op == ReduceOp::Sum || op == ReduceOp::Avg, "the ringreduce backend reduces complex tensors with SUM "
              "and AVG only (through their real view), as torch's backends do; got another op");
  return at::view_as_real(tensor);
}

at::Tensor single(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "the ringreduce backend's ", op, " takes one tensor per rank, got ", tensors.size());
  return tensors[0];
}

// `tensors` flattened into one new buffer, and the copies that put the buffer's pieces back.
at::Tensor fused(const std::vector<at::Tensor>& tensors, std::vector<Copy>* back) {
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : tensors) flat.push_back(t.reshape({-1}));
  at::Tensor buffer = at::cat(flat);
  std::int64_t at = 0;
  for (const at::Tensor& t : tensors) {
    back->push_back({buffer.narrow(0, at, t.numel()).view(t.sizes()), t});
    at += t.numel();
  }
  return buffer;
}

// The largest of `pieces`, after checking them against torch's rules: one per rank, all of `own`'s
// dtype and device, and this rank's piece as large as `own`. Pieces may differ in size (uneven
// shards, as torch's NCCL backend allows); the engine then runs on pieces padded to the largest.
std::int64_t largest_piece(const std::vector<at::Tensor>& pieces, const at::Tensor& own, int rank, const char* op) {
  std::int64_t largest = 0;
  for (const at::Tensor& piece : pieces) {
    TORCH_CHECK(piece.scalar_type() == own.scalar_type() && piece.device() == own.device(), "the ringreduce backend's ",
                op, " needs every piece of the list of this rank's tensor's dtype and device (", own.scalar_type(),
                " on ", own.device(), "), got ", piece.scalar_type(), " on ", piece.device());
    largest = std::max(largest, piece.numel());
  }
  TORCH_CHECK(pieces[rank].numel() == own.numel(), "the ringreduce backend's ", op, ": this rank's piece of the list (",
              pieces[rank].numel(), " elements) must be as large as its own tensor (", own.numel(), ")");
  return largest;
}

// Whether an op goes to the CUDA side (a tensor of the list on a GPU).
bool on_gpu(const std::vector<at::Tensor>& tensors) {
  return std::any_of(tensors.begin(), tensors.end(), [](const at::Tensor& t) { return t.is_cuda(); });
}

// A call made with async_op=False runs at once on the calling thread; an async one goes to the
// communicator's worker, as every call did before torch told backends which is which.
c10::intrusive_ptr<c10d::Work> finish(Communicator& communicator, Call call, bool async_op) {
  return async_op ? submit(communicator, std::move(call), true) : run_now(communicator, std::move(call));
}

}  // namespace

// What a loss ends, from the membership's pulse thread: the transfers of every communicator that
// follows the membership, and torch's NCCL delegate (its communicators are aborted, as its own
// watchdog would after the group's timeout). Held weakly: a loss keeps nothing alive.
struct RingReduceBackend::Watched {
  std::mutex mutex;
  std::condition_variable changed;  // a loss, or an op delegated to gloo that finished (wake())
  std::vector<std::weak_ptr<Communicator>> communicators;
  std::optional<c10::weak_intrusive_ptr<c10d::Backend>> nccl_delegate;
  bool ended = false;  // the membership calls end() once: what is added later ends at once
  // The ops delegated to gloo: a loss aborts the sends and receives among them (gloo can; its
  // collectives run on in its threads until gloo's own timeout).
  std::vector<c10::weak_intrusive_ptr<c10d::Work>> delegated;

  void add(const std::shared_ptr<Communicator>& communicator) {
    if (keep(communicators, communicator)) communicator->cancel();
  }

  void add(const c10::intrusive_ptr<c10d::Work>& work) {
    if (keep(delegated, work)) abort_point_to_point(work);
  }

  // Adds `strong` to `weak_list` (dropping what has gone); whether the loss has already come, so
  // that the caller ends it at once.
  template <typename Weak, typename Strong>
  bool keep(std::vector<Weak>& weak_list, const Strong& strong) {
    std::lock_guard<std::mutex> lock(mutex);
    weak_list.erase(std::remove_if(weak_list.begin(), weak_list.end(), [](const Weak& weak) { return weak.expired(); }),
                    weak_list.end());
    weak_list.emplace_back(strong);
    return ended;
  }

  bool has_ended() {
    std::lock_guard<std::mutex> lock(mutex);
    return ended;
  }

  void wake() {
    std::lock_guard<std::mutex> lock(mutex);
    changed.notify_all();
  }

  // Until `finished` (set before a wake()) or a loss, at most until `deadline` (none: unbounded).
  void await(const std::atomic<bool>& finished, std::optional<std::chrono::steady_clock::time_point> deadline) {
    std::unique_lock<std::mutex> lock(mutex);
    const auto done = [&] { return finished.load() || ended; };
    if (deadline) {
      changed.wait_until(lock, *deadline, done);
    } else {
      changed.wait(lock, done);
    }
  }

  // Whether an op delegated to gloo has not finished (after a loss: one that waits for a silent peer).
  bool delegated_op_running() {
    std::lock_guard<std::mutex> lock(mutex);
    return std::any_of(delegated.begin(), delegated.end(), [](const c10::weak_intrusive_ptr<c10d::Work>& weak) {
      const c10::intrusive_ptr<c10d::Work> work = weak.lock();
      return work && !work->isCompleted();
    });
  }

  void end() {
    std::vector<std::shared_ptr<Communicator>> live;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    c10::intrusive_ptr<c10d::Backend> nccl;
    {
      std::lock_guard<std::mutex> lock(mutex);
      ended = true;
      changed.notify_all();
      for (const std::weak_ptr<Communicator>& weak : communicators) {
        if (std::shared_ptr<Communicator> held = weak.lock()) live.push_back(std::move(held));
      }
      for (const c10::weak_intrusive_ptr<c10d::Work>& weak : delegated) {
        if (c10::intrusive_ptr<c10d::Work> held = weak.lock()) works.push_back(std::move(held));
      }
      if (nccl_delegate) nccl = nccl_delegate->lock();
    }
    for (const std::shared_ptr<Communicator>& communicator : live) communicator->cancel();
    for (const c10::intrusive_ptr<c10d::Work>& work : works) abort_point_to_point(work);
    if (nccl) nccl->abort();
  }

  static bool point_to_point(const c10d::Work& work) {
    const c10d::OpType type = work.retrieveOpType();
    return type == c10d::OpType::SEND || type == c10d::OpType::RECV || type == c10d::OpType::RECVANYSOURCE;
  }

  static void abort_point_to_point(const c10::intrusive_ptr<c10d::Work>& work) {
    if (point_to_point(*work)) work->abort();  // gloo's send and receive end their wait
  }
};

// The handle of an op delegated to gloo, whose wait ends when the group loses a rank: RanksLostError
// with the survivors' agreed set, within the loss bound instead of the group's timeout. Everything
// else is the delegate's own work.
class LossBoundedWork final : public c10d::Work {
 public:
  LossBoundedWork(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<RingReduceBackend::Watched> watched,
                  std::shared_ptr<Membership> membership, const char* op)
      : c10d::Work(-1, inner->retrieveOpType()),
        inner_(std::move(inner)),
        watched_(std::move(watched)),
        membership_(std::move(membership)),
        op_(op) {}

  bool isCompleted() override { return inner_->isCompleted(); }
  bool isSuccess() const override { return inner_->isSuccess(); }
  std::exception_ptr exception() const override { return inner_->exception(); }
  int sourceRank() const override { return inner_->sourceRank(); }
  std::vector<at::Tensor> result() override { return inner_->result(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return inner_->getFuture(); }
  void abort() override { inner_->abort(); }
  uint64_t getSequencenumber() const override { return inner_->getSequencenumber(); }

  bool wait(std::chrono::milliseconds timeout) override {
    // gloo completes a send or receive inside its wait, which a loss aborts; a collective in its own
    // thread, which this wait watches beside the membership.
    if (!RingReduceBackend::Watched::point_to_point(*inner_)) {
      std::optional<std::chrono::steady_clock::time_point> deadline;
      if (timeout != ::kNoTimeout) deadline = std::chrono::steady_clock::now() + timeout;
      const auto finished = std::make_shared<std::atomic<bool>>(false);
      inner_->getFuture()->addCallback([finished, watched = watched_](c10::ivalue::Future&) {
        finished->store(true);
        watched->wake();
      });
      watched_->await(*finished, deadline);
      if (!finished->load() && watched_->has_ended()) raise_if_lost();
    }
    bool finished = false;
    try {
      finished = inner_->wait(timeout);
    } catch (const std::exception&) {
      raise_if_lost();
      throw;
    }
    if (!finished && watched_->has_ended()) raise_if_lost();  // gloo's aborted send or receive returns false
    return finished;
  }

 private:
  // After a failure or a loss: RanksLostError once the survivors agree on lost ranks (within the
  // loss bound); nothing when every rank is alive.
  void raise_if_lost() {
    const std::vector<int> lost = membership_->agree_on_loss(std::chrono::steady_clock::now());
    if (!lost.empty()) membership_->raise_lost(lost, detail::concat("first seen here by ", op_, ", delegated to gloo"));
  }

  c10::intrusive_ptr<c10d::Work> inner_;
  std::shared_ptr<RingReduceBackend::Watched> watched_;
  std::shared_ptr<Membership> membership_;
  const char* op_;
};

// Delegates to gloo left running after a loss (an op waiting for a silent peer, until gloo's
// timeout): destroying one would wait for its threads, so they are kept, and go with the process.
std::vector<c10::intrusive_ptr<c10d::Backend>>& parked_delegates() {
  static auto* parked = new std::vector<c10::intrusive_ptr<c10d::Backend>>;
  return *parked;
}
std::mutex& parked_delegates_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}

RingReduceBackend::RingReduceBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                                     std::chrono::milliseconds timeout, std::shared_ptr<Communicator> cpu,
                                     c10::intrusive_ptr<c10d::Backend> fallback,
                                     c10::intrusive_ptr<c10d::Backend> cuda_fallback, Algorithm algorithm,
                                     bool announce, std::shared_ptr<Membership> membership,
                                     Compression compression)
    : c10d::Backend(rank, size),
      store_(std::move(store)),
      timeout_(timeout),
      watched_(std::make_shared<Watched>()),
      cpu_(std::move(cpu)),
      membership_(std::move(membership)),
      fallback_(std::move(fallback)),
      cuda_fallback_(std::move(cuda_fallback)),
      algorithm_(algorithm),
      compression_(compression),
      announce_(announce) {
  if (membership_) {
    watch(cpu_);
    if (cuda_fallback_) watched_->nccl_delegate.emplace(cuda_fallback_);
    // A peer gone silent (a host whose link went down sends no FIN) ends the transfers waiting for it.
    membership_->on_loss([watched = std::weak_ptr<Watched>(watched_)] {
      if (const std::shared_ptr<Watched> held = watched.lock()) held->end();
    });
  }
  Live<RingReduceBackend>::all().add(this);
}

void RingReduceBackend::watch(const std::shared_ptr<Communicator>& communicator) {
  TORCH_CHECK(membership_, "this ringreduce backend was made without a membership");
  communicator->watch(membership_);
  watched_->add(communicator);
}

c10::intrusive_ptr<c10d::Backend> RingReduceBackend::shrink(const std::vector<int64_t>& ranks_to_exclude,
                                                            int shrink_flags,
                                                            const c10::intrusive_ptr<c10d::Backend::Options>&) {
  TORCH_CHECK(membership_, "this ringreduce backend was made without a membership and cannot shrink");
  std::vector<int> excluded(ranks_to_exclude.begin(), ranks_to_exclude.end());
  std::sort(excluded.begin(), excluded.end());
  py::gil_scoped_acquire gil;
  const py::object shrunk = py::module_::import("ringreduce.backend")
                                .attr("_shrink")(c10::intrusive_ptr<RingReduceBackend>::reclaim_copy(this), excluded,
                                                 shrink_flags);
  return shrunk.cast<c10::intrusive_ptr<RingReduceBackend>>();
}

void RingReduceBackend::drop_delegates_at_exit() {
  std::vector<c10::intrusive_ptr<c10d::Backend>> dropped;
  {
    auto& live = Live<RingReduceBackend>::all();
    std::lock_guard<std::mutex> lock(live.mutex);
    for (RingReduceBackend* backend : live.objects) {
      std::lock_guard<std::mutex> own(backend->mutex_);
      dropped.push_back(std::move(backend->fallback_));
      dropped.push_back(std::move(backend->cuda_fallback_));
      backend->delegates_dropped_ = true;
    }
  }
  dropped.clear();  // outside the locks: gloo's destructor waits for its threads
}

RingReduceBackend::~RingReduceBackend() {
  Live<RingReduceBackend>::all().remove(this);
  // torch drops a group's last reference with the GIL held. gloo's destructor joins its threads,
  // and the last work one of them drops may hold tensors whose Python objects only the GIL frees:
  // the members go without it.
  std::optional<py::gil_scoped_release> without_gil;
  if (Py_IsInitialized() && PyGILState_Check()) without_gil.emplace();
  if (membership_) membership_->on_loss(nullptr);
  if (fallback_ && watched_->has_ended() && watched_->delegated_op_running()) {
    std::lock_guard<std::mutex> lock(parked_delegates_mutex());
    parked_delegates().push_back(std::move(fallback_));
  }
  fallback_.reset();
  cuda_fallback_.reset();
  gpus_.clear();
  cpu_.reset();
  membership_.reset();
}

uint64_t RingReduceBackend::getSequenceNumberForGroup() {
  std::lock_guard<std::mutex> lock(mutex_);
  return sequence_;
}

Communicator& RingReduceBackend::communicator(const at::Tensor& tensor) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++sequence_;
  if (!tensor.is_cuda()) return *cpu_;
#if defined(RINGREDUCE_WITH_CUDA)
  const int device = tensor.device().index();
  for (const auto& [index, gpu] : gpus_) {
    if (index == device) return *gpu;
  }
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(detail::concat("nccl/", gpus_.size(), "/"), store_);
  gpus_.emplace_back(device, make_nccl_communicator(*prefixed, getRank(), getSize(), device, timeout_));
  if (membership_) watch(gpus_.back().second);
  return *gpus_.back().second;
#else
  TORCH_CHECK(false, "this ringreduce build has no CUDA part; build it with CUDA or use cuda:nccl for CUDA tensors");
#endif
}

c10::intrusive_ptr<c10d::Backend> RingReduceBackend::fallback(const std::vector<at::Tensor>& tensors, const char* op) {
  const bool cuda = on_gpu(tensors);
  c10::intrusive_ptr<c10d::Backend> target;
  bool first = false;
  {
    // Read under the lock and held for the call: drop_delegates_at_exit() may take them meanwhile.
    std::lock_guard<std::mutex> lock(mutex_);
    target = cuda ? cuda_fallback_ : fallback_;
    if (target && announce_) first = announced_.insert(op).second;
  }
  TORCH_CHECK(target || !delegates_dropped_, "the ringreduce backend's ", cuda ? "NCCL" : "gloo", " delegate for ", op,
              " was released at interpreter exit");
  TORCH_CHECK(target || !cuda, "the ringreduce backend sends ", op, " on CUDA tensors to torch's NCCL "
              "backend, which this torch lacks (or CUDA was not available when the group was made); initialise with "
              "backend=\"cpu:ringreduce,cuda:gloo\" or use CPU tensors");
  TORCH_CHECK(target, "the ringreduce backend has no gloo delegate for ", op);
  if (first) {
    debug_info(detail::concat("backend rank ", getRank(), "/", getSize(), ": ", op,
                              cuda ? " (CUDA) goes to nccl" : " goes to gloo"));
  }
  return target;
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::delegate(const std::vector<at::Tensor>& tensors, const char* op,
                                                           const std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)>& run) {
  c10::intrusive_ptr<c10d::Work> work = run(*fallback(tensors, op));
  if (!membership_ || on_gpu(tensors)) return work;  // torch's NCCL delegate is aborted on a loss instead
  watched_->add(work);
  return c10::make_intrusive<LossBoundedWork>(std::move(work), watched_, membership_, op);
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  const at::Tensor tensor = single(tensors, "allreduce");
  if (tensor.is_sparse()) return allreduce_sparse(tensors, opts);  // gloo (and NCCL) reduce those
  const ReduceOp op = engine_op(opts.reduceOp);
  Communicator& comm = communicator(tensor);
  Call call = all_reduce_call(comm, reducible(tensor, op), op, algorithm_, 0, 0, compression_);
  call.results = {tensor};
  return finish(comm, std::move(call), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "allreduce_coalesced needs at least one tensor");
  const ReduceOp op = engine_op(opts.reduceOp);
  std::vector<at::Tensor> parts;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type() && t.device() == tensors[0].device(),
                "allreduce_coalesced needs tensors of one dtype and device, got ", tensors[0].scalar_type(), " on ",
                tensors[0].device(), " and ", t.scalar_type(), " on ", t.device());
    parts.push_back(reducible(t, op));
  }
  // Horovod's tensor fusion: one flat buffer, one collective.
  std::vector<Copy> back;
  const at::Tensor buffer = fused(parts, &back);
  Communicator& comm = communicator(buffer);
  Call call = all_reduce_call(comm, buffer, op, algorithm_, 0, 0, compression_);
  call.after = std::move(back);
  call.results = tensors;
  return finish(comm, std::move(call), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  const at::Tensor tensor = single(tensors, "broadcast");
  Communicator& comm = communicator(tensor);
  return finish(comm, broadcast_call(comm, tensor, static_cast<int>(opts.rootRank), 0), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& opts) {
  Communicator& comm = communicator(input);
  return finish(comm, all_gather_call(comm, output, input, chunked_algorithm(), 0), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  const at::Tensor input = single(inputs, "allgather");
  TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == getSize(),
              "allgather needs one list of ", getSize(), " output tensors");
  const std::int64_t piece = largest_piece(outputs[0], input, getRank(), "allgather");
  Communicator& comm = communicator(input);
  // Each rank's piece sits at a stride of the largest; the padding travels but is never read.
  const at::Tensor buffer = at::empty({piece * getSize()}, input.options());
  Call call = all_gather_call(comm, buffer, buffer.narrow(0, getRank() * piece, piece), chunked_algorithm(), 0);
  call.before = {{input.reshape({-1}), buffer.narrow(0, getRank() * piece, input.numel())}};
  call.after.clear();
  for (int r = 0; r < getSize(); ++r) {
    const at::Tensor& out = outputs[0][r];
    call.after.push_back({buffer.narrow(0, r * piece, out.numel()).view(out.sizes()), out});
  }
  call.results = outputs[0];
  return finish(comm, std::move(call), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  const ReduceOp op = engine_op(opts.reduceOp);
  Communicator& comm = communicator(input);
  Call call =
      reduce_scatter_call(comm, reducible(output, op), reducible(input, op), op, chunked_algorithm(), 0, compression_);
  call.results = {output};
  return finish(comm, std::move(call), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  const at::Tensor output = single(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == getSize(),
              "reduce_scatter needs one list of ", getSize(), " input tensors");
  const std::int64_t piece = largest_piece(inputs[0], output, getRank(), "reduce_scatter");
  const ReduceOp op = engine_op(opts.reduceOp);
  const std::int64_t real = output.is_complex() ? 2 : 1;  // complex pieces are reduced as real pairs
  // The pieces side by side at a stride of the largest, zero-padded: the padding is reduced too,
  // but only this rank's piece, without its padding, is kept.
  at::Tensor input = at::zeros({piece * real * getSize()}, reducible(output, op).options());
  for (int r = 0; r < getSize(); ++r) {
    const at::Tensor flat = reducible(inputs[0][r], op).reshape({-1});
    input.narrow(0, r * piece * real, flat.numel()).copy_(flat);
  }
  Communicator& comm = communicator(input);
  const at::Tensor mine = at::empty({piece * real}, input.options());
  Call call = reduce_scatter_call(comm, mine, input, op, chunked_algorithm(), 0, compression_);
  const at::Tensor out = reducible(output, op);
  call.after.push_back({mine.narrow(0, 0, out.numel()).view(out.sizes()), out});
  call.results = {output};
  return finish(comm, std::move(call), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::barrier(const c10d::BarrierOptions& opts) {
  // Every rank meets in a one-element all-reduce on each communicator it holds. On a GPU one it runs
  // behind the collectives already queued there, and the host waits until the GPU has done them,
  // as torch's NCCL barrier does; then on the CPU one.
  std::vector<std::pair<int, std::shared_ptr<Communicator>>> gpus;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    gpus = gpus_;
  }
  for (const auto& [device, gpu] : gpus) {
    const at::Tensor token = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(at::kCUDA, device));
    const c10::intrusive_ptr<c10d::Work> work =
        run_now(*gpu, all_reduce_call(*gpu, token, ReduceOp::Sum, Algorithm::Ring, 0, 0));
    // Polled, not synchronized: a GPU that never gets there ends in the group's timeout.
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (!work->isCompleted()) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw TimeoutError(detail::concat(timed_out_after(timeout_), "barrier() waiting for the collectives "
                                          "queued on cuda:", device, " to finish"));
      }
      std::this_thread::sleep_for(kBarrierPoll);
    }
  }
  const at::Tensor token = at::zeros({1}, at::kInt);
  return finish(*cpu_, all_reduce_call(*cpu_, token, ReduceOp::Sum, Algorithm::Auto, 0, 0), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                                   const c10d::AllreduceOptions& opts) {
  // gloo takes sparse tensors through allreduce; torch's NCCL through allreduce_sparse.
  return delegate(tensors, "allreduce of a sparse tensor", [&](c10d::Backend& b) {
    return on_gpu(tensors) ? b.allreduce_sparse(tensors, opts) : b.allreduce(tensors, opts);
  });
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::AllgatherOptions& opts) {
  return delegate(inputs, "allgather_coalesced", [&](c10d::Backend& b) { return b.allgather_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                  std::vector<at::Tensor>& inputs,
                                                                                  const c10d::AllgatherOptions& opts) {
  return delegate(inputs, "allgather_into_tensor_coalesced",
                  [&](c10d::Backend& b) { return b.allgather_into_tensor_coalesced(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  return delegate(inputs, "reduce_scatter_tensor_coalesced",
                  [&](c10d::Backend& b) { return b.reduce_scatter_tensor_coalesced(outputs, inputs, opts); });
}

void RingReduceBackend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  fallback({}, "monitoredBarrier")->monitoredBarrier(opts, wait_all_ranks);
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  const at::Tensor tensor = single(tensors, "reduce");
  const ReduceOp op = engine_op(opts.reduceOp);
  Communicator& comm = communicator(tensor);
  Call call = reduce_call(comm, reducible(tensor, op), op, static_cast<int>(opts.rootRank), 0);
  call.results = {tensor};
  return finish(comm, std::move(call), opts.asyncOp);
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::GatherOptions& opts) {
  return delegate(inputs, "gather", [&](c10d::Backend& b) { return b.gather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  return delegate(outputs, "scatter", [&](c10d::Backend& b) { return b.scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<int64_t>& output_splits,
                                                                std::vector<int64_t>& input_splits,
                                                                const c10d::AllToAllOptions& opts) {
  return delegate({input}, "alltoall",
                  [&](c10d::Backend& b) { return b.alltoall_base(output, input, output_splits, input_splits, opts); });
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  return delegate(inputs, "alltoall", [&](c10d::Backend& b) { return b.alltoall(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  return delegate(tensors, "send", [&](c10d::Backend& b) { return b.send(tensors, dst, tag); });
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  return delegate(tensors, "recv", [&](c10d::Backend& b) { return b.recv(tensors, src, tag); });
}

c10::intrusive_ptr<c10d::Work> RingReduceBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return delegate(tensors, "recv", [&](c10d::Backend& b) { return b.recvAnysource(tensors, tag); });
}

}  // namespace ringreduce
