#include "algorithms/algorithms.h"
#include "algorithms/schedule.h"

namespace ringreduce {

void chain_broadcast(Transport& transport, void* data, std::size_t bytes, std::size_t segment_bytes, int root) {
  const int world = transport.size();
  const int rank = transport.rank();
  RR_CHECK(root >= 0 && root < world, "broadcast root ", root, " is outside a group of ", world, " ranks");
  if (world == 1 || bytes == 0) return;
  const int next = (rank + 1) % world;
  const int prev = (rank + world - 1) % world;
  const int position = (rank - root + world) % world;  // 0 at the root, world - 1 at the chain's end
  char* base = static_cast<char*>(data);
  const std::vector<Span> spans = central_schedule(bytes, 1, segment_bytes);
  const bool post_ahead = transport.can_post_ahead();

  if (position == 0) {
    // The root pushes every segment to the next rank.
    RequestWindow sends(transport, post_ahead ? kSendsInFlight : 0);
    for (const Span& span : spans) sends.push(transport.isend(next, base + span.offset, span.count));
    sends.drain();
    return;
  }
  // Every other rank takes each segment from the previous one and, unless it ends the chain,
  // passes it on as soon as it is in.
  const bool forward = position < world - 1;
  RequestWindow recvs(transport, post_ahead ? kRecvsAhead : 0);
  for (const Span& span : spans) {
    char* at = base + span.offset;
    recvs.push(forward ? transport.irecv_forward(prev, next, at, span.count, nullptr, false)
                       : transport.irecv(prev, at, span.count));
  }
  recvs.drain();
  transport.flush();
}

}  // namespace ringreduce
