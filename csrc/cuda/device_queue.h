// Where a GPU communicator's work runs: streams of its own, joined to the caller's stream by
// events, on a device reached through the seam (device_api.h).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "core/stream_context.h"
#include "cuda/device_api.h"

namespace ringreduce {
namespace cuda {

// Pipeline lanes of a GPU communicator, one stream each: two, so that one lane's reduction kernel
// runs while the other lane's transfer is in flight. NCCL runs one communicator's kernels one after
// another, so a third lane would only queue behind the second. Not yet measured on a GPU
// (RINGREDUCE_LANES=1 turns the overlap off for comparison).
constexpr std::size_t kDeviceLanes = 2;

// A pool of timing-free events. Ranks of one process share events across threads (a virtual rank
// waits on its peer's), so the pool is locked.
class EventPool {
 public:
  explicit EventPool(DeviceApi& api) : free_(std::make_shared<Free>(api)) {}
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // An event recorded now on `stream`. It returns to the pool when the last holder drops it;
  // waits already queued on it are not affected when it is recorded again.
  std::shared_ptr<void> record(Stream stream);

 private:
  struct Free {
    explicit Free(DeviceApi& api) : api(api) {}
    DeviceApi& api;
    std::mutex mutex;
    std::vector<Event> events;
  };
  std::shared_ptr<Free> free_;
};

// One stream per pipeline lane. Lane 0 is the main stream, the one the caller's stream is joined
// to; the other lanes fork from it when a collective first selects them after fork_lanes(), so
// whatever the collective queues on lane 0 before that (a header check, AVG's pre-multiply) comes
// first for every lane, and they join it again at join_lanes(). Work queued through cuda_stream()
// (copies, reduction kernels, NCCL calls) goes to the selected lane.
class DeviceQueue final : public StreamContext {
 public:
  // Engine-owned non-blocking streams on `device` (they never sync with stream 0). They are never
  // destroyed: torch's caching allocator remembers the streams a tensor was used on (recordStream)
  // and records an event on them when the tensor is freed, which may be long after the
  // communicator has gone. A queue's streams go back to a process-wide pool when it ends, and the
  // next queue on the device takes them; two live queues never share one.
  // `host_wait`: zero for a device whose callers have streams; for the simulated device, whose
  // callers are host code, how long a call waits on the host for its collective (StreamContext).
  DeviceQueue(DeviceApi& api, int device, std::size_t lanes, std::chrono::milliseconds host_wait = {});
  ~DeviceQueue();
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;

  DeviceApi& api() const { return api_; }
  int device() const { return device_; }
  std::size_t lanes() const { return streams_.size(); }
  Stream cuda_stream() const { return streams_[lane_]; }
  Stream lane_stream(std::size_t lane) const { return streams_.at(lane); }
  EventPool& events() { return events_; }

  void select_lane(std::size_t lane);
  // Every lane will wait for what the main stream holds when the lane is first selected.
  void fork_lanes();
  // The main stream waits for every lane, and is selected again.
  void join_lanes();

  void* stream() const override { return streams_[0]; }
  std::shared_ptr<void> mark(void* stream) override { return events_.record(static_cast<Stream>(stream)); }
  // Make the selected lane wait for an event recorded elsewhere (null: nothing to wait for).
  void wait(const std::shared_ptr<void>& event) override;
  void release_to(void* caller) override;
  // With host_wait, the stand-in for the caller's stream is first released to, as a caller's
  // stream would be, and the probe asks about it.
  std::function<bool()> done_probe() override;
  std::chrono::milliseconds host_wait() const override { return host_wait_; }

 private:
  void fork_now();
  void give_back_streams();

  DeviceApi& api_;
  int device_;
  std::chrono::milliseconds host_wait_;
  std::vector<Stream> streams_;
  // With host_wait: the stand-in for the caller's stream, which done_probe() joins first.
  Stream host_stream_ = nullptr;
  std::size_t lane_ = 0;
  bool fork_pending_ = false;  // fork_lanes() was called and no lane but the main one selected since
  EventPool events_;
};

}  // namespace cuda
}  // namespace ringreduce
