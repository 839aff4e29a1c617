#include "engine/executor.h"

#include <future>
#include <set>

namespace ringreduce {
namespace {

// How often wait_until_all_idle() looks at the executors: short beside a collective's completion.
constexpr std::chrono::milliseconds kIdlePoll{1};

// The executors alive. Never destroyed: an executor may outlive static destruction.
struct Registry {
  std::mutex mutex;
  std::set<OrderedExecutor*> executors;
};
Registry& registry() {
  static Registry* all = new Registry;
  return *all;
}

}  // namespace

OrderedExecutor::OrderedExecutor() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);  // the worker waits for its id to be known
    worker_ = std::thread([this] { loop(); });
    worker_id_ = worker_.get_id();
  }
  const std::lock_guard<std::mutex> lock(registry().mutex);
  registry().executors.insert(this);
}

bool OrderedExecutor::wait_until_all_idle(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      const std::lock_guard<std::mutex> lock(registry().mutex);
      bool all_idle = true;
      for (OrderedExecutor* executor : registry().executors) all_idle = all_idle && executor->idle();
      if (all_idle) return true;
    }
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(kIdlePoll);
  }
}

bool OrderedExecutor::idle() {
  const std::lock_guard<std::mutex> lock(mutex_);
  return !busy_ && queue_.empty();
}

OrderedExecutor::~OrderedExecutor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
  // Registered until its worker has ended: wait_until_all_idle() counts a worker that finishes its
  // last jobs (which may run Python) as busy.
  const std::lock_guard<std::mutex> lock(registry().mutex);
  registry().executors.erase(this);
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
  if (on_worker()) return run_task(Task{std::move(job), std::move(done)});
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
