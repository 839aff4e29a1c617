#include "exchange_groups.h"

#include "algorithms.h"
#include "cpu_reducer.h"

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

namespace {

// Groups like the nccl transport and records each group instead of moving bytes.
class TracingTransport final : public MessageTransport {
 public:
  TracingTransport(int rank, int world, std::size_t lanes) : rank_(rank), world_(world), lanes_(lanes) {}

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  const char* name() const override { return "trace"; }
  std::size_t default_segment_bytes() const override { return 0; }
  bool can_post_ahead() const override { return false; }
  std::size_t max_lanes() const override { return lanes_; }

  Request isend(int peer, const void* data, std::size_t bytes) override {
    return groups_.hold({true, peer, const_cast<void*>(data), bytes, lane_});
  }
  Request irecv(int peer, void* data, std::size_t bytes) override {
    return groups_.hold({false, peer, data, bytes, lane_});
  }

  std::size_t held() const { return groups_.size(); }
  std::vector<std::vector<TracedTransfer>> traced;

 protected:
  void wait_transfer(Request request) override {
    std::vector<TracedTransfer> group;
    for (const HeldTransfer& t : groups_.release(request)) group.push_back({t.is_send, t.peer, t.bytes});
    if (!group.empty()) traced.push_back(std::move(group));
  }
  AbortNotice abort_transfers(const AbortNotice& notice) override { return notice; }

 private:
  int rank_;
  int world_;
  std::size_t lanes_;
  ExchangeGroups groups_;
};

}  // namespace

std::vector<std::vector<TracedTransfer>> trace_exchange_groups(std::size_t numel, int world, int rank,
                                                               std::size_t segment_bytes, std::size_t lanes,
                                                               bool ring) {
  // The reductions run on whatever the staging memory holds: only the groups matter here.
  std::vector<float> buffer(numel);
  TracingTransport transport(rank, world, lanes);
  const auto reducer = make_cpu_reducer(DType::Float32, ReduceOp::Sum, world);
  if (numel == 0) {
    agree_on_nothing(transport);
  } else if (ring) {
    ring_all_reduce(transport, *reducer, buffer.data(), numel, segment_bytes, lanes);
  } else {
    central_all_reduce(transport, *reducer, buffer.data(), numel, segment_bytes, 0);
  }
  RR_CHECK(transport.held() == 0, transport.held(), " transfers were posted and never handed over");
  return std::move(transport.traced);
}

}  // namespace ringreduce
