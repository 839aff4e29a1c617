#include "core/rendezvous.h"

namespace ringreduce {
namespace {

// The store key where the first aborting rank leaves its notice for the others.
constexpr const char* kAbortKey = "abort";

std::string encode(const AbortNotice& notice) {
  return std::string(1, static_cast<char>('0' + static_cast<int>(notice.kind))) + notice.message;
}

AbortNotice decode(const std::string& text) {
  if (text.empty()) return {AbortNotice::Kind::Failure, "ringreduce: a peer aborted without a reason"};
  return {static_cast<AbortNotice::Kind>(text[0] - '0'), text.substr(1)};
}

}  // namespace

AbortNotice publish_abort(Rendezvous& rendezvous, const AbortNotice& notice) {
  return decode(rendezvous.set_once(kAbortKey, encode(notice)));
}

std::optional<AbortNotice> published_abort(Rendezvous& rendezvous) {
  if (!rendezvous.has(kAbortKey)) return std::nullopt;
  return decode(rendezvous.get(kAbortKey));
}

}  // namespace ringreduce
