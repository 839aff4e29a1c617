#include "engine/traced_transport.h"

namespace ringreduce {

void TracedTransport::select_lane(std::size_t lane) {
  Transport::select_lane(lane);
  inner_->select_lane(lane);
}

void TracedTransport::begin_collective(const CollectiveHeader& header, bool check) {
  Transport::begin_collective(header, check);
  inner_->begin_collective(header, check);
}

Request TracedTransport::posted(Request request, const char* kind, int peer, std::size_t bytes) {
  posted_[request.id] = Posted{kind, peer, lane_, bytes};
  return request;
}

Request TracedTransport::isend(int peer, const void* data, std::size_t bytes) {
  return posted(inner_->isend(peer, data, bytes), "send", peer, bytes);
}

Request TracedTransport::irecv(int peer, void* data, std::size_t bytes) {
  return posted(inner_->irecv(peer, data, bytes), "recv", peer, bytes);
}

Request TracedTransport::irecv_reduce(int peer, void* data, std::size_t bytes, const Reducer& reducer, bool last) {
  return posted(inner_->irecv_reduce(peer, data, bytes, reducer, last), "recv_reduce", peer, bytes);
}

Request TracedTransport::irecv_forward(int prev, int next, void* data, std::size_t bytes, const Reducer* reducer,
                                       bool last) {
  return posted(inner_->irecv_forward(prev, next, data, bytes, reducer, last),
                reducer != nullptr ? "forward_reduce" : "forward", prev, bytes);
}

void TracedTransport::complete(Request request) {
  const std::int64_t begin = trace_clock_ns();
  inner_->wait(request);
  const std::int64_t end = trace_clock_ns();
  auto it = posted_.find(request.id);
  if (it == posted_.end()) return;
  const Posted what = it->second;
  posted_.erase(it);
  TraceEvent event;
  event.name = what.kind;
  event.begin_ns = begin;
  event.end_ns = end;
  event.peer = what.peer;
  event.lane = static_cast<std::uint32_t>(what.lane);
  event.bytes = what.bytes;
  event.sequence = header_.sequence;
  recorder_.record(event);
}

void TracedTransport::flush() {
  const std::int64_t begin = trace_clock_ns();
  inner_->flush();
  TraceEvent event;
  event.name = "flush";
  event.begin_ns = begin;
  event.end_ns = trace_clock_ns();
  event.sequence = header_.sequence;
  recorder_.record(event);
}

}  // namespace ringreduce
