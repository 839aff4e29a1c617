// The transport interface: all an algorithm knows about moving bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/reducer.h"

namespace ringreduce {

// A posted transfer. Only the transport that issued it can interpret the id.
struct Request {
  std::int64_t id = -1;
  bool valid() const { return id >= 0; }
};

// Point-to-point transfers between the ranks of one group.
//
// Messages between two ranks match in posting order (the k-th send from a to b meets the k-th
// receive at b from a). Posting never blocks for a peer; wait() does. On a device transport
// "complete" is in stream order: work the reducer queues after wait() sees the data, and nothing
// stalls the host.
class Transport {
 public:
  virtual ~Transport() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;
  // The pipeline segment size that suits this transport (see each transport's constant).
  virtual std::size_t default_segment_bytes() const = 0;
  // Whether an algorithm may post transfers beyond the one it waits for next. A transport that
  // must hand matching transfers over together (NCCL groups) says no; then algorithms post each
  // exchange's send and receive and wait for it at once.
  virtual bool can_post_ahead() const { return true; }
  // Pipeline lanes (see select_lane): how many this transport can keep apart, and how many suit it.
  virtual std::size_t max_lanes() const { return 1; }
  virtual std::size_t default_lanes() const { return 1; }

  // The lane that the transfers posted and waited for from now on belong to (below max_lanes());
  // a receive is waited for in its own lane (its reduction runs there). Messages match in posting
  // order within a lane; different lanes, and the reductions their receives feed, may proceed
  // concurrently. Every collective starts in lane 0.
  virtual void select_lane(std::size_t lane) { lane_ = lane; }

  // Send [data, data + bytes) to `peer`. The bytes must stay unchanged until wait() returns.
  virtual Request isend(int peer, const void* data, std::size_t bytes) = 0;

  // Receive exactly `bytes` from `peer` into `data`.
  virtual Request irecv(int peer, void* data, std::size_t bytes) = 0;

  // Receive `bytes` from `peer` and reduce them into `data` with `reducer` (see Reducer::reduce
  // for `last`). The reduction happens inside wait() for this request, so reductions into one span
  // happen in the order the algorithm waits for them, which makes the result deterministic.
  virtual Request irecv_reduce(int peer, void* data, std::size_t bytes, const Reducer& reducer, bool last) = 0;

  // irecv (reducer null) or irecv_reduce, whose result is then sent on to `next` as if by
  // isend(next, data, bytes) once wait() returns. A transport with a shared address space fuses the
  // two and writes the outgoing copy in the same pass as the reduction. The forwarded sends
  // complete by flush().
  virtual Request irecv_forward(int prev, int next, void* data, std::size_t bytes, const Reducer* reducer, bool last);

  // Block (or, on a device, order the stream) until the request is complete.
  void wait(Request request);

  // The collective the next transfers belong to. Transports that compare_headers() send the header
  // with the first message to each peer and compare what arrives (check_header) before touching any
  // data; with `check` false they skip the comparison (and any exchange made only for it).
  virtual void begin_collective(const CollectiveHeader& header, bool check) {
    header_ = header;
    check_ = check;
    select_lane(0);
  }

  // Whether the transport's messages carry and compare the header. One whose messages carry only
  // data (the pg transport) leaves it to the communicator, which runs agree_on_call() over it.
  virtual bool compares_headers() const { return true; }

  // Makes every rank find out, before it returns, whether the whole group agrees on the collective
  // begun. Called before the data of the collectives in which some ranks only send (broadcast,
  // reduce): they would otherwise return before the rank they sent to finds the disagreement. The
  // default exchanges an empty message with every peer, whose header the transport compares (it
  // posts ahead: a transport that cannot overrides it).
  virtual void agree_with_every_peer();

  // Wait for every send that irecv_forward() started.
  virtual void flush();

  // The collective's transfers are all posted and waited for (not called after a failure).
  virtual void end_collective() {}

  // Raises a failure found since, where the work finishes after the host has moved on (a device
  // transport's watchdog); others have none to raise.
  virtual void raise_if_failed() {}

  // After a failure: make the peers fail fast with the same notice instead of waiting out their
  // timeout, and stop touching the caller's buffers. Returns the notice the whole group reports
  // (the first rank to abort wins). The transport is unusable afterwards.
  AbortNotice abort(const AbortNotice& notice);

  // Thread-safe, unlike the rest: makes a wait running on another thread raise soon (within a
  // liveness poll), so an owner that stops can end a thread blocked on a peer that is alive but
  // silent. The transport is unusable afterwards; abort() it from the waiting thread. A transport
  // that cannot wake a wait leaves it to its timeout (the default).
  virtual void cancel() {}

  // The ranks this transport's ranks stand for, for messages only (a parameter server's private
  // pair names the group's ranks, not 0 and 1). Empty: themselves.
  void name_ranks(std::vector<int> names) { rank_names_ = std::move(names); }

 protected:
  // How messages name transport rank `rank`.
  int rank_name(int rank) const {
    return rank >= 0 && static_cast<std::size_t>(rank) < rank_names_.size() ? rank_names_[rank] : rank;
  }
  // Complete one request of this transport (wait() adds the forwarding).
  virtual void complete(Request request) = 0;
  // The transport's part of abort(): tell the peers, and return the group's first notice.
  virtual AbortNotice abort_transfers(const AbortNotice& notice) = 0;
  // Throws MismatchError when a peer's header differs from ours.
  void check_header(int peer, const CollectiveHeader& theirs) const {
    if (check_ && theirs != header_) throw_mismatch(rank(), header_, peer, theirs);
  }

  CollectiveHeader header_;
  bool check_ = true;
  std::size_t lane_ = 0;
  std::vector<int> rank_names_;

 private:
  struct Forward {
    int next;
    const void* data;
    std::size_t bytes;
  };
  std::unordered_map<std::int64_t, Forward> forwards_;  // receives whose result goes on, by request id
  std::vector<Request> forwarded_sends_;
};

// Base for transports that move opaque messages (torch ProcessGroup, NCCL): a receive-reduce is a
// receive into staging memory followed by a reduction when it is waited for.
class MessageTransport : public Transport {
 public:
  Request irecv_reduce(int peer, void* data, std::size_t bytes, const Reducer& reducer, bool last) final;

 protected:
  void complete(Request request) final;
  // Complete a plain send or receive.
  virtual void wait_transfer(Request request) = 0;
  // Memory the transport can receive into; the default is host memory.
  virtual std::shared_ptr<void> allocate_staging(std::size_t bytes);
  // Around each reduction complete() queues: a device transport counts its kernel (IssueWindow).
  virtual void before_reduction() {}
  virtual void after_reduction() {}

 private:
  struct Staging {
    std::shared_ptr<void> memory;
    std::size_t capacity;
  };
  struct PendingReduce {
    void* dst;
    const void* src;  // where in `staging` the bytes land
    Staging staging;
    std::size_t lane;
    std::size_t bytes;
    const Reducer* reducer;
    bool last;
  };
  Staging take_staging(std::size_t bytes);

  std::unordered_map<std::int64_t, PendingReduce> pending_reduces_;
  // Released staging buffers, per lane: a buffer is only reused in the lane whose order protects
  // it from the reduction that last read it. At most as many as receive-reduces were in flight.
  std::vector<std::vector<Staging>> free_staging_;
};

// Waits for the oldest request once more than `capacity` are in flight.
class RequestWindow {
 public:
  RequestWindow(Transport& transport, std::size_t capacity) : transport_(transport), capacity_(capacity) {}

  void push(Request request);
  void drain();

 private:
  Transport& transport_;
  std::size_t capacity_;
  std::deque<Request> pending_;
};

}  // namespace ringreduce
