#include "hierarchy/subset_transport.h"

#include <algorithm>

#include "core/common.h"

namespace ringreduce {

SubsetTransport::SubsetTransport(Transport& inner, std::vector<int> members)
    : inner_(inner), members_(std::move(members)) {
  const auto self = std::find(members_.begin(), members_.end(), inner_.rank());
  RR_CHECK(self != members_.end(), "rank ", inner_.rank(), " is not among the subset's members");
  rank_ = static_cast<int>(self - members_.begin());
}

int SubsetTransport::member(int peer) const {
  RR_CHECK(peer >= 0 && peer < size(), "peer ", peer, " is outside a subset of ", size());
  return members_[peer];
}

void SubsetTransport::select_lane(std::size_t lane) {
  Transport::select_lane(lane);
  inner_.select_lane(lane);
}

Request SubsetTransport::isend(int peer, const void* data, std::size_t bytes) {
  return inner_.isend(member(peer), data, bytes);
}

Request SubsetTransport::irecv(int peer, void* data, std::size_t bytes) {
  return inner_.irecv(member(peer), data, bytes);
}

Request SubsetTransport::irecv_reduce(int peer, void* data, std::size_t bytes, const Reducer& reducer, bool last) {
  return inner_.irecv_reduce(member(peer), data, bytes, reducer, last);
}

Request SubsetTransport::irecv_forward(int prev, int next, void* data, std::size_t bytes, const Reducer* reducer,
                                       bool last) {
  return inner_.irecv_forward(member(prev), member(next), data, bytes, reducer, last);
}

}  // namespace ringreduce
