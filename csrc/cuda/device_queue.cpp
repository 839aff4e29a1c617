#include "device_queue.h"

#include "cuda_check.h"

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

DeviceQueue::DeviceQueue(int device) : device_(device) {
  const DeviceScope on(device);
  RR_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

DeviceQueue::~DeviceQueue() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void DeviceQueue::release_to(void* caller) {
  const auto event = events_.record(stream_);
  RR_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(caller), static_cast<cudaEvent_t>(event.get()), 0));
}

void DeviceQueue::wait(const std::shared_ptr<void>& event) {
  if (event) RR_CUDA_CHECK(cudaStreamWaitEvent(stream_, static_cast<cudaEvent_t>(event.get()), 0));
}

}  // namespace cuda
}  // namespace ringreduce
