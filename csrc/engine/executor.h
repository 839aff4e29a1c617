// Runs a communicator's collectives one at a time, in the order they were issued.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace ringreduce {

class OrderedExecutor {
 public:
  using Job = std::function<void()>;
  using Done = std::function<void(std::exception_ptr)>;

  OrderedExecutor();
  ~OrderedExecutor();  // finishes the queued jobs, then stops the worker
  OrderedExecutor(const OrderedExecutor&) = delete;
  OrderedExecutor& operator=(const OrderedExecutor&) = delete;

  // Runs `job` after every job issued before it and returns when it is done. When nothing is
  // queued it runs on the calling thread, which saves two thread hand-offs (and the allocation of
  // a std::function) on small messages.
  template <typename F>
  void run(F&& job) {
    if (!try_claim()) return run_queued(Job(std::forward<F>(job)));
    struct Release {
      OrderedExecutor* self;
      ~Release() { self->release(); }
    } release{this};
    job();
  }

  // Queues `job` for the worker thread; `done` is called on that thread with its outcome.
  void submit(Job job, Done done);

 private:
  struct Task {
    Job job;
    Done done;
  };
  bool try_claim();  // true when idle: the caller runs its job and then calls release()
  void release();
  void run_queued(Job job);
  void loop();
  static void run_task(Task task);

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Task> queue_;
  bool busy_ = false;  // a job is running, on the worker or inline
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace ringreduce
