#include "engine/executor.h"

#include <future>

namespace ringreduce {

OrderedExecutor::OrderedExecutor() : worker_([this] { loop(); }) {}

OrderedExecutor::~OrderedExecutor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

bool OrderedExecutor::try_claim() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!queue_.empty() || busy_) return false;
  busy_ = true;
  return true;
}

void OrderedExecutor::release() {
  bool jobs_waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    jobs_waiting = !queue_.empty() || stopping_;
  }
  // Wake the worker only when it has something to do: an idle worker woken after every inline
  // call cost a futex wake-up and a context switch per all-reduce.
  if (jobs_waiting) changed_.notify_all();
}

void OrderedExecutor::run_queued(Job job) {
  std::promise<void> finished;
  std::future<void> outcome = finished.get_future();
  submit(std::move(job), [&finished](std::exception_ptr error) {
    if (error) {
      finished.set_exception(error);
    } else {
      finished.set_value();
    }
  });
  outcome.get();
}

void OrderedExecutor::submit(Job job, Done done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(Task{std::move(job), std::move(done)});
  }
  changed_.notify_all();
}

void OrderedExecutor::loop() {
  for (;;) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return !busy_ && (!queue_.empty() || stopping_); });
    if (queue_.empty()) return;
    Task task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    run_task(std::move(task));  // destroyed in there: its tensors may need the GIL, so not under our lock
    lock.lock();
    busy_ = false;  // only this thread waits on changed_, so nobody needs waking
  }
}

void OrderedExecutor::run_task(Task task) {
  std::exception_ptr error;
  try {
    task.job();
  } catch (...) {
    error = std::current_exception();
  }
  task.done(error);
}

}  // namespace ringreduce
