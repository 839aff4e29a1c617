#include <algorithm>
#include <deque>
#include <optional>

#include "algorithms/algorithms.h"
#include "algorithms/schedule.h"
#include "core/common.h"

namespace ringreduce {

void halving_doubling_all_reduce(Transport& transport, const Reducer& reducer, void* data, std::size_t numel,
                                 std::size_t segment_bytes) {
  RR_CHECK(transport.can_post_ahead(), "halving_doubling needs a transport that posts ahead; ", transport.name(),
           " does not (use ring or central)");
  if (transport.size() == 1) return;
  const std::size_t elem = reducer.element_size();
  const std::size_t segment_elems = std::max<std::size_t>(1, segment_bytes / elem);
  char* base = static_cast<char*>(data);
  for (const HalvingStep& step : halving_doubling_schedule(numel, elem, transport.size(), transport.rank())) {
    // The step's send and receive go in segments, a send and a receive at a time, at most
    // kRecvsAhead ahead of the oldest pair, which is finished receive first (a transport may hold a
    // send until its peer takes it). The two spans never overlap.
    const auto segments = [&](const Span& span) { return (span.count + segment_elems - 1) / segment_elems; };
    const auto segment = [&](const Span& span, std::size_t index) {
      const std::size_t begin = index * segment_elems;
      return Span{span.offset + begin, std::min(segment_elems, span.count - begin)};
    };
    struct Pair {
      std::optional<Request> sent, received;
    };
    std::deque<Pair> pairs;
    const auto finish_oldest = [&] {
      const Pair oldest = pairs.front();
      pairs.pop_front();
      if (oldest.received) transport.wait(*oldest.received);
      if (oldest.sent) transport.wait(*oldest.sent);
    };
    const std::size_t sends = segments(step.send), recvs = segments(step.recv);
    for (std::size_t i = 0; i < std::max(sends, recvs); ++i) {
      Pair pair;
      if (i < sends) {
        const Span out = segment(step.send, i);
        pair.sent = transport.isend(step.peer, base + out.offset * elem, out.count * elem);
      }
      if (i < recvs) {
        const Span in = segment(step.recv, i);
        char* into = base + in.offset * elem;
        pair.received = step.reduce ? transport.irecv_reduce(step.peer, into, in.count * elem, reducer, step.last)
                                    : transport.irecv(step.peer, into, in.count * elem);
      }
      pairs.push_back(pair);
      if (pairs.size() > kRecvsAhead) finish_oldest();
    }
    while (!pairs.empty()) finish_oldest();
  }
}

}  // namespace ringreduce
