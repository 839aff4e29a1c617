// The stream contract of a GPU communicator, without CUDA types (cuda/device_queue.h implements it).
#pragma once

#include <chrono>
#include <functional>
#include <memory>

namespace ringreduce {

// How a GPU communicator's work is ordered against its caller's: a device stream joined to the
// caller's stream by events (the host never waits). CPU communicators have none.
class StreamContext {
 public:
  virtual ~StreamContext() = default;
  virtual void* stream() const = 0;
  // A marker at the current point of `stream` (a CUDA event).
  virtual std::shared_ptr<void> mark(void* stream) = 0;
  // Our later work waits for the marker.
  virtual void wait(const std::shared_ptr<void>& marker) = 0;
  // The caller's later work on `stream` waits for everything queued on ours so far.
  virtual void release_to(void* stream) = 0;
  // Tells whether the device has done everything queued on our stream so far. It holds what it
  // needs (an event), so it may outlive the communicator.
  virtual std::function<bool()> done_probe() = 0;
  // Zero for a device whose callers order their work on streams. The simulated device serves
  // host memory to host code, which has no stream: there a call returns once the device has done
  // its collective, waiting at most this long (then the collective has timed out).
  virtual std::chrono::milliseconds host_wait() const { return {}; }
};

}  // namespace ringreduce
