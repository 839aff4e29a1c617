// How ranks exchange small facts before they can talk (segment names, NCCL ids): a key-value
// store shared by the group. The torch glue backs it with the group's c10d::Store.
#pragma once

#include <string>

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

}  // namespace ringreduce
