// Transfers held back until the algorithm waits for one of them, for transports whose peers must
// hand matching transfers over together (NCCL groups).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "core/transport.h"

namespace ringreduce {

struct HeldTransfer {
  bool is_send = false;
  int peer = 0;
  void* data = nullptr;
  std::size_t bytes = 0;
  std::size_t lane = 0;
};

// Waiting for a held transfer releases it together with every other transfer held in its lane.
// Without posting ahead (Transport::can_post_ahead() false) that is exactly one exchange: a ring
// step's send and receive, or the central reducer's transfers of one segment, whatever order they
// were posted in; the peers release the matching halves at the same point of their schedules.
class ExchangeGroups {
 public:
  Request hold(const HeldTransfer& transfer);
  // The group that waiting for `request` hands over; empty when it left with an earlier group.
  std::vector<HeldTransfer> release(Request request);
  bool empty() const { return held_.empty(); }
  std::size_t size() const { return held_.size(); }
  void clear() { held_.clear(); }

 private:
  std::map<std::int64_t, HeldTransfer> held_;  // by request id, in posting order
  std::int64_t next_id_ = 0;
};

}  // namespace ringreduce
