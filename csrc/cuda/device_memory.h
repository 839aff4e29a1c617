// A `local` rank whose memory is on a GPU: copies run on its stream, and events tell a peer's
// stream when data is ready or has been consumed. The host never waits for the GPU.
#pragma once

#include "cuda/device_queue.h"
#include "transports/local.h"

namespace ringreduce {
namespace cuda {

// Segment of `local` ranks on a GPU: each segment costs a kernel launch and a few events (a few
// microseconds), so segments are as large as NCCL's per-step buffer. Not yet measured on a GPU.
constexpr std::size_t kDeviceSegmentBytes = 4 << 20;
static_assert(kDeviceLanes <= kLocalMaxLanes, "the local hub needs a channel per device lane");

class DeviceMemory final : public LocalMemory {
 public:
  explicit DeviceMemory(DeviceQueue& queue) : queue_(queue) {}

  void copy(void* dst, const void* src, std::size_t bytes) override;
  std::size_t segment_bytes() const override { return kDeviceSegmentBytes; }
  std::shared_ptr<void> record() override { return queue_.events().record(queue_.cuda_stream()); }
  void wait_for(const std::shared_ptr<void>& marker) override { queue_.wait(marker); }
  std::size_t max_lanes() const override { return queue_.lanes(); }
  std::size_t default_lanes() const override { return queue_.lanes(); }
  void fork_lanes() override { queue_.fork_lanes(); }
  void join_lanes() override { queue_.join_lanes(); }
  void select_lane(std::size_t lane) override { queue_.select_lane(lane); }

 private:
  DeviceQueue& queue_;
};

}  // namespace cuda
}  // namespace ringreduce
