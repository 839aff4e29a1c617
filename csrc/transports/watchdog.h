// A watchdog for transports whose work finishes after the host has moved on (GPU streams): a
// thread polls each collective until it completes, and fails the communicator once one is past
// the group's timeout, so a stuck or diverged peer becomes an error instead of a hang. What it
// polls sits behind CompletionSource, so the tests drive it with a fake on any machine.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "core/common.h"

namespace ringreduce {

// How often the watchdog polls. An event query and an async-error query cost about a microsecond,
// so 10 ms keeps the thread's share of a core far below 1% while a failure is reported well
// within the 2 s allowed beyond the timeout.
constexpr std::chrono::milliseconds kWatchdogPoll{10};

class CompletionSource {
 public:
  virtual ~CompletionSource() = default;
  // Called once on the watchdog's thread before it polls (a CUDA source makes its device current).
  virtual void attach() {}
  // A marker after all the work queued so far (a CUDA event on the communicator's main stream).
  virtual std::shared_ptr<void> mark() = 0;
  // Whether the work before `marker` has finished. Called from the watchdog's thread.
  virtual bool reached(const std::shared_ptr<void>& marker) = 0;
  // A failure that shows without waiting (NCCL's asynchronous error, the device's mismatch flag).
  virtual std::optional<AbortNotice> failure() = 0;
  // Ends the work for good (ncclCommAbort) after `notice`, the communicator's failure: transfers in
  // flight stop. Returns the notice the whole group reports (a peer's, if it failed first). Called
  // at most once, from any thread; must not block for long.
  virtual AbortNotice abort(const AbortNotice& notice) = 0;
};

class Watchdog {
 public:
  Watchdog(std::unique_ptr<CompletionSource> source, std::chrono::milliseconds timeout);
  ~Watchdog();  // stops the thread; drain() first to wait for the work
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Collective `sequence` (described by `what`) starts. Its deadline runs from now, or from when the
  // collective before it finishes if that is later: a collective queued behind others is not late
  // for waiting its turn.
  void begin(std::uint64_t sequence, std::string what);
  // Its work is all queued: the watchdog polls a marker after it until it is done.
  void end(std::uint64_t sequence);
  // Throws the notice once the watchdog has failed the communicator.
  void check() const;
  // After a failure the host saw: aborts the work (once) and returns the notice the communicator
  // reports, the watchdog's own if it failed first.
  AbortNotice abort(const AbortNotice& notice);
  // Teardown: waits for every watched collective up to the timeout, and aborts after it. Returns
  // whether the work finished (then the source may be destroyed normally).
  bool drain();
  std::size_t in_flight() const;

 private:
  struct Watched {
    std::uint64_t sequence;
    std::string what;
    std::chrono::steady_clock::time_point deadline;
    std::shared_ptr<void> marker;  // null while the host is still issuing it
  };
  void loop();
  // One round of polling; false once the communicator is broken.
  bool poll();
  // Aborts the source once (outside the lock) and records the group's notice; a second caller waits
  // for that notice.
  void fail(std::unique_lock<std::mutex>& lock, const AbortNotice& notice);

  std::unique_ptr<CompletionSource> source_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Watched> watched_;  // oldest first
  std::optional<AbortNotice> broken_;
  bool aborted_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace ringreduce
