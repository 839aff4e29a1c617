// The CUDA half of a watchdog's CompletionSource: a collective is done when an event recorded after
// its work has completed, and a device error met on the way is a failure. Subclasses add what else
// they can poll and how to abort (NCCL: its asynchronous error, ncclCommAbort).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "cuda/device_queue.h"
#include "transports/watchdog.h"

namespace ringreduce {
namespace cuda {

class EventCompletion : public CompletionSource {
 public:
  // Markers are events recorded on the queue's main stream; `who` names the rank in messages.
  EventCompletion(DeviceQueue& queue, std::string who) : queue_(queue), who_(std::move(who)) {}

  // The queue's device becomes current on the watchdog's thread (else CUDA would make a context on
  // GPU 0 for it), and its event queries do not disturb a CUDA graph captured on another thread.
  void attach() override;
  std::shared_ptr<void> mark() override;
  bool reached(const std::shared_ptr<void>& marker) override;
  std::optional<AbortNotice> failure() override;

 private:
  DeviceQueue& queue_;
  std::string who_;
  Failure device_error_ = nullptr;  // only the watchdog's thread touches it
};

}  // namespace cuda
}  // namespace ringreduce
