// How far the host may queue work ahead of a device, counted in stream operations: every kernel,
// NCCL group and event the host queues, whichever part of the engine queues it.
#pragma once

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>

namespace ringreduce {

// Operations are counted when queued and forgotten once the device has passed a marker (an event)
// queued after them. Before queuing more, the host waits until they fit: then a stalled device
// makes the host wait here, polling and able to abort, never inside a CUDA or NCCL call whose
// launch queue is full.
class IssueWindow {
 public:
  // `reached(marker)`: whether the device has passed the marker; `pause()`: runs between two looks
  // (a short sleep that also raises what a watchdog found).
  IssueWindow(std::size_t capacity, std::function<bool(const std::shared_ptr<void>&)> reached,
              std::function<void()> pause);

  // Before queuing `ops` operations: waits until they fit beside those the device has not passed.
  void make_room(std::size_t ops);
  // After queuing `ops` operations; the next marker covers them.
  void queued(std::size_t ops);
  // After queuing `marker` (an event) behind everything counted so far.
  void mark(std::shared_ptr<void> marker);
  // After an abort: nothing is waited for any more.
  void clear();
  std::size_t in_flight() const { return in_flight_; }

 private:
  struct Batch {
    std::shared_ptr<void> marker;
    std::size_t ops;
  };
  std::size_t capacity_;
  std::function<bool(const std::shared_ptr<void>&)> reached_;
  std::function<void()> pause_;
  std::deque<Batch> batches_;  // in queuing order
  std::size_t in_flight_ = 0;  // counted and not known to be passed, marked or not
  std::size_t unmarked_ = 0;   // counted since the last marker
};

}  // namespace ringreduce
