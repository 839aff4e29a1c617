#include "transports/watchdog.h"

#include <algorithm>

namespace ringreduce {

Watchdog::Watchdog(std::unique_ptr<CompletionSource> source, std::chrono::milliseconds timeout)
    : source_(std::move(source)), timeout_(timeout), thread_([this] { loop(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Watchdog::begin(std::uint64_t sequence, std::string what) {
  std::lock_guard<std::mutex> lock(mutex_);
  watched_.push_back({sequence, std::move(what), std::chrono::steady_clock::now() + timeout_, nullptr});
}

void Watchdog::end(std::uint64_t sequence) {
  std::shared_ptr<void> marker = source_->mark();
  std::lock_guard<std::mutex> lock(mutex_);
  for (Watched& watched : watched_) {
    if (watched.sequence == sequence) watched.marker = std::move(marker);
  }
}

void Watchdog::check() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_) broken_->raise();
}

std::size_t Watchdog::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return watched_.size();
}

AbortNotice Watchdog::abort(const AbortNotice& notice) {
  std::unique_lock<std::mutex> lock(mutex_);
  fail(lock, notice);
  return *broken_;
}

void Watchdog::fail(std::unique_lock<std::mutex>& lock, const AbortNotice& notice) {
  if (aborted_) {
    changed_.wait(lock, [this] { return broken_.has_value(); });
    return;
  }
  aborted_ = true;
  lock.unlock();
  const AbortNotice group = source_->abort(notice);
  lock.lock();
  broken_ = group;
  watched_.clear();
  changed_.notify_all();
}

bool Watchdog::poll() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (broken_) return false;
  // Collectives complete in issue order: drop the finished ones from the front.
  while (!watched_.empty() && watched_.front().marker) {
    const std::shared_ptr<void> marker = watched_.front().marker;
    lock.unlock();
    const bool done = source_->reached(marker);
    lock.lock();
    if (!done || broken_ || watched_.empty() || watched_.front().marker != marker) break;
    watched_.pop_front();
    if (!watched_.empty()) {
      Watched& next = watched_.front();
      next.deadline = std::max(next.deadline, std::chrono::steady_clock::now() + timeout_);
    }
    changed_.notify_all();
  }
  if (broken_) return false;
  lock.unlock();
  std::optional<AbortNotice> failure = source_->failure();
  lock.lock();
  if (failure) {
    fail(lock, *failure);
    return false;
  }
  if (!watched_.empty() && std::chrono::steady_clock::now() > watched_.front().deadline) {
    const Watched& late = watched_.front();
    fail(lock, {AbortNotice::Kind::Timeout,
                detail::concat(timed_out_after(timeout_), late.what,
                               " did not finish: a peer stopped, or made a different call. The communicator was aborted; every "
                               "later call on this group raises until ringreduce.destroy(group)")});
    return false;
  }
  return true;
}

void Watchdog::loop() {
  source_->attach();
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    const bool healthy = poll();
    lock.lock();
    // A broken communicator has nothing left to poll; stay until teardown.
    if (!healthy) {
      changed_.wait(lock, [this] { return stopping_; });
    } else {
      changed_.wait_for(lock, kWatchdogPoll, [this] { return stopping_; });
    }
  }
}

bool Watchdog::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  // The watchdog's own deadlines still apply; this one bounds the whole teardown.
  const bool finished =
      changed_.wait_until(lock, deadline, [this] { return watched_.empty() || broken_.has_value(); });
  if (finished && !broken_) return true;
  if (!broken_) {
    fail(lock, {AbortNotice::Kind::Timeout,
                detail::concat(timed_out_after(timeout_),
                               "teardown waited for collectives that never finished; the communicator was aborted")});
  }
  return false;
}

}  // namespace ringreduce
