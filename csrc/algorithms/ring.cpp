#include <algorithm>
#include <cstring>

#include "algorithms/algorithms.h"
#include "algorithms/schedule.h"
#include "core/kill_points.h"

namespace ringreduce {

namespace {

// One rank's part of a ring schedule: its sends, receives, reductions and forwards, in order.
// `reducer` may be null when no transfer reduces (the all-gather). `own` (host memory only, or
// null) holds this rank's input when it is not in `data`: its spans are sent from there, and copied
// into `data` just before a reduction into them, while they are still in cache.
void run_ring(Transport& transport, const Reducer* reducer, std::size_t elem, void* data,
              const std::vector<RingTransfer>& transfers, const void* own = nullptr) {
  if (transfers.empty()) return;
  const int world = transport.size();
  const int rank = transport.rank();

  const int next = (rank + 1) % world;
  const int prev = (rank + world - 1) % world;
  char* base = static_cast<char*>(data);
  auto address = [&](const Span& span) { return base + span.offset * elem; };
  const char* own_base = own != nullptr ? static_cast<const char*>(own) : base;
  auto own_address = [&](const Span& span) { return own_base + span.offset * elem; };

  std::vector<Request> recvs(transfers.size());
  // Empty spans travel as empty messages, so every rank makes the same transfers in the same order
  // (a transport may pair a step's send and receive by position).
  auto post_recv = [&](std::size_t k) {
    const RingTransfer& t = transfers[k];
    transport.select_lane(t.lane);
    char* at = address(t.recv);
    const std::size_t bytes = t.recv.count * elem;
    if (t.forward) {
      recvs[k] = transport.irecv_forward(prev, next, at, bytes, t.reduce ? reducer : nullptr, t.last);
    } else {
      recvs[k] = t.reduce ? transport.irecv_reduce(prev, at, bytes, *reducer, t.last) : transport.irecv(prev, at, bytes);
    }
  };

  const std::size_t ahead = transport.can_post_ahead() ? kRecvsAhead : 0;
  std::size_t posted = 0;  // receives posted so far
  std::vector<Request> own_sends;
  // An all-reduce's first all-gather transfer (a test-only kill point, core/kill_points.h).
  const std::size_t first_gather =
      reducer == nullptr ? transfers.size()
                         : std::find_if(transfers.begin(), transfers.end(), [](const RingTransfer& t) { return !t.reduce; }) -
                               transfers.begin();
  for (std::size_t k = 0; k < transfers.size(); ++k) {
    const RingTransfer& t = transfers[k];
    if (k == first_gather) reach_kill_point(KillPoint::RingAllGather);
    transport.select_lane(t.lane);
    // A segment's step 0: push this rank's own data to the next rank. Every later send is a forward.
    if (t.send_own) own_sends.push_back(transport.isend(next, own_address(t.send), t.send.count * elem));
    // Keep the pipeline full: this receive and `ahead` more are posted.
    while (posted < transfers.size() && posted <= k + ahead) post_recv(posted++);
    transport.select_lane(t.lane);
    // Take the previous rank's span: reduce it in (reduce-scatter) or keep it (all-gather), and pass
    // the result on to the next rank unless this is the segment's last step. Reductions happen in
    // wait(), so this rank's own span is in place in time.
    if (own != nullptr && t.reduce) std::memcpy(address(t.recv), own_address(t.recv), t.recv.count * elem);
    transport.wait(recvs[k]);
  }
  for (Request send : own_sends) transport.wait(send);
  transport.flush();
}

}  // namespace

void ring_all_reduce(Transport& transport, const Reducer& reducer, void* data, std::size_t numel,
                     std::size_t segment_bytes, std::size_t lanes) {
  const std::size_t elem = reducer.element_size();
  run_ring(transport, &reducer, elem, data,
           ring_schedule(numel, elem, transport.size(), transport.rank(), segment_bytes, lanes));
}

void ring_reduce_scatter(Transport& transport, const Reducer& reducer, void* data, std::size_t chunk_elems,
                         std::size_t segment_bytes, std::size_t lanes, const void* input) {
  const std::size_t elem = reducer.element_size();
  if (input != nullptr && transport.size() == 1) {  // no steps: the one chunk is the input
    std::memcpy(data, input, chunk_elems * elem);
    return;
  }
  const SegmentLayout layout = chunk_layout(chunk_elems, elem, transport.size(), segment_bytes);
  run_ring(transport, &reducer, elem, data,
           ring_schedule(layout, transport.size(), transport.rank(), lanes, RingPhases::ReduceScatter), input);
}

void ring_reduce_scatter(Transport& transport, const Reducer& reducer, void* data, const SegmentLayout& layout,
                         std::size_t lanes, bool finishes) {
  std::vector<RingTransfer> transfers =
      ring_schedule(layout, transport.size(), transport.rank(), lanes, RingPhases::ReduceScatter);
  if (!finishes) {
    for (RingTransfer& t : transfers) t.last = false;
  }
  run_ring(transport, &reducer, reducer.element_size(), data, transfers);
}

void ring_all_gather(Transport& transport, std::size_t elem, void* data, std::size_t chunk_elems,
                     std::size_t segment_bytes, std::size_t lanes) {
  ring_all_gather(transport, elem, data, chunk_layout(chunk_elems, elem, transport.size(), segment_bytes), lanes);
}

void ring_all_gather(Transport& transport, std::size_t elem, void* data, const SegmentLayout& layout, std::size_t lanes) {
  run_ring(transport, nullptr, elem, data,
           ring_schedule(layout, transport.size(), transport.rank(), lanes, RingPhases::AllGather));
}

void agree_on_nothing(Transport& transport) {
  const int world = transport.size();
  if (world == 1) return;
  const int rank = transport.rank();
  const Request sent = transport.isend((rank + 1) % world, nullptr, 0);
  transport.wait(transport.irecv((rank + world - 1) % world, nullptr, 0));
  transport.wait(sent);
}

}  // namespace ringreduce
