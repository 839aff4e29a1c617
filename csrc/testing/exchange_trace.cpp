#include "testing/exchange_trace.h"

#include "algorithms/algorithms.h"
#include "cpu/reducer.h"
#include "transports/exchange_groups.h"

namespace ringreduce {

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
