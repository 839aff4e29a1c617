#include "transports/exchange_groups.h"


namespace ringreduce {

Request ExchangeGroups::hold(const HeldTransfer& transfer) {
  const std::int64_t id = next_id_++;
  held_.emplace(id, transfer);
  return Request{id};
}

std::vector<HeldTransfer> ExchangeGroups::release(Request request) {
  RR_CHECK(request.valid() && request.id < next_id_, "wait() on an unknown request ", request.id);
  std::vector<HeldTransfer> group;
  auto waited = held_.find(request.id);
  if (waited == held_.end()) return group;
  const std::size_t lane = waited->second.lane;
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second.lane == lane) {
      group.push_back(it->second);
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  return group;
}

}  // namespace ringreduce
