// Runs a communicator's collectives one at a time, in the order they were issued.
#pragma once

#include <chrono>
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
  //
  // Called from a completion on the worker (a future's callback that makes another collective and
  // waits for it, as torch's PowerSGD hook does), it runs at once on the worker: queued behind the
  // completion that waits for it, it would never run. So on every rank a callback's collectives come
  // right after the collective whose completion issued them, before anything queued later.
  template <typename F>
  void run(F&& job) {
    if (on_worker()) return job();
    if (!try_claim()) return run_queued(Job(std::forward<F>(job)));
    struct Release {
      OrderedExecutor* self;
      ~Release() { self->release(); }
    } release{this};
    job();
  }

  // Queues `job` for the worker thread; `done` is called on that thread with its outcome. From the
  // worker itself (a completion issuing a collective), both run at once, as in run().
  void submit(Job job, Done done);

  // Whether the calling thread is this executor's worker.
  bool on_worker() const { return std::this_thread::get_id() == worker_id_; }

  // Waits up to `timeout` until no executor of the process runs or holds a job; whether they all
  // went idle. A process about to exit calls it while Python can still run the completions the
  // workers are finishing: a worker that needs the GIL once the interpreter is finalizing is
  // ended mid-call, which aborts the process.
  static bool wait_until_all_idle(std::chrono::milliseconds timeout);

 private:
  struct Task {
    Job job;
    Done done;
  };
  bool idle();
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
  std::thread::id worker_id_;  // set before the worker runs anything
};

}  // namespace ringreduce
