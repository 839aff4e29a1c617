// Where a GPU communicator's work runs: one CUDA stream, joined to the caller's stream by events.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <vector>

#include "../communicator.h"

namespace ringreduce {
namespace cuda {

// A pool of timing-free events. Ranks of one process share events across threads (a virtual rank
// waits on its peer's), so the pool is locked.
class EventPool {
 public:
  EventPool() = default;
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An event recorded now on `stream`. It returns to the pool when the last holder drops it;
  // waits already queued on it are not affected when it is recorded again.
  std::shared_ptr<void> record(cudaStream_t stream);

 private:
  struct Free {
    std::mutex mutex;
    std::vector<cudaEvent_t> events;
  };
  std::shared_ptr<Free> free_ = std::make_shared<Free>();
};

class DeviceQueue final : public StreamContext {
 public:
  // An engine-owned stream on `device` (a non-blocking stream, so it never syncs with stream 0).
  explicit DeviceQueue(int device);
  ~DeviceQueue();
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;

  int device() const { return device_; }
  cudaStream_t cuda_stream() const { return stream_; }
  EventPool& events() { return events_; }

  void* stream() const override { return stream_; }
  std::shared_ptr<void> mark(void* stream) override { return events_.record(static_cast<cudaStream_t>(stream)); }
  // Make our stream wait for an event recorded elsewhere (null: nothing to wait for).
  void wait(const std::shared_ptr<void>& event) override;
  void release_to(void* caller) override;

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
  EventPool events_;
};

}  // namespace cuda
}  // namespace ringreduce
