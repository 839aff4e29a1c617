#include "cuda/device_queue.h"

#include <map>
#include <utility>

#include "cuda/cuda_check.h"

namespace ringreduce {
namespace cuda {

EventPool::~EventPool() {
  std::lock_guard<std::mutex> lock(free_->mutex);
  for (Event event : free_->events) free_->api.destroy_event(event);
  free_->events.clear();
}

std::shared_ptr<void> EventPool::record(Stream stream) {
  Event event = nullptr;
  {
    std::lock_guard<std::mutex> lock(free_->mutex);
    if (!free_->events.empty()) {
      event = free_->events.back();
      free_->events.pop_back();
    }
  }
  DeviceApi& api = free_->api;
  if (event == nullptr) RR_CUDA_CHECK(api.create_event(&event));
  RR_CUDA_CHECK(api.record(event, stream));
  std::weak_ptr<Free> pool = free_;
  return std::shared_ptr<void>(event, [pool, &api](void* raw) {
    if (auto alive = pool.lock()) {
      std::lock_guard<std::mutex> lock(alive->mutex);
      alive->events.push_back(static_cast<Event>(raw));
    } else {
      api.destroy_event(static_cast<Event>(raw));
    }
  });
}

namespace {

// Streams of ended queues, by device API and device. Never destroyed, nor is the pool: static
// destructors run after the CUDA driver may have shut down.
struct StreamPool {
  std::mutex mutex;
  std::map<std::pair<const DeviceApi*, int>, std::vector<Stream>> free;
};
StreamPool& stream_pool() {
  static StreamPool* pool = new StreamPool;
  return *pool;
}

}  // namespace

DeviceQueue::DeviceQueue(DeviceApi& api, int device, std::size_t lanes, std::chrono::milliseconds host_wait)
    : api_(api), device_(device), host_wait_(host_wait), events_(api) {
  RR_CHECK(lanes >= 1, "a device queue needs at least one lane");
  const std::size_t wanted = lanes + (host_wait.count() > 0 ? 1 : 0);
  {
    StreamPool& pool = stream_pool();
    const std::lock_guard<std::mutex> lock(pool.mutex);
    std::vector<Stream>& free = pool.free[{&api, device}];
    while (streams_.size() < wanted && !free.empty()) {
      streams_.push_back(free.back());
      free.pop_back();
    }
  }
  const DeviceScope on(api, device);
  while (streams_.size() < wanted) {
    Stream stream = nullptr;
    const Failure made = api.create_stream(&stream);
    if (made != nullptr) {
      give_back_streams();
      RR_CUDA_CHECK(made);
    }
    streams_.push_back(stream);
  }
  if (host_wait.count() > 0) {
    host_stream_ = streams_.back();
    streams_.pop_back();
  }
}

DeviceQueue::~DeviceQueue() {
  // The simulated device's memory is host memory, which its owners free at once rather than in
  // stream order: the streams finish what they hold first.
  if (host_stream_ != nullptr) {
    for (Stream stream : streams_) api_.synchronize(stream);
  }
  give_back_streams();
}

void DeviceQueue::give_back_streams() {
  StreamPool& pool = stream_pool();
  const std::lock_guard<std::mutex> lock(pool.mutex);
  std::vector<Stream>& free = pool.free[{&api_, device_}];
  free.insert(free.end(), streams_.begin(), streams_.end());
  if (host_stream_ != nullptr) free.push_back(host_stream_);
  streams_.clear();
  host_stream_ = nullptr;
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
    RR_CUDA_CHECK(api_.wait(streams_[lane], static_cast<Event>(forked.get())));
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
    RR_CUDA_CHECK(api_.wait(streams_[0], static_cast<Event>(done.get())));
  }
}

void DeviceQueue::release_to(void* caller) {
  const auto event = events_.record(streams_[0]);
  RR_CUDA_CHECK(api_.wait(static_cast<Stream>(caller), static_cast<Event>(event.get())));
}

std::function<bool()> DeviceQueue::done_probe() {
  Stream asked = streams_[0];
  if (host_stream_ != nullptr) {
    release_to(host_stream_);
    asked = host_stream_;
  }
  std::shared_ptr<void> event = mark(asked);
  DeviceApi& api = api_;
  return [event, &api] {
    Failure ignored = nullptr;
    const EventState state = api.query(static_cast<Event>(event.get()), &ignored);
    // Failed is not done while work still queued may write the memory.
    return state == EventState::Done ||
           (state == EventState::Failed && api.drained_after_failure(static_cast<Event>(event.get())));
  };
}

void DeviceQueue::wait(const std::shared_ptr<void>& event) {
  if (event) RR_CUDA_CHECK(api_.wait(cuda_stream(), static_cast<Event>(event.get())));
}

}  // namespace cuda
}  // namespace ringreduce
