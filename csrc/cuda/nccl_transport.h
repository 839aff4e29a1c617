// `nccl`: point-to-point ncclSend/ncclRecv between the ranks of a group, on a communicator the
// group owns (bootstrapped through the group's store, never borrowed from ProcessGroupNCCL).
//
// Every posted transfer waits for the point of the compute stream at which it was posted (an
// event), runs on the transport's own stream, and the compute stream waits for it when the
// algorithm waits. The host never blocks for the GPU.
#pragma once

#include <nccl.h>

#include <chrono>
#include <map>
#include <memory>

#include "../rendezvous.h"
#include "../transport.h"
#include "device_queue.h"

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

  Request isend(int peer, const void* data, std::size_t bytes) override;
  Request irecv(int peer, void* data, std::size_t bytes) override;

 protected:
  void wait_transfer(Request request) override;
  std::shared_ptr<void> allocate_staging(std::size_t bytes) override;
  // NCCL headers are not compared (that would need the host to read device memory, and the host
  // never blocks for the GPU); the notice stays local to this rank.
  AbortNotice abort_transfers(const AbortNotice& notice) override;

 private:
  struct Transfer {
    bool is_send;
    int peer;
    void* data;
    std::size_t bytes;
    std::shared_ptr<void> ready;  // compute-stream point the transfer must wait for
    std::shared_ptr<void> done;   // set once issued: the transport stream's point after its group
  };
  Request post(bool is_send, int peer, void* data, std::size_t bytes);
  void issue_through(std::int64_t id);
  void finish(ncclResult_t result, const char* what);

  int rank_;
  int world_;
  DeviceQueue& queue_;
  std::chrono::milliseconds timeout_;
  cudaStream_t stream_ = nullptr;  // where the NCCL kernels run
  ncclComm_t comm_ = nullptr;
  std::map<std::int64_t, Transfer> transfers_;  // posted and not yet waited for, by id
  std::int64_t next_id_ = 0;
  std::int64_t issued_through_ = -1;  // every transfer up to this id has been handed to NCCL
};

// "major.minor.patch" of the NCCL library loaded at run time.
std::string nccl_version();

}  // namespace cuda
}  // namespace ringreduce
