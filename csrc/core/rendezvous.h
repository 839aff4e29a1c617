// How ranks exchange small facts before they can talk (segment names, NCCL ids): a key-value
// store shared by the group. The torch glue backs it with the group's c10d::Store.
#pragma once

#include <optional>
#include <string>

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
};

// Abort notices through the store, so that every rank of a group reports the failure the first
// aborting rank saw. Returns the group's notice: the first one published.
AbortNotice publish_abort(Rendezvous& rendezvous, const AbortNotice& notice);
// A notice some rank has published, without waiting.
std::optional<AbortNotice> published_abort(Rendezvous& rendezvous);

}  // namespace ringreduce
