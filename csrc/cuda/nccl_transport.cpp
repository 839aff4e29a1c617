#include "nccl_transport.h"

#include <cstring>
#include <thread>

#include "cuda_check.h"

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
  RR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
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
    // Transfers still queued on the stream must end before the communicator goes.
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  }
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

Request NcclTransport::post(bool is_send, int peer, void* data, std::size_t bytes) {
  const std::int64_t id = next_id_++;
  // Sends read what the compute stream has written so far; receives must not overwrite what it
  // still reads. Either way: wait for its current point.
  transfers_.emplace(id, Transfer{is_send, peer, data, bytes, queue_.events().record(queue_.cuda_stream()), nullptr});
  return Request{id};
}

Request NcclTransport::isend(int peer, const void* data, std::size_t bytes) {
  return post(true, peer, const_cast<void*>(data), bytes);
}

Request NcclTransport::irecv(int peer, void* data, std::size_t bytes) { return post(false, peer, data, bytes); }

void NcclTransport::issue_through(std::int64_t id) {
  if (id <= issued_through_) return;
  // One group with every transfer posted since the last one: a ring step's send and receive match
  // their peers' in the same group, so NCCL can run them together.
  auto begin = transfers_.upper_bound(issued_through_);
  auto end = transfers_.upper_bound(id);
  for (auto it = begin; it != end; ++it) {
    RR_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(it->second.ready.get()), 0));
  }
  finish(ncclGroupStart(), "ncclGroupStart");
  for (auto it = begin; it != end; ++it) {
    Transfer& t = it->second;
    const ncclResult_t posted = t.is_send ? ncclSend(t.data, t.bytes, ncclUint8, t.peer, comm_, stream_)
                                          : ncclRecv(t.data, t.bytes, ncclUint8, t.peer, comm_, stream_);
    if (posted != ncclSuccess && posted != ncclInProgress) {
      ncclGroupEnd();
      finish(posted, t.is_send ? "ncclSend" : "ncclRecv");
    }
  }
  finish(ncclGroupEnd(), "ncclGroupEnd");
  const auto done = queue_.events().record(stream_);
  for (auto it = begin; it != end; ++it) it->second.done = done;
  issued_through_ = id;
}

void NcclTransport::wait_transfer(Request request) {
  auto it = transfers_.find(request.id);
  RR_CHECK(it != transfers_.end(), "wait() on an unknown or finished request ", request.id);
  issue_through(request.id);
  queue_.wait(it->second.done);
  transfers_.erase(it);
}

std::shared_ptr<void> NcclTransport::allocate_staging(std::size_t bytes) {
  void* memory = nullptr;
  const DeviceScope on(queue_.device());
  RR_CUDA_CHECK(cudaMalloc(&memory, bytes == 0 ? 1 : bytes));
  return std::shared_ptr<void>(memory, [](void* p) { cudaFree(p); });
}

AbortNotice NcclTransport::abort_transfers(const AbortNotice& notice) {
  transfers_.clear();
  if (comm_ != nullptr) ncclCommAbort(comm_);
  comm_ = nullptr;
  return notice;
}

}  // namespace cuda
}  // namespace ringreduce
