#include "cuda/nccl_transport.h"

#include <cstring>
#include <thread>
#include <vector>

#include "cuda/cuda_check.h"

namespace ringreduce {
namespace cuda {
namespace {

// How often a non-blocking NCCL call is polled while it is in progress.
constexpr std::chrono::microseconds kNcclPoll{50};

}  // namespace

std::string nccl_version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
  // Codes from 2.9 on are major*10000 + minor*100 + patch.
  return detail::concat(code / 10000, ".", (code / 100) % 100, ".", code % 100);
}

void NcclTransport::finish(ncclResult_t result, const char* what) {
  // The communicator is non-blocking: calls may return "in progress" and must be polled to the end,
  // within the timeout, so that a missing peer is an error and not a hang.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (result == ncclInProgress) {
    if (std::chrono::steady_clock::now() > deadline) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw TimeoutError(detail::concat("ringreduce: nccl rank ", rank_, ": ", what, " did not finish within ",
                                        timeout_.count(), " ms; is every rank running the same collectives?"));
    }
    std::this_thread::sleep_for(kNcclPoll);
    ncclCommGetAsyncError(comm_, &result);
  }
  if (result != ncclSuccess) {
    throw std::runtime_error(detail::concat("ringreduce: nccl rank ", rank_, ": ", what, " failed: ",
                                            ncclGetErrorString(result), " (", ncclGetLastError(comm_), ")"));
  }
}

NcclTransport::NcclTransport(Rendezvous& rendezvous, int rank, int world, DeviceQueue& queue,
                             std::chrono::milliseconds timeout)
    : rank_(rank), world_(world), queue_(queue), timeout_(timeout) {
  const DeviceScope on(queue.device());
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t got = ncclGetUniqueId(&id);
    RR_CHECK(got == ncclSuccess, "ncclGetUniqueId failed: ", ncclGetErrorString(got));
    rendezvous.set("nccl-id", std::string(id.internal, sizeof id.internal));
  } else {
    const std::string published = rendezvous.get("nccl-id");
    RR_CHECK(published.size() == sizeof id.internal, "the NCCL id in the store has ", published.size(), " bytes");
    std::memcpy(id.internal, published.data(), sizeof id.internal);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  finish(ncclCommInitRankConfig(&comm_, world, id, rank, &config), "ncclCommInitRankConfig");
}

NcclTransport::~NcclTransport() {
  if (comm_ != nullptr) {
    // Transfers still queued must end before the communicator goes.
    queue_.synchronize();
    ncclCommDestroy(comm_);
  }
}

void NcclTransport::begin_collective(const CollectiveHeader& header, bool check) {
  MessageTransport::begin_collective(header, check);
  queue_.fork_lanes();
}

void NcclTransport::select_lane(std::size_t lane) {
  MessageTransport::select_lane(lane);
  queue_.select_lane(lane);
}

void NcclTransport::end_collective() {
  RR_CHECK(unissued_.empty(), unissued_.size(), " transfers were posted and never waited for");
  queue_.join_lanes();
}

Request NcclTransport::isend(int peer, const void* data, std::size_t bytes) {
  return unissued_.hold({true, peer, const_cast<void*>(data), bytes, lane_});
}

Request NcclTransport::irecv(int peer, void* data, std::size_t bytes) {
  return unissued_.hold({false, peer, data, bytes, lane_});
}

void NcclTransport::issue(const std::vector<HeldTransfer>& group) {
  // One NCCL group per exchange, so NCCL runs its send and receive together. On the lane's stream
  // the group starts after the lane's earlier work (the reduction that produced what it sends), and
  // the lane's later work (the reduction of what it receives) waits for it.
  const cudaStream_t stream = queue_.lane_stream(group.front().lane);
  finish(ncclGroupStart(), "ncclGroupStart");
  for (const HeldTransfer& t : group) {
    const ncclResult_t posted = t.is_send ? ncclSend(t.data, t.bytes, ncclUint8, t.peer, comm_, stream)
                                          : ncclRecv(t.data, t.bytes, ncclUint8, t.peer, comm_, stream);
    if (posted != ncclSuccess && posted != ncclInProgress) {
      ncclGroupEnd();
      finish(posted, t.is_send ? "ncclSend" : "ncclRecv");
    }
  }
  finish(ncclGroupEnd(), "ncclGroupEnd");
}

void NcclTransport::wait_transfer(Request request) {
  // Once issued, a transfer is complete in stream order for whatever its lane queues next.
  const std::vector<HeldTransfer> group = unissued_.release(request);
  if (!group.empty()) issue(group);
}

std::shared_ptr<void> NcclTransport::allocate_staging(std::size_t bytes) {
  void* memory = nullptr;
  const DeviceScope on(queue_.device());
  RR_CUDA_CHECK(cudaMalloc(&memory, bytes == 0 ? 1 : bytes));
  return std::shared_ptr<void>(memory, [](void* p) { cudaFree(p); });
}

AbortNotice NcclTransport::abort_transfers(const AbortNotice& notice) {
  unissued_.clear();
  // Work still queued on the lanes must stay ahead of the caller's (and of the allocator reusing
  // its tensors, recorded on the main stream). A CUDA error here is dropped: the failure being
  // reported is the one that matters.
  try {
    queue_.join_lanes();
  } catch (const std::exception&) {
  }
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  return notice;
}

}  // namespace cuda
}  // namespace ringreduce
