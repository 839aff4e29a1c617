// `local`: the ranks are threads of one process and exchange through memory. The receiver reads
// straight from the sender's buffer (one copy, or a reduction with no copy at all).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/transport.h"

namespace ringreduce {

// While a local rank waits, it looks this often at what other peers have sent, to catch ranks that
// disagree on a call before the timeout; short enough to report within a blink, long enough to cost
// nothing while ranks make progress.
constexpr std::chrono::milliseconds kPeekInterval{20};

// Segment size of the local transport. A receiver reads straight from the sender's memory, so a
// segment only sets how often ranks hand over: 256 KiB keeps a segment in the 1 MiB L2 of this
// machine's cores and makes tests reach many-segment paths at moderate sizes.
constexpr std::size_t kLocalSegmentBytes = 256 << 10;

// Lanes the local hub keeps apart (each pair of ranks has a channel per lane). Host ranks reduce on
// the waiting thread, so lanes give them nothing and one stays their default; GPU ranks run the
// device's lanes, one stream each, as the nccl transport does.
constexpr std::size_t kLocalMaxLanes = 4;

// Where a local rank's memory lives. On the host every operation is immediate; a GPU rank works in
// the order of its own stream, and events tell the peer's stream when data is ready or consumed.
class LocalMemory {
 public:
  virtual ~LocalMemory() = default;
  virtual void copy(void* dst, const void* src, std::size_t bytes) = 0;
  // The pipeline segment that suits this memory (see kLocalSegmentBytes).
  virtual std::size_t segment_bytes() const { return kLocalSegmentBytes; }
  // A marker at the current point of this rank's work (null on the host).
  virtual std::shared_ptr<void> record() { return nullptr; }
  // Make this rank's later work wait for a marker recorded by another rank.
  virtual void wait_for(const std::shared_ptr<void>& /*marker*/) {}
  // Lanes of work this memory can keep apart (see Transport::select_lane; the host keeps no order),
  // and how many suit it.
  virtual std::size_t max_lanes() const { return kLocalMaxLanes; }
  virtual std::size_t default_lanes() const { return 1; }
  // A collective's lanes start after the rank's earlier work, and its later work waits for them.
  virtual void fork_lanes() {}
  virtual void join_lanes() {}
  virtual void select_lane(std::size_t /*lane*/) {}
};

class HostMemory final : public LocalMemory {
 public:
  void copy(void* dst, const void* src, std::size_t bytes) override;
};

// The mailboxes shared by the ranks of one process.
class LocalHub {
 public:
  LocalHub(int world, std::chrono::milliseconds timeout);
  int world() const { return world_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Stops every rank's transfers; every rank then raises the first notice given.
  AbortNotice abort(const AbortNotice& notice);
  AbortNotice first_notice();

 private:
  friend class LocalTransport;
  enum class State { Posted, Taken, Done };
  struct Message {
    const void* data;
    std::size_t bytes;
    CollectiveHeader header;
    std::shared_ptr<void> ready;     // sender's marker: the data is written
    std::shared_ptr<void> consumed;  // receiver's marker: the data has been read
    State state = State::Posted;
  };
  struct Channel {
    std::mutex mutex;
    std::condition_variable changed;
    std::map<std::uint64_t, Message> messages;  // by sequence number on this channel
    std::uint64_t sent = 0;
  };
  Channel& channel(int src, int dst, std::size_t lane) {
    return channels_[(lane * world_ + static_cast<std::size_t>(src)) * world_ + dst];
  }

  const int world_;
  const std::chrono::milliseconds timeout_;
  std::vector<Channel> channels_;
  std::atomic<bool> aborted_{false};
  std::mutex notice_mutex_;
  AbortNotice first_notice_;
};

class LocalTransport final : public Transport {
 public:
  LocalTransport(std::shared_ptr<LocalHub> hub, int rank, std::unique_ptr<LocalMemory> memory);
  ~LocalTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return hub_->world(); }
  const char* name() const override { return "local"; }
  std::size_t default_segment_bytes() const override { return memory_->segment_bytes(); }
  std::size_t max_lanes() const override { return memory_->max_lanes(); }
  std::size_t default_lanes() const override { return memory_->default_lanes(); }

  void begin_collective(const CollectiveHeader& header, bool check) override;
  void select_lane(std::size_t lane) override;
  void end_collective() override { memory_->join_lanes(); }

  Request isend(int peer, const void* data, std::size_t bytes) override;
  Request irecv(int peer, void* data, std::size_t bytes) override;
  Request irecv_reduce(int peer, void* data, std::size_t bytes, const Reducer& reducer, bool last) override;

 protected:
  void complete(Request request) override;
  AbortNotice abort_transfers(const AbortNotice& notice) override;

 private:
  struct Pending {
    bool is_send;
    int peer;
    std::size_t lane;
    std::uint64_t sequence;
    void* dst = nullptr;
    std::size_t bytes = 0;
    const Reducer* reducer = nullptr;
    bool last = false;
  };
  Request add(Pending pending);
  void wait_send(const Pending& pending);
  void wait_recv(const Pending& pending);
  [[noreturn]] void fail_waiting(const Pending& pending);
  // Waits (up to the timeout) until `ready`, peeking at other peers' messages now and then.
  void wait_until(LocalHub::Channel& channel, std::unique_lock<std::mutex>& lock, const std::function<bool()>& ready,
                  const Pending& pending);
  void check_waiting_header(int peer, std::size_t lane);
  void withdraw_sends();

  std::shared_ptr<LocalHub> hub_;
  int rank_;
  std::unique_ptr<LocalMemory> memory_;
  std::vector<std::uint64_t> recv_sequence_;  // next receive sequence number, per lane and peer
  std::unordered_map<std::int64_t, Pending> pending_;
  std::int64_t next_id_ = 0;
};

}  // namespace ringreduce
