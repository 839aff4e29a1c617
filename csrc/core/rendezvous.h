// How ranks exchange small facts before they can talk (segment names, NCCL ids): a key-value
// store shared by the group. The torch glue backs it with the group's c10d::Store.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/common.h"

namespace ringreduce {

class Rendezvous {
 public:
  virtual ~Rendezvous() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key is set, up to the store's timeout.
  virtual std::string get(const std::string& key) = 0;
  // Sets the key unless it is set already; returns the value it holds afterwards (the first one).
  virtual std::string set_once(const std::string& key, const std::string& value) = 0;
  // Whether the key is set, without waiting.
  virtual bool has(const std::string& key) = 0;
  // Adds `delta` to the counter at `key` (0 while unset) and returns its new value; add(key, 0) reads it.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Every key's value, in order, once all are set (up to the store's timeout): one request where
  // the store can (torch's multi_get), else one get per key.
  virtual std::vector<std::string> get_all(const std::vector<std::string>& keys);
};

// Every rank's `value`, in rank order, for the `size` ranks that call it with the same `name`, in
// three store requests per rank whatever the size (a get per peer would make N² in all): each rank
// publishes its own, rank 0 reads them all in one request and publishes the list as one key, which
// the others read. With empty values it is a barrier.
std::vector<std::string> all_gather_values(Rendezvous& keys, const std::string& name, int rank, int size,
                                           const std::string& value);

// A rendezvous in memory, for ranks that are threads of one process. Copies share the keys.
class MemoryRendezvous final : public Rendezvous {
 public:
  // get() waits at most `timeout` for a key.
  explicit MemoryRendezvous(std::chrono::milliseconds timeout);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  std::string set_once(const std::string& key, const std::string& value) override;
  bool has(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;

 private:
  struct Keys {
    std::mutex mutex;
    std::condition_variable changed;
    std::map<std::string, std::string> values;
  };
  std::chrono::milliseconds timeout_;
  std::shared_ptr<Keys> keys_ = std::make_shared<Keys>();
};

// Another rendezvous's keys under a prefix, so two users of one store never meet.
class PrefixRendezvous final : public Rendezvous {
 public:
  PrefixRendezvous(Rendezvous& inner, std::string prefix) : inner_(inner), prefix_(std::move(prefix)) {}
  void set(const std::string& key, const std::string& value) override { inner_.set(prefix_ + key, value); }
  std::string get(const std::string& key) override { return inner_.get(prefix_ + key); }
  std::string set_once(const std::string& key, const std::string& value) override {
    return inner_.set_once(prefix_ + key, value);
  }
  bool has(const std::string& key) override { return inner_.has(prefix_ + key); }
  std::int64_t add(const std::string& key, std::int64_t delta) override { return inner_.add(prefix_ + key, delta); }
  std::vector<std::string> get_all(const std::vector<std::string>& keys) override {
    std::vector<std::string> prefixed;
    for (const std::string& key : keys) prefixed.push_back(prefix_ + key);
    return inner_.get_all(prefixed);
  }

 private:
  Rendezvous& inner_;
  std::string prefix_;
};

// A store call that got no answer within its limit (BoundedRendezvous).
class StoreUnreachable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How long a failure path waits for the store: it answers in well under a millisecond on one host
// and within a few across the emulated hosts, and 2 s keeps a failure's report within the group's
// timeout plus a few seconds.
constexpr std::chrono::milliseconds kStoreReplyLimit{2000};

// The store a group's notices travel through is one process's server (torch's TCPStore lives in
// rank 0). Across a link that went down, a call to it blocks until TCP gives up, many minutes later,
// and a rank reporting its own failure must not wait that long. This rendezvous gives each call
// `limit`, then throws StoreUnreachable; the call goes on on a thread of its own, holding `inner`,
// and its late answer is dropped.
class BoundedRendezvous final : public Rendezvous {
 public:
  BoundedRendezvous(std::shared_ptr<Rendezvous> inner, std::chrono::milliseconds limit)
      : inner_(std::move(inner)), limit_(limit) {}
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  std::string set_once(const std::string& key, const std::string& value) override;
  bool has(const std::string& key) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;

 private:
  std::string bounded(const char* what, std::function<std::string(Rendezvous&)> call);

  std::shared_ptr<Rendezvous> inner_;
  std::chrono::milliseconds limit_;
};

// Abort notices through the store, so that every rank of a group reports the failure the first
// aborting rank saw. Returns the group's notice: the first one published.
AbortNotice publish_abort(Rendezvous& rendezvous, const AbortNotice& notice);
// A notice some rank has published, without waiting.
std::optional<AbortNotice> published_abort(Rendezvous& rendezvous);

}  // namespace ringreduce
