// `nccl`: point-to-point ncclSend/ncclRecv between the ranks of a group, on a communicator the
// group owns (bootstrapped through the group's store, never borrowed from ProcessGroupNCCL).
//
// A lane's transfers and the reductions they feed run in order on that lane's stream, so a
// segment's next send follows its reduction with no event in between, and while one lane reduces
// the other lane's transfer is in flight. The host never blocks for the GPU.
#pragma once

#include <nccl.h>

#include <chrono>
#include <memory>

#include "core/rendezvous.h"
#include "core/transport.h"
#include "cuda/device_queue.h"
#include "transports/exchange_groups.h"

namespace ringreduce {
namespace cuda {

// Pipeline segment of the nccl transport: 4 MiB, the buffer NCCL itself stages per ring step, so
// each kernel launch (a few microseconds) is amortised over enough bytes. Not yet measured on a GPU.
constexpr std::size_t kNcclSegmentBytes = 4 << 20;

class NcclTransport final : public MessageTransport {
 public:
  // Collective over the group: group rank 0 creates the NCCL id and publishes it in the store.
  NcclTransport(Rendezvous& rendezvous, int rank, int world, DeviceQueue& queue, std::chrono::milliseconds timeout);
  ~NcclTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  const char* name() const override { return "nccl"; }
  std::size_t default_segment_bytes() const override { return kNcclSegmentBytes; }
  // NCCL completes a group of operations together, on one stream: a receive posted ahead would
  // hold its whole group (and the stream behind it) until a send its peer posts only later.
  bool can_post_ahead() const override { return false; }
  std::size_t max_lanes() const override { return queue_.lanes(); }
  std::size_t default_lanes() const override { return queue_.lanes(); }

  // Every lane starts after what the caller queued before the collective...
  void begin_collective(const CollectiveHeader& header, bool check) override;
  void select_lane(std::size_t lane) override;
  // ...and the caller's later work waits for every lane.
  void end_collective() override;

  Request isend(int peer, const void* data, std::size_t bytes) override;
  Request irecv(int peer, void* data, std::size_t bytes) override;

 protected:
  void wait_transfer(Request request) override;
  std::shared_ptr<void> allocate_staging(std::size_t bytes) override;
  // NCCL headers are not compared (that would need the host to read device memory, and the host
  // never blocks for the GPU); the notice stays local to this rank.
  AbortNotice abort_transfers(const AbortNotice& notice) override;

 private:
  void issue(const std::vector<HeldTransfer>& group);
  void finish(ncclResult_t result, const char* what);

  int rank_;
  int world_;
  DeviceQueue& queue_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  ExchangeGroups unissued_;  // posted and not yet handed to NCCL
};

// "major.minor.patch" of the NCCL library loaded at run time.
std::string nccl_version();

}  // namespace cuda
}  // namespace ringreduce
