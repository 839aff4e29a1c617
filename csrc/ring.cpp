#include "algorithms.h"
#include "schedule.h"

namespace ringreduce {

void ring_all_reduce(Transport& transport, const Reducer& reducer, void* data, std::size_t numel,
                     std::size_t segment_bytes) {
  const int world = transport.size();
  const int rank = transport.rank();
  const std::size_t elem = reducer.element_size();
  const std::vector<RingTransfer> transfers = ring_schedule(numel, elem, world, rank, segment_bytes);
  if (transfers.empty()) return;

  const int next = (rank + 1) % world;
  const int prev = (rank + world - 1) % world;
  char* base = static_cast<char*>(data);
  auto address = [&](const Span& span) { return base + span.offset * elem; };

  std::vector<Request> recvs(transfers.size());
  auto post_recv = [&](std::size_t k) {
    const RingTransfer& t = transfers[k];
    if (t.recv.count == 0) return;
    recvs[k] = t.reduce ? transport.irecv_reduce(prev, address(t.recv), t.recv.count * elem, reducer, t.last)
                        : transport.irecv(prev, address(t.recv), t.recv.count * elem);
  };

  RequestWindow sends(transport, kSendsInFlight);
  for (std::size_t k = 0; k < std::min(kRecvsAhead, transfers.size()); ++k) post_recv(k);
  for (std::size_t k = 0; k < transfers.size(); ++k) {
    const RingTransfer& t = transfers[k];
    // Push this step's span to the next rank: own data first, then what the previous step produced.
    if (t.send.count > 0) sends.push(transport.isend(next, address(t.send), t.send.count * elem));
    // Take the previous rank's span: reduced in during reduce-scatter, kept as is during all-gather.
    if (recvs[k].valid()) transport.wait(recvs[k]);
    // Keep the pipeline full.
    if (k + kRecvsAhead < transfers.size()) post_recv(k + kRecvsAhead);
  }
  sends.drain();
}

}  // namespace ringreduce
