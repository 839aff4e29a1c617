// `shm`: ranks of one host exchange through POSIX shared memory.
//
// Each rank owns one segment holding a bounded staging area: for every peer, a channel of
// kShmSlots slots of kShmSlotBytes (4 MiB per peer in use). A send copies its bytes into the
// sender's slots (the one copy a shared address space needs); the receiver reads them straight out
// of the sender's slot, either copying into its buffer or reducing into it with no intermediate copy. Flags in the
// segment say which slots are full; a rank with nothing to do spins briefly, then sleeps on a
// futex in its own segment that peers ring, with a timeout and a check that peers are alive.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "core/rendezvous.h"
#include "core/transport.h"

namespace ringreduce {

// Staging slot size, and the default pipeline segment of the shm transport. A 256 KiB slot and
// the buffer span it is reduced into both stay in a core's 1 MiB L2 here; 64 KiB and 1 MiB slots
// were slower at 16 and 64 MiB in benchmarks/RESULTS.md.
constexpr std::size_t kShmSlotBytes = 256 << 10;
// Slots per channel. With 4 slots, 4 ranks on this machine's 2 cores fell into a 1.1 GB/s mode in
// half the runs at 16 and 64 MiB (every full channel stops a sender and costs a context switch);
// with 16 they held 3.3-3.5 GB/s, and 2 ranks lost nothing (benchmarks/RESULTS.md).
constexpr std::size_t kShmSlots = 16;
// Each slot starts with a header line (the piece's size), so its data stays 64-byte aligned.
constexpr std::size_t kShmSlotHeaderBytes = 64;
// Staging memory a rank reserves per peer, about 4 MiB; only channels in use are touched (the ring
// touches one, the central root one per peer).
constexpr std::size_t kShmChannelBytes = kShmSlots * (kShmSlotHeaderBytes + kShmSlotBytes);

// How a waiting rank passes the time before it sleeps on its futex: polling (spin), handing its
// core to another runnable process (yield), or neither (sleep at once). RINGREDUCE_WAIT names one;
// unset, a rank spins briefly, then yields while that hands its core to someone, then sleeps (see
// shm.cpp for the measured times).
struct WaitPlan {
  std::chrono::nanoseconds spin{0};
  std::chrono::nanoseconds yield{0};
  // The yield phase also ends once yields that handed the core to no one add up to this: each of
  // them is a poll, and a polling rank keeps the scheduler from moving work to its core.
  std::chrono::nanoseconds idle_yield{0};
};
constexpr const char* kWaitEnv = "RINGREDUCE_WAIT";
// A sched_yield that returns within this handed the core to no one (about 1-3 us here when nothing
// else was runnable on it; another task's turn takes far longer).
constexpr std::chrono::microseconds kHandoverTime{5};

// One wait's yield phase under a plan: whether to yield again, yield by yield.
class YieldPhase {
 public:
  explicit YieldPhase(const WaitPlan& plan) : plan_(plan) {}
  // After a sched_yield that took `took`, `elapsed` into the phase.
  bool again(std::chrono::nanoseconds took, std::chrono::nanoseconds elapsed);
  // The time spent in yields that handed the core to no one.
  std::chrono::nanoseconds idle() const { return idle_; }

 private:
  const WaitPlan& plan_;
  std::chrono::nanoseconds idle_{0};
};

class ShmTransport final : public Transport {
 public:
  // Collective: every rank of the group constructs one with the same rendezvous.
  ShmTransport(Rendezvous& rendezvous, int rank, int world, std::chrono::milliseconds timeout);
  ~ShmTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  const char* name() const override { return "shm"; }
  std::size_t default_segment_bytes() const override { return kShmSlotBytes; }
  // The time this rank has spent in yields that handed its core to no one, over its life.
  std::chrono::nanoseconds idle_yielded() const { return idle_yielded_; }

  Request isend(int peer, const void* data, std::size_t bytes) override;
  Request irecv(int peer, void* data, std::size_t bytes) override;
  Request irecv_reduce(int peer, void* data, std::size_t bytes, const Reducer& reducer, bool last) override;
  Request irecv_forward(int prev, int next, void* data, std::size_t bytes, const Reducer* reducer, bool last) override;
  void flush() override;

  // Wakes our own doorbell, so the wait sees the flag at once (the simulated NCCL's abort, whose
  // transfers run on a stream's thread, and a parameter server that stops).
  void cancel() override;

  struct Segment;     // a mapped shared-memory segment (shm_transport.cpp)
  struct SlotHeader;  // the line in front of each staging slot (shm_transport.cpp)

 protected:
  void complete(Request request) override;
  AbortNotice abort_transfers(const AbortNotice& notice) override;

 private:
  struct SendOp {
    std::uint64_t sequence;
    const char* data;
    std::size_t bytes;
    std::size_t done = 0;
  };
  struct RecvOp {
    std::uint64_t sequence;
    char* data;
    std::size_t bytes;
    const Reducer* reducer;
    bool last;
    int forward_to;  // -1, or the rank the result is passed on to
    std::size_t done = 0;
  };

  Request post_recv(int peer, void* data, std::size_t bytes, const Reducer* reducer, bool last, int forward_to);
  // The next free slot of our channel to `peer` (its header; data follows), or null when all are full.
  SlotHeader* free_slot(int peer);
  // Publishes the piece written into `slot` to `peer`.
  void post_piece(int peer, SlotHeader* slot, std::size_t bytes);
  bool push_sends(int peer);
  bool pull_recvs(int peer, std::uint64_t through_sequence);
  void take_piece(RecvOp& op, const char* source, std::size_t piece);
  bool is_done(Request request) const;
  // Moves transfers until `done()`: pushes every pending send and runs `pull` (the receives to take),
  // and idles when neither moved. `peer` and `sending` say what is awaited, for the spin and errors.
  template <typename Pull, typename Done>
  void drive(Pull pull, Done done, int peer, bool sending);
  // Spin until `watch` or the doorbell moves, then sleep until a peer rings; raises if a peer died
  // or aborted, or at the deadline.
  void idle(std::uint32_t doorbell_seen, const std::atomic<std::uint64_t>* watch, std::uint64_t watch_seen,
            std::chrono::steady_clock::time_point deadline, const char* doing, int peer);
  // Spins, then yields, as the wait plan says: true once `moved()`, false when it is time to sleep.
  template <typename Moved>
  bool pass_time(Moved moved, std::chrono::steady_clock::time_point start);
  bool push_all_sends();
  void ring(int peer);
  [[noreturn]] void fail(const std::string& what);
  // Raises the group's notice if a peer has aborted.
  void raise_if_a_peer_aborted() const;
  // Raises MismatchError if the next piece waiting from `peer` belongs to a different call.
  void check_waiting_header(int peer) const;
  // The notice of the group's first rank to abort.
  AbortNotice group_notice() const;

  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  WaitPlan wait_;
  std::chrono::nanoseconds idle_yielded_{0};
  std::vector<std::unique_ptr<Segment>> segments_;  // by rank; segments_[rank_] is ours
  std::vector<std::deque<SendOp>> sends_;           // by destination, in posting order
  std::vector<std::deque<RecvOp>> recvs_;           // by source, in posting order
  std::uint64_t next_sequence_ = 0;
  std::atomic<bool> cancelled_{false};
};

}  // namespace ringreduce
