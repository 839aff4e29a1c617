#include "algorithms/algorithms.h"
#include "algorithms/schedule.h"

namespace ringreduce {

namespace {

// The central reducer; with `results_back` false it stops once the root holds the result.
void central(Transport& transport, const Reducer& reducer, void* data, std::size_t numel, std::size_t segment_bytes,
             int root, bool results_back) {
  const int world = transport.size();
  const int rank = transport.rank();
  RR_CHECK(root >= 0 && root < world, "central root ", root, " is outside a group of ", world, " ranks");
  if (world == 1 || numel == 0) return;
  const std::size_t elem = reducer.element_size();
  const std::vector<Span> spans = central_schedule(numel, elem, segment_bytes);
  char* base = static_cast<char*>(data);
  auto address = [&](const Span& span) { return base + span.offset * elem; };

  const bool post_ahead = transport.can_post_ahead();
  const std::size_t ahead = post_ahead ? kRecvsAhead : 0;
  if (rank != root) {
    // Send each segment to the root and take the result back in its place.
    RequestWindow sends(transport, post_ahead ? kSendsInFlight : 0);
    RequestWindow results(transport, ahead);
    for (const Span& span : spans) {
      sends.push(transport.isend(root, address(span), span.count * elem));
      if (results_back) results.push(transport.irecv(root, address(span), span.count * elem));
    }
    sends.drain();
    results.drain();
    return;
  }

  // Root. Contributions are reduced in rank order (root's own first), one segment at a time.
  const int last_peer = root == world - 1 ? world - 2 : world - 1;
  std::vector<std::vector<Request>> gathers(spans.size());
  auto post_gather = [&](std::size_t j) {
    for (int peer = 0; peer < world; ++peer) {
      if (peer == root) continue;
      gathers[j].push_back(transport.irecv_reduce(peer, address(spans[j]), spans[j].count * elem, reducer,
                                                  peer == last_peer));
    }
  };
  // A transport that cannot post ahead hands a segment's N-1 result sends over together (one NCCL
  // group): they are all posted, then drained.
  RequestWindow broadcasts(transport, (post_ahead ? kSendsInFlight : 1) * (world - 1));
  std::size_t gathered = 0;  // segments whose receives are posted
  for (std::size_t j = 0; j < spans.size(); ++j) {
    while (gathered < spans.size() && gathered <= j + ahead) post_gather(gathered++);
    // Reduce segment j: every peer's contribution, in rank order.
    for (Request request : gathers[j]) transport.wait(request);
    if (!results_back) continue;
    // Send the finished segment back to every peer.
    for (int peer = 0; peer < world; ++peer) {
      if (peer != root) broadcasts.push(transport.isend(peer, address(spans[j]), spans[j].count * elem));
    }
    if (!post_ahead) broadcasts.drain();
  }
  broadcasts.drain();
}

}  // namespace

void central_all_reduce(Transport& transport, const Reducer& reducer, void* data, std::size_t numel,
                        std::size_t segment_bytes, int root) {
  central(transport, reducer, data, numel, segment_bytes, root, true);
}

void central_reduce(Transport& transport, const Reducer& reducer, void* data, std::size_t numel,
                    std::size_t segment_bytes, int root) {
  central(transport, reducer, data, numel, segment_bytes, root, false);
}

}  // namespace ringreduce
