#include <algorithm>
#include <cstring>
#include <deque>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/schedule.h"
#include "core/common.h"

namespace ringreduce {
namespace {

// Marks a message as a call check, so that one from a rank doing something else is not read as one.
constexpr std::uint32_t kCheckMagic = 0x52524343;

// What a set of ranks called: its lowest rank's header, and the lowest rank whose header differs
// from that one (none: odd_rank < 0). Plain bytes on the wire.
struct CallsSeen {
  std::uint32_t magic = kCheckMagic;
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

// One rank's recursive doubling (doubling_schedule): every step's first message is what this rank
// has seen of the ranks' calls, followed by the first kCheckedPayloadBytes of its data; the rest of
// the data follows in segments once both ends know that everyone they stand for agrees. Without a
// reducer it is the call check alone. Raises MismatchError on every rank when the calls differ. The
// rounds work on a copy in scratch, which replaces the caller's buffer only once every rank is
// known to agree: a rank may learn of a disagreement after it has reduced, and the caller's data
// is left as it was.
class Doubling {
 public:
  Doubling(Transport& transport, const CollectiveHeader& header, const Reducer* reducer, void* data, void* scratch,
           std::size_t numel, std::size_t segment_bytes)
      : transport_(transport),
        reducer_(reducer),
        elem_(reducer != nullptr ? reducer->element_size() : 1),
        numel_(reducer != nullptr ? numel : 0),
        inline_count_(std::min(numel_, kCheckedPayloadBytes / elem_)),
        data_(static_cast<char*>(data)),
        mine_(static_cast<char*>(scratch)),
        theirs_(static_cast<char*>(scratch) + numel_ * elem_),
        rest_(numel_ > inline_count_ ? central_schedule(numel_ - inline_count_, elem_, segment_bytes)
                                     : std::vector<Span>{}),
        outgoing_(sizeof(CallsSeen) + inline_count_ * elem_),
        // A transport that compares headers gets exactly our size (the sizes agree where the headers
        // do, and it checks the header first); gloo moves only the bytes sent, so a receive there takes
        // the most any rank sends.
        incoming_(sizeof(CallsSeen) + (transport.compares_headers() ? inline_count_ * elem_ : kCheckedPayloadBytes)) {
    for (Span& span : rest_) span.offset += inline_count_;
    seen_.lead_rank = transport.rank();
    seen_.lead = header;
  }

  void run() {
    if (transport_.size() == 1) return;
    if (numel_ > 0) std::memcpy(mine_, data_, numel_ * elem_);
    const std::vector<DoublingStep> steps = doubling_schedule(transport_.size(), transport_.rank());
    std::size_t exchanges_left = 0;
    for (const DoublingStep& step : steps) exchanges_left += step.role == DoublingRole::Exchange;
    for (const DoublingStep& step : steps) {
      switch (step.role) {
        // A rank above the largest power of two lends its buffer to a stand-in; the rest goes
        // ahead, and is waited for once the result says every rank agreed.
        case DoublingRole::HandOver: {
          const Request check = send_check(step.peer);
          for (const Span& span : rest_) lent_.push_back(transport_.isend(step.peer, at(mine_, span), bytes(span)));
          transport_.wait(check);
          break;
        }
        // The stand-in adds the lent buffer to its own before the rounds.
        case DoublingRole::TakeOver:
          seen_ = combine(seen_, receive_check(step.peer));
          if (agreed()) {
            reduce_inline(false);
            RequestWindow window(transport_, kRecvsAhead);
            for (const Span& span : rest_) {
              window.push(transport_.irecv_reduce(step.peer, at(mine_, span), bytes(span), *reducer_, false));
            }
            window.drain();
          }
          break;
        // A round: partners swap what they have seen and hold; both combine the same two views,
        // so both go on with the data, or both leave it.
        case DoublingRole::Exchange: {
          const bool last = --exchanges_left == 0;  // AVG divides here
          const Request sent = send_check(step.peer);
          const CallsSeen theirs = receive_check(step.peer);
          transport_.wait(sent);
          seen_ = combine(seen_, theirs);
          if (agreed()) {
            reduce_inline(last);
            swap_rest(step.peer, last);
          }
          break;
        }
        // The stand-in hands the result back.
        case DoublingRole::HandBack: {
          const Request check = send_check(step.peer);
          if (agreed()) {
            RequestWindow window(transport_, kSendsInFlight);
            for (const Span& span : rest_) window.push(transport_.isend(step.peer, at(mine_, span), bytes(span)));
            window.drain();
          }
          transport_.wait(check);
          break;
        }
        case DoublingRole::TakeBack:
          seen_ = receive_check(step.peer);  // what everyone called
          if (agreed()) {
            if (inline_count_ > 0) std::memcpy(mine_, payload(), inline_count_ * elem_);
            for (Request request : lent_) transport_.wait(request);
            RequestWindow window(transport_, kRecvsAhead);
            for (const Span& span : rest_) window.push(transport_.irecv(step.peer, at(mine_, span), bytes(span)));
            window.drain();
          }
          break;
      }
    }
    if (!agreed()) throw_mismatch(seen_.odd_rank, seen_.odd, seen_.lead_rank, seen_.lead);
    if (numel_ > 0) std::memcpy(data_, mine_, numel_ * elem_);
  }

 private:
  bool agreed() const { return seen_.odd_rank < 0; }
  char* at(char* base, const Span& span) const { return base + span.offset * elem_; }
  std::size_t bytes(const Span& span) const { return span.count * elem_; }
  const unsigned char* payload() const { return incoming_.data() + sizeof(CallsSeen); }

  Request send_check(int peer) {
    std::memcpy(outgoing_.data(), &seen_, sizeof seen_);
    if (inline_count_ > 0) std::memcpy(outgoing_.data() + sizeof seen_, mine_, inline_count_ * elem_);
    return transport_.isend(peer, outgoing_.data(), outgoing_.size());
  }

  CallsSeen receive_check(int peer) {
    const CallsSeen nothing{0};
    std::memcpy(incoming_.data(), &nothing, sizeof nothing);  // a message that is no check leaves no mark
    transport_.wait(transport_.irecv(peer, incoming_.data(), incoming_.size()));
    CallsSeen theirs;
    std::memcpy(&theirs, incoming_.data(), sizeof theirs);
    if (theirs.magic != kCheckMagic) {
      throw MismatchError(detail::concat(
          "ringreduce: the ranks disagree on this collective: rank ", transport_.rank(), " expected rank ", peer,
          "'s check of collective #", seen_.lead.sequence, " and got another message (does every rank run the same "
          "calls, with the same RINGREDUCE_CHECK_CALLS?)"));
    }
    return theirs;
  }

  // The partner's first elements, which came with its check.
  void reduce_inline(bool last) {
    if (inline_count_ > 0) reducer_->reduce(mine_, payload(), inline_count_, last);
  }

  // The rest of a round in segments: the partner's lands in scratch and is reduced in once this
  // rank's own segment has gone too (a transport that copies straight from the sender's buffer,
  // local, may read it until then).
  void swap_rest(int peer, bool last) {
    struct Swap {
      Request sent, received;
      Span span;
    };
    std::deque<Swap> swaps;
    const auto finish_oldest = [&] {
      const Swap swap = swaps.front();
      swaps.pop_front();
      transport_.wait(swap.received);
      transport_.wait(swap.sent);
      reducer_->reduce(at(mine_, swap.span), at(theirs_, swap.span), swap.span.count, last);
    };
    for (const Span& span : rest_) {
      swaps.push_back({transport_.isend(peer, at(mine_, span), bytes(span)),
                       transport_.irecv(peer, at(theirs_, span), bytes(span)), span});
      if (swaps.size() > kRecvsAhead) finish_oldest();
    }
    while (!swaps.empty()) finish_oldest();
  }

  Transport& transport_;
  const Reducer* reducer_;
  const std::size_t elem_;
  const std::size_t numel_;
  const std::size_t inline_count_;
  char* data_;    // the caller's buffer
  char* mine_;    // this rank's working copy
  char* theirs_;  // where the partners' segments land
  std::vector<Span> rest_;
  std::vector<unsigned char> outgoing_, incoming_;
  CallsSeen seen_;
  std::vector<Request> lent_;  // a lender's sends of the rest
};

}  // namespace

void agree_on_call(Transport& transport, const CollectiveHeader& header) {
  Doubling(transport, header, nullptr, nullptr, nullptr, 0, 0).run();
}

void doubling_all_reduce(Transport& transport, const CollectiveHeader& header, const Reducer& reducer, void* data,
                         void* scratch, std::size_t numel, std::size_t segment_bytes) {
  RR_CHECK(transport.can_post_ahead(), "doubling needs a transport that posts ahead; ", transport.name(),
           " does not (use ring or central)");
  Doubling(transport, header, &reducer, data, scratch, numel, segment_bytes).run();
}

}  // namespace ringreduce
