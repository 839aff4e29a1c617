// A transport that times every wait of the transport it wraps, for RINGREDUCE_TRACE. The
// communicator wraps its transport in one only while tracing, so the algorithms never know.
#pragma once

#include <memory>
#include <unordered_map>

#include "core/trace.h"
#include "core/transport.h"

namespace ringreduce {

class TracedTransport final : public Transport {
 public:
  TracedTransport(std::unique_ptr<Transport> inner, TraceRecorder& recorder)
      : inner_(std::move(inner)), recorder_(recorder) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* name() const override { return inner_->name(); }
  std::size_t default_segment_bytes() const override { return inner_->default_segment_bytes(); }
  bool can_post_ahead() const override { return inner_->can_post_ahead(); }
  std::size_t max_lanes() const override { return inner_->max_lanes(); }
  std::size_t default_lanes() const override { return inner_->default_lanes(); }

  void select_lane(std::size_t lane) override;
  void begin_collective(const CollectiveHeader& header, bool check) override;
  void end_collective() override { inner_->end_collective(); }
  bool compares_headers() const override { return inner_->compares_headers(); }
  void agree_with_every_peer() override { inner_->agree_with_every_peer(); }
  void raise_if_failed() override { inner_->raise_if_failed(); }
  void flush() override;
  void cancel() override { inner_->cancel(); }

  Request isend(int peer, const void* data, std::size_t bytes) override;
  Request irecv(int peer, void* data, std::size_t bytes) override;
  Request irecv_reduce(int peer, void* data, std::size_t bytes, const Reducer& reducer, bool last) override;
  Request irecv_forward(int prev, int next, void* data, std::size_t bytes, const Reducer* reducer, bool last) override;

 protected:
  void complete(Request request) override;
  AbortNotice abort_transfers(const AbortNotice& notice) override { return inner_->abort(notice); }

 private:
  // What a posted request is, for the event its wait becomes.
  struct Posted {
    const char* kind;
    int peer;
    std::size_t lane;
    std::size_t bytes;
  };
  Request posted(Request request, const char* kind, int peer, std::size_t bytes);

  std::unique_ptr<Transport> inner_;
  TraceRecorder& recorder_;
  std::unordered_map<std::int64_t, Posted> posted_;
};

}  // namespace ringreduce
