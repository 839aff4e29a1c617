// `nccl`: point-to-point ncclSend/ncclRecv between the ranks of a group, on a communicator the
// group owns (bootstrapped through the group's store, never borrowed from ProcessGroupNCCL).
//
// A lane's transfers and the reductions they feed run in order on that lane's stream, so a
// segment's next send follows its reduction with no event in between, and while one lane reduces
// the other lane's transfer is in flight. The host never blocks for the GPU: a watchdog thread
// polls each collective and aborts the communicator once one is past the group's timeout, or when
// the device header check or a peer's published notice says the group has failed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

#include "core/rendezvous.h"
#include "core/transport.h"
#include "cuda/device_api.h"
#include "cuda/device_queue.h"
#include "transports/exchange_groups.h"
#include "transports/issue_window.h"
#include "transports/watchdog.h"

namespace ringreduce {
namespace cuda {

// Pipeline segment of the nccl transport: 4 MiB, the buffer NCCL itself stages per ring step, so
// each kernel launch (a few microseconds) is amortised over enough bytes. Not yet measured on a GPU.
constexpr std::size_t kNcclSegmentBytes = 4 << 20;

// Stream operations (kernels, NCCL groups, events) the host may queue ahead of the GPU: about half
// of CUDA's launch queue (about a thousand), so a stalled GPU never blocks the host inside a CUDA
// or NCCL call, where the watchdog could not abort it safely; and deep enough for dozens of ring
// steps of microseconds each. Counted in operations, not exchanges: the central root queues N-1
// reductions per exchange. Not yet measured on a GPU.
constexpr std::size_t kIssueWindowOps = 512;
// What one exchange queues on its lane's stream: NCCL's group (an event and a wait on each side of
// its kernel, by NCCL 2.30's enqueue code, so about four operations) and our event after it.
constexpr std::size_t kOpsPerExchange = 5;

class NcclTransport final : public MessageTransport {
 public:
  // Collective over the group: group rank 0 creates the NCCL id and publishes it in the store, every
  // rank waits (up to the timeout) for all the others, and the connections to every peer are made
  // before the first call. `notices` carries abort notices between the ranks' watchdogs. `allocate`
  // gives staging (the torch glue passes torch's caching allocator, so staging shares the memory a
  // training process has reserved).
  NcclTransport(NcclApi& nccl, std::unique_ptr<Rendezvous> notices, int rank, int world, DeviceQueue& queue,
                DeviceAllocator allocate, std::chrono::milliseconds timeout);
  // Waits for the collectives in flight (bounded by the timeout), then ends the communicator on a
  // thread of its own without waiting for it: ncclCommDestroy is collective among a node's ranks,
  // so a peer still running, or gone, would otherwise hold this rank's teardown.
  ~NcclTransport() override;

  // Waits up to `timeout` until no communicator of the process is still ending (at exit, before
  // the CUDA runtime goes); whether none is.
  static bool wait_for_endings(std::chrono::milliseconds timeout);

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  const char* name() const override { return "nccl"; }
  std::size_t default_segment_bytes() const override { return kNcclSegmentBytes; }
  // NCCL completes a group of operations together, on one stream: a receive posted ahead would
  // hold its whole group (and the stream behind it) until a send its peer posts only later.
  bool can_post_ahead() const override { return false; }
  std::size_t max_lanes() const override { return queue_.lanes(); }
  std::size_t default_lanes() const override { return queue_.lanes(); }

  // Raises what the watchdog found; sends the header to the next rank and compares the previous
  // rank's on the device (with `check`); every lane starts after what the caller queued before...
  void begin_collective(const CollectiveHeader& header, bool check) override;
  // Nothing more: the device compares each rank's header with the previous rank's only, and empty
  // NCCL messages carry none. A broadcast or reduce whose ranks disagree beyond their neighbours
  // ends in the watchdog's timeout on the ranks that wait.
  void agree_with_every_peer() override {}
  void select_lane(std::size_t lane) override;
  // ...and the caller's later work waits for every lane; the watchdog polls the collective.
  void end_collective() override;
  // What the watchdog found, or what it will find at its next poll: the device's mismatch report
  // and NCCL's asynchronous error.
  void raise_if_failed() override;
  // Thread-safe: the watchdog fails the communicator at its next poll (ncclCommAbort), so every wait
  // of this rank raises within a poll or two. What a membership that finds a rank lost calls.
  void cancel() override { cancelled_.store(true); }

  Request isend(int peer, const void* data, std::size_t bytes) override;
  Request irecv(int peer, void* data, std::size_t bytes) override;

 protected:
  void wait_transfer(Request request) override;
  std::shared_ptr<void> allocate_staging(std::size_t bytes) override;
  // Publishes the notice for the other ranks and aborts the communicator.
  AbortNotice abort_transfers(const AbortNotice& notice) override;

 private:
  class Completion;
  // What an abort or a teardown running on a thread of its own shares with the transport: it may
  // outlive the transport when NCCL does not return (its proxy waits for peers on the same node).
  struct NcclComm {
    explicit NcclComm(NcclApi& api) : api(api) {}
    NcclApi& api;
    Comm comm = nullptr;
    std::timed_mutex calls;  // held around NCCL calls, so the communicator never goes under one
    std::atomic<bool> ending{false};  // an abort or a destroy has started
    std::mutex mutex;
    bool ended = false;
    // The compare kernel's report, left by a transport that went before the communicator ended:
    // the ending thread frees it once NCCL has returned (a kernel may write it until then).
    MismatchReport* orphaned_report = nullptr;
  };
  void issue(const std::vector<HeldTransfer>& group);
  // What shows without waiting (any thread): the compare kernel's report, and NCCL's asynchronous
  // error (not asked while an issue call holds the communicator: asked again later).
  std::optional<AbortNotice> mismatch_found() const;
  std::optional<AbortNotice> nccl_error();
  // One kernel launched on a lane, counted by the window.
  void before_reduction() override { window_.make_room(1); }
  void after_reduction() override { window_.queued(1); }
  void connect_all(const HeaderSlots* slots);
  // Ends the communicator once, on a thread of its own, without waiting for it: ncclCommAbort, or
  // ncclCommDestroy after work that finished.
  void end_communicator(bool abort);
  // Throws for an NCCL call that did not succeed, naming it.
  void check(Failure failure, const char* what);

  int rank_;
  int world_;
  DeviceQueue& queue_;
  DeviceAllocator allocate_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Rendezvous> notices_;
  std::atomic<bool> cancelled_{false};
  std::shared_ptr<NcclComm> nccl_;
  std::shared_ptr<void> slots_;          // HeaderSlots in device memory
  MismatchReport* report_ = nullptr;     // mapped host memory the compare kernel writes
  MismatchReport* report_on_device_ = nullptr;
  ExchangeGroups unissued_;              // posted and not yet handed to NCCL
  // Keeps the host within kIssueWindowOps of the GPU, polling (never blocking in CUDA) and raising
  // what the watchdog finds meanwhile.
  IssueWindow window_;
  std::unique_ptr<Watchdog> watchdog_;   // last: its thread reads the members above
};

}  // namespace cuda
}  // namespace ringreduce
