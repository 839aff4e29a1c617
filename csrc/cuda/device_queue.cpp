#include "cuda/device_queue.h"

#include <map>

#include "cuda/cuda_check.h"

namespace ringreduce {
namespace cuda {

EventPool::~EventPool() {
  std::lock_guard<std::mutex> lock(free_->mutex);
  for (cudaEvent_t event : free_->events) cudaEventDestroy(event);
  free_->events.clear();
}

std::shared_ptr<void> EventPool::record(cudaStream_t stream) {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(free_->mutex);
    if (!free_->events.empty()) {
      event = free_->events.back();
      free_->events.pop_back();
    }
  }
  if (event == nullptr) RR_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  RR_CUDA_CHECK(cudaEventRecord(event, stream));
  std::weak_ptr<Free> pool = free_;
  return std::shared_ptr<void>(event, [pool](void* raw) {
    if (auto alive = pool.lock()) {
      std::lock_guard<std::mutex> lock(alive->mutex);
      alive->events.push_back(static_cast<cudaEvent_t>(raw));
    } else {
      cudaEventDestroy(static_cast<cudaEvent_t>(raw));
    }
  });
}

namespace {

// Streams of ended queues, by device. Never destroyed, nor is the pool: static destructors run after
// the CUDA driver may have shut down.
struct StreamPool {
  std::mutex mutex;
  std::map<int, std::vector<cudaStream_t>> free;
};
StreamPool& stream_pool() {
  static StreamPool* pool = new StreamPool;
  return *pool;
}

}  // namespace

DeviceQueue::DeviceQueue(int device, std::size_t lanes) : device_(device) {
  RR_CHECK(lanes >= 1, "a device queue needs at least one lane");
  {
    StreamPool& pool = stream_pool();
    const std::lock_guard<std::mutex> lock(pool.mutex);
    std::vector<cudaStream_t>& free = pool.free[device];
    while (streams_.size() < lanes && !free.empty()) {
      streams_.push_back(free.back());
      free.pop_back();
    }
  }
  const DeviceScope on(device);
  while (streams_.size() < lanes) {
    cudaStream_t stream = nullptr;
    const cudaError_t made = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (made != cudaSuccess) {
      give_back_streams();
      RR_CUDA_CHECK(made);
    }
    streams_.push_back(stream);
  }
}

DeviceQueue::~DeviceQueue() { give_back_streams(); }

void DeviceQueue::give_back_streams() {
  StreamPool& pool = stream_pool();
  const std::lock_guard<std::mutex> lock(pool.mutex);
  std::vector<cudaStream_t>& free = pool.free[device_];
  free.insert(free.end(), streams_.begin(), streams_.end());
  streams_.clear();
}

void DeviceQueue::select_lane(std::size_t lane) {
  RR_CHECK(lane < streams_.size(), "lane ", lane, " of a device queue with ", streams_.size());
  if (lane != 0 && fork_pending_) fork_now();
  lane_ = lane;
}

void DeviceQueue::fork_lanes() { fork_pending_ = streams_.size() > 1; }

void DeviceQueue::fork_now() {
  fork_pending_ = false;
  const auto forked = events_.record(streams_[0]);
  for (std::size_t lane = 1; lane < streams_.size(); ++lane) {
    RR_CUDA_CHECK(cudaStreamWaitEvent(streams_[lane], static_cast<cudaEvent_t>(forked.get()), 0));
  }
}

void DeviceQueue::join_lanes() {
  lane_ = 0;
  if (fork_pending_) {  // only the main stream ran: nothing to join
    fork_pending_ = false;
    return;
  }
  for (std::size_t lane = 1; lane < streams_.size(); ++lane) {
    const auto done = events_.record(streams_[lane]);
    RR_CUDA_CHECK(cudaStreamWaitEvent(streams_[0], static_cast<cudaEvent_t>(done.get()), 0));
  }
}

void DeviceQueue::release_to(void* caller) {
  const auto event = events_.record(streams_[0]);
  RR_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(caller), static_cast<cudaEvent_t>(event.get()), 0));
}

std::function<bool()> DeviceQueue::done_probe() {
  std::shared_ptr<void> event = events_.record(streams_[0]);
  return [event] { return cudaEventQuery(static_cast<cudaEvent_t>(event.get())) != cudaErrorNotReady; };
}

void DeviceQueue::wait(const std::shared_ptr<void>& event) {
  if (event) RR_CUDA_CHECK(cudaStreamWaitEvent(cuda_stream(), static_cast<cudaEvent_t>(event.get()), 0));
}

}  // namespace cuda
}  // namespace ringreduce
