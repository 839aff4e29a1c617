// Some ranks of a transport's group, seen as a group of their own: rank i of the subset is
// members[i] of the whole. The hierarchical collectives run a ring across hosts on it, one rank of
// each host, over the transport that spans the hosts. It moves nothing itself: every transfer is
// the inner transport's, whose call (begun by the communicator) it belongs to.
#pragma once

#include <vector>

#include "core/transport.h"

namespace ringreduce {

class SubsetTransport final : public Transport {
 public:
  // `members` are ranks of `inner`'s group, and include inner.rank().
  SubsetTransport(Transport& inner, std::vector<int> members);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(members_.size()); }
  const char* name() const override { return inner_.name(); }
  std::size_t default_segment_bytes() const override { return inner_.default_segment_bytes(); }
  bool can_post_ahead() const override { return inner_.can_post_ahead(); }
  std::size_t max_lanes() const override { return inner_.max_lanes(); }
  std::size_t default_lanes() const override { return inner_.default_lanes(); }

  void select_lane(std::size_t lane) override;
  // The inner transport's call is begun already: nothing to send or compare again.
  void begin_collective(const CollectiveHeader& header, bool check) override {}
  void flush() override { inner_.flush(); }

  Request isend(int peer, const void* data, std::size_t bytes) override;
  Request irecv(int peer, void* data, std::size_t bytes) override;
  Request irecv_reduce(int peer, void* data, std::size_t bytes, const Reducer& reducer, bool last) override;
  Request irecv_forward(int prev, int next, void* data, std::size_t bytes, const Reducer* reducer, bool last) override;

 protected:
  void complete(Request request) override { inner_.wait(request); }
  AbortNotice abort_transfers(const AbortNotice& notice) override { return inner_.abort(notice); }

 private:
  int member(int peer) const;

  Transport& inner_;
  std::vector<int> members_;
  int rank_ = -1;
};

}  // namespace ringreduce
