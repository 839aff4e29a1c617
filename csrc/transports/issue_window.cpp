#include "transports/issue_window.h"

#include "core/common.h"

namespace ringreduce {

IssueWindow::IssueWindow(std::size_t capacity, std::function<bool(const std::shared_ptr<void>&)> reached,
                         std::function<void()> pause)
    : capacity_(capacity), reached_(std::move(reached)), pause_(std::move(pause)) {
  RR_CHECK(capacity_ > 0, "an issue window needs room for at least one operation");
}

void IssueWindow::make_room(std::size_t ops) {
  // Batches may finish out of order (one per lane); the oldest is looked at, which may keep the
  // host waiting a little longer than needed but never lets it run further ahead.
  while (!batches_.empty() && in_flight_ + ops > capacity_) {
    if (reached_(batches_.front().marker)) {
      in_flight_ -= batches_.front().ops;
      batches_.pop_front();
    } else {
      pause_();
    }
  }
}

void IssueWindow::queued(std::size_t ops) {
  in_flight_ += ops;
  unmarked_ += ops;
}

void IssueWindow::mark(std::shared_ptr<void> marker) {
  batches_.push_back(Batch{std::move(marker), unmarked_});
  unmarked_ = 0;
}

void IssueWindow::clear() {
  batches_.clear();
  in_flight_ = 0;
  unmarked_ = 0;
}

}  // namespace ringreduce
