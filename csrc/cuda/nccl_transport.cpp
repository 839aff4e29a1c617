#include "cuda/nccl_transport.h"

#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/event_completion.h"
#include "cuda/header_check.h"
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

// An NCCL error in a collective whose ranks disagree is most often the disagreement's doing (a
// message of another size), found before the device check of the rank that sees the disagreement
// has been polled (every 10 ms) and its notice published. A rank that fails so waits this long for
// that notice, so that every rank reports the disagreement, not its consequence.
constexpr std::chrono::milliseconds kDisagreementGrace{200};
// How often it looks in the store meanwhile.
constexpr std::chrono::milliseconds kGracePoll{5};

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

// What the watchdog polls beyond the collective's event: the mismatch flag the compare kernel
// raises, NCCL's asynchronous error, and a notice a peer published in the store.
class NcclTransport::Completion final : public EventCompletion {
 public:
  explicit Completion(NcclTransport& transport)
      : EventCompletion(transport.queue_, detail::concat("nccl rank ", transport.rank_)), transport_(transport) {}

  std::optional<AbortNotice> failure() override {
    if (transport_.cancelled_.load()) {
      return AbortNotice{AbortNotice::Kind::Failure, detail::concat("ringreduce: nccl rank ", transport_.rank_,
                                                                    ": cancelled (a rank of the group was lost)")};
    }
    if (std::optional<AbortNotice> mismatch = transport_.mismatch_found()) return mismatch;
    if (std::optional<AbortNotice> device = EventCompletion::failure()) return device;
    if (std::optional<AbortNotice> async = transport_.nccl_error()) return async;
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
      if (notice.kind == AbortNotice::Kind::Failure) await_disagreement(*transport_.notices_);
      group = publish_abort(*transport_.notices_, transport_.mismatch_found().value_or(notice));
    } catch (const std::exception&) {
      // the store is gone: this rank reports its own notice
    }
    transport_.end_communicator(true);
    return group;
  }

 private:
  // Until a notice is published or this rank's own check reports a disagreement, at most kDisagreementGrace.
  void await_disagreement(Rendezvous& notices) {
    const auto deadline = std::chrono::steady_clock::now() + kDisagreementGrace;
    while (!published_abort(notices) && !transport_.mismatch_found() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(kGracePoll);
    }
  }

  NcclTransport& transport_;
  int polls_ = 0;  // only the watchdog's thread touches it
};

NcclTransport::NcclTransport(NcclApi& nccl, std::unique_ptr<Rendezvous> notices, int rank, int world,
                             DeviceQueue& queue, DeviceAllocator allocate, std::chrono::milliseconds timeout)
    : rank_(rank),
      world_(world),
      queue_(queue),
      allocate_(std::move(allocate)),
      timeout_(timeout),
      notices_(std::move(notices)),
      nccl_(std::make_shared<NcclComm>(nccl)),
      window_(
          kIssueWindowOps,
          [&api = queue.api()](const std::shared_ptr<void>& event) {
            Failure why = nullptr;
            const EventState state = api.query(static_cast<Event>(event.get()), &why);
            if (state == EventState::Failed) {
              throw std::runtime_error(detail::concat("ringreduce: the GPU reported ", why, " while queuing a collective"));
            }
            return state == EventState::Done;
          },
          [this] {
            if (watchdog_) watchdog_->check();
            std::this_thread::sleep_for(kThrottlePoll);
          }) {
  DeviceApi& api = queue.api();
  const DeviceScope on(api, queue.device());
  std::string id;
  if (rank == 0) {
    check(nccl.unique_id(&id), "ncclGetUniqueId");
    notices_->set("nccl-id", id);
  }
  await_peers(*notices_, rank, world, timeout);
  if (rank != 0) id = notices_->get("nccl-id");
  check(nccl.init_rank(&nccl_->comm, *notices_, world, id, rank), "ncclCommInitRankConfig");
  try {
    slots_ = allocate_(sizeof(HeaderSlots), queue.lane_stream(0));
    const Mapped<MismatchReport> report = allocate_mapped<MismatchReport>(api);
    report_ = report.host;
    report_on_device_ = report.device;
    connect_all(static_cast<const HeaderSlots*>(slots_.get()));
  } catch (...) {
    if (report_ != nullptr) api.free_mapped(report_);
    nccl.destroy(nccl_->comm);
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
  end_communicator(!finished);
  {
    std::lock_guard<std::mutex> lock(nccl_->mutex);
    if (!nccl_->ended) {
      // The ending thread frees the report once NCCL returns; if it never does, the report stays
      // (a few bytes of pinned memory: freeing it would wait for the GPU).
      nccl_->orphaned_report = report_;
      return;
    }
  }
  // NCCL's kernels have returned, so the lanes drain: then the compare kernel's report can go.
  // Device memory goes back to the caching allocator either way; it is reused only in its
  // stream's order.
  for (std::size_t lane = 0; lane < queue_.lanes(); ++lane) queue_.api().synchronize(queue_.lane_stream(lane));
  queue_.api().free_mapped(report_);
}

std::optional<AbortNotice> NcclTransport::mismatch_found() const {
  if (report_->flag == 0) return std::nullopt;
  std::atomic_thread_fence(std::memory_order_acquire);
  return AbortNotice{AbortNotice::Kind::Mismatch, mismatch_message(rank_, world_, *report_)};
}

std::optional<AbortNotice> NcclTransport::nccl_error() {
  std::unique_lock<std::timed_mutex> lock(nccl_->calls, std::try_to_lock);
  if (!lock.owns_lock() || nccl_->ending) return std::nullopt;
  const Failure async = nccl_->api.async_error(nccl_->comm);
  if (async == nullptr) return std::nullopt;
  return AbortNotice{AbortNotice::Kind::Failure, detail::concat("ringreduce: nccl rank ", rank_, ": NCCL reported ", async)};
}

void NcclTransport::raise_if_failed() {
  watchdog_->check();
  if (std::optional<AbortNotice> found = mismatch_found()) found->raise();
  if (std::optional<AbortNotice> found = nccl_error()) found->raise();
}

namespace {

// The communicators of the process still ending, for wait_for_endings().
struct Endings {
  std::mutex mutex;
  std::condition_variable changed;
  int running = 0;
};
Endings& endings() {
  static auto* all = new Endings;  // ending threads may outlive static destruction
  return *all;
}

}  // namespace

bool NcclTransport::wait_for_endings(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(endings().mutex);
  return endings().changed.wait_for(lock, timeout, [] { return endings().running == 0; });
}

void NcclTransport::end_communicator(bool abort) {
  const std::shared_ptr<NcclComm> nccl = nccl_;
  if (!nccl->ending.exchange(true)) {
    const int device = queue_.device();
    const std::chrono::milliseconds grace = timeout_;
    DeviceApi& api = queue_.api();
    {
      const std::lock_guard<std::mutex> lock(endings().mutex);
      ++endings().running;
    }
    std::thread([nccl, device, abort, grace, &api] {
      api.set_device(device);
      // Never under a call in progress: ending the communicator would free memory the call still
      // uses. The issue window keeps calls short, so a call held longer than the grace is stuck for
      // good, and the communicator is left as it is.
      std::unique_lock<std::timed_mutex> lock(nccl->calls, std::defer_lock);
      if (lock.try_lock_for(grace)) {
        if (abort) {
          nccl->api.abort(nccl->comm);
        } else {
          nccl->api.destroy(nccl->comm);
        }
        MismatchReport* orphan = nullptr;
        {
          std::lock_guard<std::mutex> ended(nccl->mutex);
          nccl->ended = true;
          orphan = std::exchange(nccl->orphaned_report, nullptr);
        }
        if (orphan != nullptr) api.free_mapped(orphan);
      }
      const std::lock_guard<std::mutex> counted(endings().mutex);
      --endings().running;
      endings().changed.notify_all();
    }).detach();
  }
}

void NcclTransport::check(Failure failure, const char* what) {
  if (failure == nullptr) return;
  if (nccl_->ending && watchdog_) watchdog_->check();  // the watchdog's notice explains the failure best
  throw std::runtime_error(detail::concat("ringreduce: nccl rank ", rank_, ": ", what, " failed: ", failure));
}

void NcclTransport::begin_collective(const CollectiveHeader& header, bool check_header) {
  watchdog_->check();
  MessageTransport::begin_collective(header, check_header);
  watchdog_->begin(header.sequence, detail::concat("nccl rank ", rank_, ": ", describe(header, header)));
  if (check_header && world_ > 1) {
    auto* slots = static_cast<HeaderSlots*>(slots_.get());
    const Stream stream = queue_.lane_stream(0);
    window_.make_room(1);
    RR_CUDA_CHECK(queue_.api().write_header(slots, header, stream));
    window_.queued(1);
    issue({{true, (rank_ + 1) % world_, &slots->mine, sizeof(CollectiveHeader), 0},
           {false, (rank_ + world_ - 1) % world_, &slots->theirs, sizeof(CollectiveHeader), 0}});
    window_.make_room(1);
    RR_CUDA_CHECK(queue_.api().compare_headers(slots, report_on_device_, stream));
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
  const Stream stream = queue_.lane_stream(group.front().lane);
  window_.make_room(kOpsPerExchange);
  {
    std::lock_guard<std::timed_mutex> lock(nccl_->calls);
    if (nccl_->ending && watchdog_) watchdog_->check();
    RR_CHECK(!nccl_->ending, "the nccl communicator was aborted");
    NcclApi& nccl = nccl_->api;
    check(nccl.group_start(), "ncclGroupStart");
    for (const HeldTransfer& t : group) {
      const Failure posted = t.is_send ? nccl.send(t.data, t.bytes, t.peer, nccl_->comm, stream)
                                       : nccl.recv(t.data, t.bytes, t.peer, nccl_->comm, stream);
      if (posted != nullptr) {
        nccl.group_end();  // the group must close on this thread whatever happens
        check(posted, t.is_send ? "ncclSend" : "ncclRecv");
      }
    }
    check(nccl.group_end(), "ncclGroupEnd");
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
  const DeviceScope on(queue_.api(), queue_.device());
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
