#include "core/rendezvous.h"

#include <future>
#include <thread>

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

// A list of values as one: each as its length, a colon and its bytes (values may hold any byte).
std::string join_values(const std::vector<std::string>& values) {
  std::string joined;
  for (const std::string& value : values) joined += detail::concat(value.size(), ":", value);
  return joined;
}

std::vector<std::string> split_values(const std::string& joined, int count) {
  std::vector<std::string> values;
  std::size_t at = 0;
  while (at < joined.size()) {
    const std::size_t colon = joined.find(':', at);
    RR_CHECK(colon != std::string::npos, "a gathered list in the store is malformed (a different ringreduce version?)");
    const std::size_t length = std::stoull(joined.substr(at, colon - at));
    values.push_back(joined.substr(colon + 1, length));
    at = colon + 1 + length;
  }
  RR_CHECK(static_cast<int>(values.size()) == count, "a gathered list in the store holds ", values.size(),
           " values for ", count, " ranks (a different ringreduce version?)");
  return values;
}

}  // namespace

std::vector<std::string> Rendezvous::get_all(const std::vector<std::string>& keys) {
  std::vector<std::string> values;
  for (const std::string& key : keys) values.push_back(get(key));
  return values;
}

std::vector<std::string> all_gather_values(Rendezvous& keys, const std::string& name, int rank, int size,
                                           const std::string& value) {
  const std::string all_key = detail::concat(name, "/all");
  keys.set(detail::concat(name, "/", rank), value);
  if (rank != 0) return split_values(keys.get(all_key), size);
  std::vector<std::string> each;
  for (int peer = 0; peer < size; ++peer) each.push_back(detail::concat(name, "/", peer));
  std::vector<std::string> values = keys.get_all(each);
  keys.set(all_key, join_values(values));
  return values;
}

MemoryRendezvous::MemoryRendezvous(std::chrono::milliseconds timeout) : timeout_(timeout) {}

void MemoryRendezvous::set(const std::string& key, const std::string& value) {
  {
    const std::lock_guard<std::mutex> lock(keys_->mutex);
    keys_->values[key] = value;
  }
  keys_->changed.notify_all();
}

std::string MemoryRendezvous::get(const std::string& key) {
  std::unique_lock<std::mutex> lock(keys_->mutex);
  if (!keys_->changed.wait_for(lock, timeout_, [&] { return keys_->values.count(key) > 0; })) {
    throw TimeoutError(detail::concat(timed_out_after(timeout_), "waiting for key '", key, "' of the rendezvous"));
  }
  return keys_->values[key];
}

std::string MemoryRendezvous::set_once(const std::string& key, const std::string& value) {
  std::string held;
  {
    const std::lock_guard<std::mutex> lock(keys_->mutex);
    held = keys_->values.emplace(key, value).first->second;
  }
  keys_->changed.notify_all();
  return held;
}

bool MemoryRendezvous::has(const std::string& key) {
  const std::lock_guard<std::mutex> lock(keys_->mutex);
  return keys_->values.count(key) > 0;
}

std::int64_t MemoryRendezvous::add(const std::string& key, std::int64_t delta) {
  std::int64_t total = delta;
  {
    const std::lock_guard<std::mutex> lock(keys_->mutex);
    std::string& held = keys_->values[key];
    if (!held.empty()) total += std::stoll(held);
    held = std::to_string(total);
  }
  keys_->changed.notify_all();
  return total;
}

std::string BoundedRendezvous::bounded(const char* what, std::function<std::string(Rendezvous&)> call) {
  auto answer = std::make_shared<std::promise<std::string>>();
  std::future<std::string> answered = answer->get_future();
  std::thread([inner = inner_, answer, call = std::move(call)] {
    try {
      answer->set_value(call(*inner));
    } catch (...) {
      answer->set_exception(std::current_exception());
    }
  }).detach();
  if (answered.wait_for(limit_) != std::future_status::ready) {
    throw StoreUnreachable(detail::concat("ringreduce: the group's store did not answer a ", what, " within ",
                                          limit_.count(), " ms (its server runs in rank 0's process: is that host "
                                          "reachable?)"));
  }
  return answered.get();
}

void BoundedRendezvous::set(const std::string& key, const std::string& value) {
  bounded("set", [key, value](Rendezvous& inner) {
    inner.set(key, value);
    return std::string();
  });
}

std::string BoundedRendezvous::get(const std::string& key) {
  return bounded("get", [key](Rendezvous& inner) { return inner.get(key); });
}

std::string BoundedRendezvous::set_once(const std::string& key, const std::string& value) {
  return bounded("set", [key, value](Rendezvous& inner) { return inner.set_once(key, value); });
}

bool BoundedRendezvous::has(const std::string& key) {
  return !bounded("check", [key](Rendezvous& inner) { return inner.has(key) ? std::string("1") : std::string(); }).empty();
}

std::int64_t BoundedRendezvous::add(const std::string& key, std::int64_t delta) {
  return std::stoll(bounded("add", [key, delta](Rendezvous& inner) { return std::to_string(inner.add(key, delta)); }));
}

AbortNotice publish_abort(Rendezvous& rendezvous, const AbortNotice& notice) {
  return decode(rendezvous.set_once(kAbortKey, encode(notice)));
}

std::optional<AbortNotice> published_abort(Rendezvous& rendezvous) {
  if (!rendezvous.has(kAbortKey)) return std::nullopt;
  return decode(rendezvous.get(kAbortKey));
}

}  // namespace ringreduce
