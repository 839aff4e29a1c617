// `pg`: point-to-point send/recv of a torch.distributed backend (gloo on CPU), driven from C++.
// This is how ranks on several hosts talk: torch's own engine moves the bytes.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <memory>
#include <vector>

#include "core/rendezvous.h"
#include "core/transport.h"

namespace ringreduce {

// Segment size of the pg transport. Each message costs gloo a work object and a round of its
// event loop, so large segments pay: at 16 and 64 MiB on 2 ranks, 4 MiB segments gave 1.2-1.4 GB/s
// busbw against 0.4-0.5 at 256 KiB and 0.8-1.0 at 1 MiB (benchmarks/RESULTS.md).
constexpr std::size_t kProcessGroupSegmentBytes = 4 << 20;

// Lanes the pg transport can keep apart: each lane has its own tag sequence per peer, so lanes
// match independently. gloo already overlaps the transfers the ring posts ahead, so one lane stays
// the default; RINGREDUCE_LANES asks for more.
constexpr std::size_t kProcessGroupMaxLanes = 4;

// Its messages carry data only: the communicator checks each call with agree_on_call() first (at
// most log2(N) + 1 small messages per rank; a doubling all-reduce carries the check in its own
// messages), so a disagreement is seen by every rank before any data moves, whatever the algorithm. No data receive is posted before the sizes are known to match
// everywhere: gloo aborts the whole process when a message is longer than the buffer posted for
// it. Aborts are published in the group's store and the backend is dropped, which closes its
// connections and wakes every peer.
class ProcessGroupTransport final : public MessageTransport {
 public:
  ProcessGroupTransport(c10::intrusive_ptr<c10d::Backend> backend, std::unique_ptr<Rendezvous> notices,
                        std::chrono::milliseconds timeout);

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  const char* name() const override { return "pg"; }
  std::size_t default_segment_bytes() const override { return kProcessGroupSegmentBytes; }
  std::size_t max_lanes() const override { return kProcessGroupMaxLanes; }

  bool compares_headers() const override { return false; }
  // agree_on_call() has compared every rank's call already.
  void agree_with_every_peer() override {}
  Request isend(int peer, const void* data, std::size_t bytes) override;
  Request irecv(int peer, void* data, std::size_t bytes) override;
  // Aborts the work being waited for (gloo wakes its waiter), and every later wait raises.
  void cancel() override;

 protected:
  AbortNotice abort_transfers(const AbortNotice& notice) override;
  void wait_transfer(Request request) override;

 private:
  struct Pending {
    c10::intrusive_ptr<c10d::Work> work;
    std::vector<at::Tensor> tensors;  // views of the bytes, alive until the work is done
    int peer;
    bool is_send;
  };
  Request post(int peer, void* data, std::size_t bytes, bool is_send);
  void wait_work(Pending& pending);
  // Raises the group's published notice, or else what went wrong with a transfer with `peer`.
  [[noreturn]] void fail_transfer(int peer, bool is_send, const std::exception& error);
  void forget_waiting();

  c10::intrusive_ptr<c10d::Backend> backend_;
  std::unique_ptr<Rendezvous> notices_;
  bool store_unreachable_ = false;  // a notice call failed or got no answer in time: the abort does not try again
  const int rank_;
  const int world_;
  std::chrono::milliseconds timeout_;
  // Messages posted so far per lane and peer (index lane * world + peer); they make the tags.
  std::vector<int> sends_posted_, recvs_posted_;
  std::unordered_map<std::int64_t, Pending> pending_;
  std::int64_t next_id_ = 0;
  // What cancel() reaches from another thread: the work a wait is blocked on.
  std::mutex waiting_mutex_;
  c10::intrusive_ptr<c10d::Work> waiting_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace ringreduce
