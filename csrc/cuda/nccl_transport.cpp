#include "cuda/nccl_transport.h"

#include <cstring>
#include <thread>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/event_completion.h"
#include "cuda/mapped_memory.h"

namespace ringreduce {
namespace cuda {
namespace {

// How often set-up looks in the store for peers that have not arrived yet: one store round trip
// (tens of microseconds) per millisecond of waiting.
constexpr std::chrono::milliseconds kArrivalPoll{1};

// How often the host looks at the GPU while it is kIssueWindowOps ahead: short beside the
// window's worth of GPU work, long beside an event query (about a microsecond).
constexpr std::chrono::microseconds kThrottlePoll{20};

// The watchdog asks the store for a peer's abort notice once every this many polls (100 ms): a
// store round trip costs tens of microseconds, and the timeouts it serves are seconds.
constexpr int kStorePollEvery = 10;

// Every rank marks its arrival in the store and waits, up to the timeout, for all the others, so
// that NCCL's own set-up (which has no timeout of its own) starts only once the whole group is there.
void await_peers(Rendezvous& rendezvous, int rank, int world, std::chrono::milliseconds timeout) {
  rendezvous.set(detail::concat("arrived/", rank), "1");
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int peer = 0; peer < world; ++peer) {
    while (!rendezvous.has(detail::concat("arrived/", peer))) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw TimeoutError(detail::concat(timed_out_after(timeout), "nccl rank ", rank, " waiting for rank ", peer,
                                          " to create its NCCL communicator; is every rank "
                                          "of the group making the same call on a CUDA tensor?"));
      }
      std::this_thread::sleep_for(kArrivalPoll);
    }
  }
}

std::string mismatch_message(int rank, int world, const MismatchReport& report) {
  try {
    throw_mismatch(rank, report.mine, (rank + world - 1) % world, report.theirs);
  } catch (const MismatchError& error) {
    return std::string(error.what()) + " (found on the GPU)";
  }
}

}  // namespace

std::string nccl_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // Codes from 2.9 on are major*10000 + minor*100 + patch.
  return detail::concat(code / 10000, ".", (code / 100) % 100, ".", code % 100);
}

// What the watchdog polls beyond the collective's event: the mismatch flag the compare kernel
// raises, NCCL's asynchronous error, and a notice a peer published in the store.
class NcclTransport::Completion final : public EventCompletion {
 public:
  explicit Completion(NcclTransport& transport)
      : EventCompletion(transport.queue_, detail::concat("nccl rank ", transport.rank_)), transport_(transport) {}

  std::optional<AbortNotice> failure() override {
    const int rank = transport_.rank_;
    if (transport_.report_->flag != 0) {
      std::atomic_thread_fence(std::memory_order_acquire);
      return AbortNotice{AbortNotice::Kind::Mismatch, mismatch_message(rank, transport_.world_, *transport_.report_)};
    }
    if (std::optional<AbortNotice> device = EventCompletion::failure()) return device;
    if (std::optional<AbortNotice> async = nccl_error()) return async;
    if (++polls_ % kStorePollEvery != 0) return std::nullopt;
    try {
      return published_abort(*transport_.notices_);
    } catch (const std::exception&) {
      return std::nullopt;  // the store is gone (its host rank exited): nothing more to learn there
    }
  }

  AbortNotice abort(const AbortNotice& notice) override {
    AbortNotice group = notice;
    try {
      group = publish_abort(*transport_.notices_, notice);
    } catch (const std::exception&) {
      // the store is gone: this rank reports its own notice
    }
    transport_.end_communicator(true, std::chrono::milliseconds(0));
    return group;
  }

 private:
  // Skipped while an issue call holds the communicator: the next round asks again.
  std::optional<AbortNotice> nccl_error() {
    NcclComm& nccl = *transport_.nccl_;
    std::unique_lock<std::timed_mutex> lock(nccl.calls, std::try_to_lock);
    ncclResult_t async = ncclSuccess;
    if (!lock.owns_lock() || nccl.ending || ncclCommGetAsyncError(nccl.comm, &async) != ncclSuccess ||
        async == ncclSuccess || async == ncclInProgress) {
      return std::nullopt;
    }
    return AbortNotice{AbortNotice::Kind::Failure, detail::concat("ringreduce: nccl rank ", transport_.rank_,
                                                                  ": NCCL reported ", ncclGetErrorString(async))};
  }

  NcclTransport& transport_;
  int polls_ = 0;  // only the watchdog's thread touches it
};

NcclTransport::NcclTransport(std::unique_ptr<Rendezvous> notices, int rank, int world, DeviceQueue& queue,
                             DeviceAllocator allocate, std::chrono::milliseconds timeout)
    : rank_(rank),
      world_(world),
      queue_(queue),
      allocate_(std::move(allocate)),
      timeout_(timeout),
      notices_(std::move(notices)),
      window_(
          kIssueWindowOps,
          [](const std::shared_ptr<void>& event) {
            const cudaError_t state = cudaEventQuery(static_cast<cudaEvent_t>(event.get()));
            if (state != cudaErrorNotReady) RR_CUDA_CHECK(state);
            return state == cudaSuccess;
          },
          [this] {
            if (watchdog_) watchdog_->check();
            std::this_thread::sleep_for(kThrottlePoll);
          }) {
  const DeviceScope on(queue.device());
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t got = ncclGetUniqueId(&id);
    RR_CHECK(got == ncclSuccess, "ncclGetUniqueId failed: ", ncclGetErrorString(got));
    notices_->set("nccl-id", std::string(id.internal, sizeof id.internal));
  }
  await_peers(*notices_, rank, world, timeout);
  if (rank != 0) {
    const std::string published = notices_->get("nccl-id");
    RR_CHECK(published.size() == sizeof id.internal, "the NCCL id in the store has ", published.size(), " bytes");
    std::memcpy(id.internal, published.data(), sizeof id.internal);
  }
  // Blocking: issuing a group costs microseconds on the calling thread. A non-blocking communicator
  // hands every ncclGroupEnd to a new thread (NCCL 2.23 on) and must be polled, about 0.1 ms per
  // ring step. The watchdog and the issue window, not the calls, bound how long anything waits.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  check(ncclCommInitRankConfig(&nccl_->comm, world, id, rank, &config), "ncclCommInitRankConfig");
  try {
    slots_ = allocate_(sizeof(HeaderSlots), queue.lane_stream(0));
    const Mapped<MismatchReport> report = allocate_mapped<MismatchReport>();
    report_ = report.host;
    report_on_device_ = report.device;
    connect_all(static_cast<const HeaderSlots*>(slots_.get()));
  } catch (...) {
    if (report_ != nullptr) cudaFreeHost(report_);
    ncclCommDestroy(nccl_->comm);
    throw;
  }
  watchdog_ = std::make_unique<Watchdog>(std::make_unique<Completion>(*this), timeout);
}

void NcclTransport::connect_all(const HeaderSlots* slots) {
  // NCCL connects peers on their first transfer, inside the call that issues it, where a missing
  // peer would block the host. One byte to and from every peer now, while every rank is known to be
  // here, makes all the connections the ring, the central reducer and the header check use.
  if (world_ == 1) return;
  std::vector<HeldTransfer> group;
  auto* bytes = reinterpret_cast<char*>(const_cast<HeaderSlots*>(slots));
  for (int peer = 0; peer < world_; ++peer) {
    if (peer == rank_) continue;
    group.push_back({true, peer, bytes, 1, 0});
    group.push_back({false, peer, bytes + 1, 1, 0});
  }
  issue(group);
}

NcclTransport::~NcclTransport() {
  const bool finished = watchdog_->drain();  // aborts the work still running after the timeout
  watchdog_.reset();
  if (end_communicator(!finished, timeout_)) {
    // NCCL's kernels have returned, so the lanes drain: then the compare kernel's report can go.
    for (std::size_t lane = 0; lane < queue_.lanes(); ++lane) cudaStreamSynchronize(queue_.lane_stream(lane));
    cudaFreeHost(report_);
  }
  // Otherwise NCCL never returned and a kernel may still write the report: it stays allocated (a
  // few bytes of pinned memory), since freeing pinned memory would wait for the GPU. Device memory
  // goes back to the caching allocator either way; it is reused only in its stream's order.
}

bool NcclTransport::end_communicator(bool abort, std::chrono::milliseconds wait) {
  const std::shared_ptr<NcclComm> nccl = nccl_;
  if (!nccl->ending.exchange(true)) {
    const int device = queue_.device();
    const std::chrono::milliseconds grace = timeout_;
    std::thread([nccl, device, abort, grace] {
      cudaSetDevice(device);
      // Never under a call in progress: ending the communicator would free memory the call still
      // uses. The issue window keeps calls short, so a call held longer than the grace is stuck for
      // good, and the communicator is left as it is.
      std::unique_lock<std::timed_mutex> lock(nccl->calls, std::defer_lock);
      if (lock.try_lock_for(grace)) {
        if (abort) {
          ncclCommAbort(nccl->comm);
        } else {
          ncclCommDestroy(nccl->comm);
        }
        std::lock_guard<std::mutex> ended(nccl->mutex);
        nccl->ended = true;
      }
      nccl->ended_changed.notify_all();
    }).detach();
  }
  std::unique_lock<std::mutex> lock(nccl->mutex);
  return nccl->ended_changed.wait_for(lock, wait, [&] { return nccl->ended; });
}

void NcclTransport::check(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return;
  if (nccl_->ending && watchdog_) watchdog_->check();  // the watchdog's notice explains the failure best
  throw std::runtime_error(detail::concat("ringreduce: nccl rank ", rank_, ": ", what, " failed: ",
                                          ncclGetErrorString(result)));
}

void NcclTransport::begin_collective(const CollectiveHeader& header, bool check_header) {
  watchdog_->check();
  MessageTransport::begin_collective(header, check_header);
  watchdog_->begin(header.sequence, detail::concat("nccl rank ", rank_, ": ", describe(header, header)));
  if (check_header && world_ > 1) {
    auto* slots = static_cast<HeaderSlots*>(slots_.get());
    const cudaStream_t stream = queue_.lane_stream(0);
    window_.make_room(1);
    RR_CUDA_CHECK(launch_write_header(slots, header, stream));
    window_.queued(1);
    issue({{true, (rank_ + 1) % world_, &slots->mine, sizeof(CollectiveHeader), 0},
           {false, (rank_ + world_ - 1) % world_, &slots->theirs, sizeof(CollectiveHeader), 0}});
    window_.make_room(1);
    RR_CUDA_CHECK(launch_compare_headers(slots, report_on_device_, stream));
    window_.queued(1);
  }
  queue_.fork_lanes();
}

void NcclTransport::select_lane(std::size_t lane) {
  MessageTransport::select_lane(lane);
  queue_.select_lane(lane);
}

void NcclTransport::end_collective() {
  RR_CHECK(unissued_.empty(), unissued_.size(), " transfers were posted and never waited for");
  queue_.join_lanes();
  watchdog_->end(header_.sequence);
}

Request NcclTransport::isend(int peer, const void* data, std::size_t bytes) {
  return unissued_.hold({true, peer, const_cast<void*>(data), bytes, lane_});
}

Request NcclTransport::irecv(int peer, void* data, std::size_t bytes) {
  return unissued_.hold({false, peer, data, bytes, lane_});
}

void NcclTransport::issue(const std::vector<HeldTransfer>& group) {
  // One NCCL group per exchange, so NCCL runs its sends and receives together. On the lane's stream
  // the group starts after the lane's earlier work (the reduction that produced what it sends), and
  // the lane's later work (the reduction of what it receives) waits for it.
  const cudaStream_t stream = queue_.lane_stream(group.front().lane);
  window_.make_room(kOpsPerExchange);
  {
    std::lock_guard<std::timed_mutex> lock(nccl_->calls);
    if (nccl_->ending && watchdog_) watchdog_->check();
    RR_CHECK(!nccl_->ending, "the nccl communicator was aborted");
    check(ncclGroupStart(), "ncclGroupStart");
    for (const HeldTransfer& t : group) {
      const ncclResult_t posted = t.is_send ? ncclSend(t.data, t.bytes, ncclUint8, t.peer, nccl_->comm, stream)
                                            : ncclRecv(t.data, t.bytes, ncclUint8, t.peer, nccl_->comm, stream);
      if (posted != ncclSuccess) {
        ncclGroupEnd();  // the group must close on this thread whatever happens
        check(posted, t.is_send ? "ncclSend" : "ncclRecv");
      }
    }
    check(ncclGroupEnd(), "ncclGroupEnd");
  }
  window_.queued(kOpsPerExchange);
  window_.mark(queue_.events().record(stream));
}

void NcclTransport::wait_transfer(Request request) {
  // Once issued, a transfer is complete in stream order for whatever its lane queues next.
  const std::vector<HeldTransfer> group = unissued_.release(request);
  if (!group.empty()) issue(group);
}

std::shared_ptr<void> NcclTransport::allocate_staging(std::size_t bytes) {
  const DeviceScope on(queue_.device());
  return allocate_(bytes, queue_.lane_stream(lane_));
}

AbortNotice NcclTransport::abort_transfers(const AbortNotice& notice) {
  unissued_.clear();
  window_.clear();
  // Work still queued on the lanes must stay ahead of the caller's (and of the allocator reusing
  // its tensors, recorded on the main stream). A CUDA error here is dropped: the failure being
  // reported is the one that matters.
  try {
    queue_.join_lanes();
  } catch (const std::exception&) {
  }
  return watchdog_->abort(notice);
}

}  // namespace cuda
}  // namespace ringreduce
