#include "algorithms/algorithms.h"
#include "core/common.h"

namespace ringreduce {
namespace {

// What a set of ranks called: its lowest rank's header, and the lowest rank whose header differs
// from that one (none: odd_rank < 0). Plain bytes on the wire.
struct CallsSeen {
  std::int32_t lead_rank = 0;
  std::int32_t odd_rank = -1;
  CollectiveHeader lead;
  CollectiveHeader odd;
};

// The same for the union of two disjoint sets, whichever comes first: the lower set's lead, and the
// lowest rank of either set that differs from it. The higher set's lowest such rank is its lead if
// that differs, or else its own odd rank (which differs from a lead equal to ours).
CallsSeen combine(const CallsSeen& a, const CallsSeen& b) {
  const bool a_lower = a.lead_rank < b.lead_rank;
  const CallsSeen& lower = a_lower ? a : b;
  const CallsSeen& higher = a_lower ? b : a;
  CallsSeen both = lower;
  const bool higher_lead_differs = higher.lead != lower.lead;
  const std::int32_t candidate = higher_lead_differs ? higher.lead_rank : higher.odd_rank;
  if (candidate >= 0 && (both.odd_rank < 0 || candidate < both.odd_rank)) {
    both.odd_rank = candidate;
    both.odd = higher_lead_differs ? higher.lead : higher.odd;
  }
  return both;
}

}  // namespace

void agree_on_call(Transport& transport, const CollectiveHeader& header) {
  CallsSeen seen;
  seen.lead_rank = transport.rank();
  seen.lead = header;
  CallsSeen theirs;
  for (const DoublingStep& step : doubling_schedule(transport.size(), transport.rank())) {
    switch (step.role) {
      case DoublingRole::HandOver:
      case DoublingRole::HandBack:
        transport.wait(transport.isend(step.peer, &seen, sizeof seen));
        break;
      case DoublingRole::TakeOver:
        transport.wait(transport.irecv(step.peer, &theirs, sizeof theirs));
        seen = combine(seen, theirs);
        break;
      case DoublingRole::Exchange: {
        const Request sent = transport.isend(step.peer, &seen, sizeof seen);
        transport.wait(transport.irecv(step.peer, &theirs, sizeof theirs));
        transport.wait(sent);
        seen = combine(seen, theirs);
        break;
      }
      case DoublingRole::TakeBack:
        transport.wait(transport.irecv(step.peer, &seen, sizeof seen));
        break;
    }
  }
  if (seen.odd_rank >= 0) throw_mismatch(seen.odd_rank, seen.odd, seen.lead_rank, seen.lead);
}

}  // namespace ringreduce
