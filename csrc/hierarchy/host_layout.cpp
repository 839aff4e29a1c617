#include "hierarchy/host_layout.h"

#include <algorithm>
#include <map>

#include "core/common.h"

namespace ringreduce {

HostLayout::HostLayout(const std::vector<int>& host_of_rank) {
  RR_CHECK(!host_of_rank.empty(), "a host layout needs at least one rank");
  std::map<int, int> number;  // label -> host number, in order of each host's lowest rank
  host_of_.resize(host_of_rank.size());
  local_of_.resize(host_of_rank.size());
  for (int rank = 0; rank < static_cast<int>(host_of_rank.size()); ++rank) {
    const auto found = number.try_emplace(host_of_rank[rank], static_cast<int>(ranks_.size()));
    if (found.second) ranks_.emplace_back();
    const int host = found.first->second;
    host_of_[rank] = host;
    local_of_[rank] = static_cast<int>(ranks_[host].size());
    ranks_[host].push_back(rank);
  }
  for (const std::vector<int>& ranks : ranks_) widest_ = std::max(widest_, static_cast<int>(ranks.size()));
}

int HostLayout::shard_owner(int host, int shard) const {
  const std::vector<int>& ranks = ranks_[host];
  return ranks[shard % static_cast<int>(ranks.size())];
}

std::vector<int> HostLayout::shards_of(int rank) const {
  std::vector<int> shards;
  const int step = static_cast<int>(ranks_[host_of_[rank]].size());
  for (int shard = local_of_[rank]; shard < widest_; shard += step) shards.push_back(shard);
  return shards;
}

bool HostLayout::even() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [&](const std::vector<int>& ranks) { return static_cast<int>(ranks.size()) == widest_; });
}

bool HostLayout::chunked_hierarchy_pays() const {
  return has_hierarchy() && widest_ * (hosts() - 1) < world() - 1;
}

std::string HostLayout::describe() const {
  const auto plural = [](int n, const char* word) { return detail::concat(n, " ", word, n == 1 ? "" : "s"); };
  if (even()) return detail::concat(plural(hosts(), "host"), " x ", plural(widest_, "rank"));
  std::string counts;
  for (const std::vector<int>& ranks : ranks_) counts += detail::concat(counts.empty() ? "" : "+", ranks.size());
  return detail::concat(plural(hosts(), "host"), " (", counts, " ranks)");
}

}  // namespace ringreduce
