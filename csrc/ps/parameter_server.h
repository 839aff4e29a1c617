// An asynchronous parameter server on the engine's transports. One rank holds the parameters (flat
// fp32); every rank of the group is a worker that pushes a gradient and gets the parameters back,
// without waiting for the others, up to a staleness bound. The server's own rank works through
// direct calls (LocalWorker); each other rank talks to it over a transport of two ranks of its own
// (RemoteWorker on the worker, ServerLink on the server), so any transport the engine has carries it.
//
// Each side first sends a Hello, whose size never changes between versions, so peers of different
// builds always receive it whole and refuse each other with a clear error (gloo aborts the process
// on a message longer than the receive posted for it). Then each exchange is a fixed-size Message,
// then its payload of exactly the size the message names, checked before its receive is posted.
//   worker -> server: Push{step, version read} + gradient, or Leave.
//   server -> worker: Params{version} + parameters: once on joining, then in answer to each push;
//                     KeepAlive (no payload) while the staleness bound holds the worker back.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/transport.h"

namespace ringreduce::ps {

// The staleness bound meaning "none": workers never wait for each other.
constexpr std::int64_t kUnbounded = -1;

// Starts every Hello and Message ("RRPS"), so a frame from something else is refused, not trusted.
constexpr std::uint32_t kMagic = 0x53505252;
// The protocol's version, raised whenever Message or the exchanges change.
constexpr std::uint32_t kProtocolVersion = 2;

// As long as version 1's first frame (its 32-byte Message, which began with a kind of 1 to 3), so
// a version-1 peer's first frame arrives whole and is refused by its first word.
struct Hello {
  std::uint32_t magic = kMagic;
  std::uint32_t version = kProtocolVersion;
  std::uint32_t message_bytes = 0;  // sizeof(Message) in this build
  std::uint32_t reserved[5] = {};
};
static_assert(sizeof(Hello) == 32, "Hello is the one frame every version must receive whole: never change it");

enum class Kind : std::uint32_t { Params = 1, Push = 2, Leave = 3, KeepAlive = 4 };

struct Message {
  std::uint32_t magic = kMagic;
  std::uint32_t kind = 0;     // Kind
  std::uint64_t step = 0;     // Push: pushes this worker made before this one
  std::uint64_t version = 0;  // Push: the version its gradient was computed from; Params: the version sent
  std::uint64_t numel = 0;    // elements of the payload that follows
};

// One applied push. Its staleness is version_applied - version_read: the updates other pushes made
// between the worker reading the parameters and its gradient being applied.
struct PushRecord {
  int worker;
  std::uint64_t step;
  std::uint64_t version_read;
  std::uint64_t version_applied;  // the version the gradient was applied to (the version before it)
};

struct WorkerReport {
  std::uint64_t pushes = 0;
  std::uint64_t staleness_sum = 0;
  std::uint64_t staleness_max = 0;
  std::string lost;  // why the server gave up on this worker; empty if it did not
};

// Applies one gradient to the parameters (the default: plain SGD, params -= lr / workers * grad).
using Update = std::function<void(float* params, const float* grad, std::size_t numel)>;

// params[i] -= step * grad[i], in float, one rounding per operation.
void sgd_update(float* params, const float* grad, std::size_t numel, float step);

// The parameters, the version, and the staleness gate, shared by the server's links and its own
// rank's worker. Thread-safe. An update runs under the state's lock, so it may take another lock
// (the Python interpreter's) only if no caller of these methods holds that lock.
class ServerState {
 public:
  ServerState(float* params, std::size_t numel, int workers, std::int64_t staleness, Update update,
              bool keep_gradients);

  std::size_t numel() const { return numel_; }
  int workers() const { return static_cast<int>(reports_.size()); }

  // What a worker waits for under the staleness bound: to apply its push, or to start its next step.
  enum class Turn { Apply, Start };
  // Waits up to `within` until `worker` may take `turn` (see apply and read_for_next_step). True
  // once it may, which then stays true: the bound only loosens as the others go on. Throws once
  // the server has stopped.
  bool await_turn(int worker, Turn turn, std::chrono::milliseconds within);
  // How long since anything happened: a push applied, parameters read, a worker gone.
  std::chrono::steady_clock::duration idle_for() const;
  // The workers still pushing with the fewest pushes (those the bound waits for), as "worker 0 (the
  // server rank), worker 2".
  std::string slowest(int server_rank) const;

  // Applies `worker`'s gradient, computed from parameters of `version_read`. Under a bound s, a push
  // of step k waits until every worker still pushing has read its parameters for step k - s, so
  // with s = 0 every worker of a round computes from the same parameters (synchronous SGD).
  void apply(int worker, std::uint64_t version_read, const float* grad);
  // Waits until `worker` may begin its next step (no more than the bound ahead of the slowest
  // worker still pushing), then copies the parameters into `out`; returns their version. Throws
  // once the server has stopped.
  std::uint64_t read_for_next_step(int worker, float* out);
  // `worker` pushes no more: it finished (`lost` empty) or the server lost it (`lost` says why). The
  // others stop waiting for it.
  void leave(int worker, const std::string& lost);
  // Wakes every waiting reader and pusher with an error saying `why`; later calls throw it too.
  void stop(const std::string& why);
  // Why the server stopped by itself: its update raised (empty otherwise). That is the server's
  // failure, not the pushing worker's: the state stops, every link tells its worker this, and the
  // server rank raises it.
  std::string failure() const;
  // What a call finds once the server has stopped: the failure, or why it was stopped; empty while
  // it runs.
  std::string stop_notice() const;

  std::uint64_t version() const;
  std::vector<PushRecord> log() const;
  std::vector<WorkerReport> reports() const;
  // The gradients applied, in log order (empty unless kept).
  std::vector<std::vector<float>> gradients() const;

 private:
  bool may_start(int worker) const;
  bool may_apply(int worker) const;

  mutable std::mutex mutex_;
  std::condition_variable progressed_;
  float* params_;
  const std::size_t numel_;
  const std::int64_t staleness_;
  const Update update_;
  const bool keep_gradients_;
  bool may(int worker, Turn turn) const;
  [[noreturn]] void throw_stopped() const;

  std::uint64_t version_ = 0;
  std::chrono::steady_clock::time_point last_progress_ = std::chrono::steady_clock::now();
  bool stopped_ = false;
  std::string failure_;
  std::string stop_reason_;
  std::vector<std::uint64_t> steps_;  // pushes applied per worker
  std::vector<std::uint64_t> reads_;  // parameter reads per worker (its join, then one per push)
  std::vector<bool> pushing_;         // workers that have not left
  std::vector<WorkerReport> reports_;
  std::vector<PushRecord> log_;
  std::vector<std::vector<float>> gradients_;
};

// What a training rank calls, wherever the server is.
class Worker {
 public:
  virtual ~Worker() = default;
  // The server's parameters to start from; returns their version.
  virtual std::uint64_t join(float* params) = 0;
  // Pushes a gradient computed from the parameters last received, and receives the parameters for
  // the next step (waiting while the bound says so); returns their version.
  virtual std::uint64_t push(const float* grad, float* params) = 0;
  // This worker is done. Further pushes are refused.
  virtual void leave() = 0;
  // Bytes this worker has sent and received.
  virtual std::uint64_t bytes_sent() const = 0;
  virtual std::uint64_t bytes_received() const = 0;
};

// The server rank's own worker: direct calls into the state.
class LocalWorker final : public Worker {
 public:
  LocalWorker(ServerState& state, int rank) : state_(state), rank_(rank) {}
  std::uint64_t join(float* params) override;
  std::uint64_t push(const float* grad, float* params) override;
  void leave() override;
  std::uint64_t bytes_sent() const override { return 0; }
  std::uint64_t bytes_received() const override { return 0; }

 private:
  ServerState& state_;
  const int rank_;
  std::uint64_t version_ = 0;
  bool left_ = false;
};

// A worker on another rank: rank 1 of a two-rank transport whose rank 0 is the server.
class RemoteWorker final : public Worker {
 public:
  RemoteWorker(std::shared_ptr<Transport> transport, std::size_t numel, int server_rank);
  // Leaves if it has not (best effort): the server need not wait for a worker that was dropped.
  ~RemoteWorker() override;
  std::uint64_t join(float* params) override;
  std::uint64_t push(const float* grad, float* params) override;
  void leave() override;
  std::uint64_t bytes_sent() const override { return bytes_sent_; }
  std::uint64_t bytes_received() const override { return bytes_received_; }

 private:
  Message receive_message();
  // The payload that follows `reply`, into `params`.
  std::uint64_t receive_params(const Message& reply, float* params);
  // Runs one exchange; after a failure the worker is broken and every later call says why.
  template <typename Body>
  auto guarded(Body body);

  std::shared_ptr<Transport> transport_;
  const std::size_t numel_;
  const int server_rank_;
  std::uint64_t step_ = 0;
  std::uint64_t version_ = 0;
  std::uint64_t bytes_sent_ = 0;
  std::uint64_t bytes_received_ = 0;
  bool left_ = false;
  std::string broken_;
};

// How often a link tells a worker held back by the staleness bound that the server is alive: a
// fraction of the transport's timeout, so the worker's receive does not time out while a slow peer
// holds it, and at most once a second (a 32-byte message).
constexpr int kKeepAlivesPerTimeout = 4;
constexpr std::chrono::milliseconds kMaxKeepAliveInterval{1000};
// How many timeouts the bound may hold a worker while nothing at all happens on the server. A slow
// remote worker is dropped by its own link within one timeout (and the others go on), so two mean
// the holder is the server rank's own loop, stuck or slower than the timeout: the held worker is
// told so, instead of waiting for ever.
constexpr int kHeldTimeouts = 2;

// The server's side of one remote worker: a thread that answers its pushes until it leaves, or
// until the transport fails (the worker died, timed out or sent a malformed push), when the worker
// counts as lost, the link says so on stderr, and the others go on without it. `timeout` is the
// transport's (for the keep-alives).
class ServerLink {
 public:
  ServerLink(ServerState& state, int worker, int server_rank, std::shared_ptr<Transport> transport,
             std::chrono::milliseconds timeout);
  ~ServerLink();  // joins the thread
  ServerLink(const ServerLink&) = delete;
  ServerLink& operator=(const ServerLink&) = delete;

  // Waits up to `within` for the worker to leave or be lost; true once it has.
  bool finished_within(std::chrono::milliseconds within);
  // Wakes the link's thread if it is blocked on the worker (the server stops); thread-safe.
  void cancel() { transport_->cancel(); }
  void join();
  std::uint64_t bytes_sent() const { return bytes_sent_.load(); }
  std::uint64_t bytes_received() const { return bytes_received_.load(); }

 private:
  void serve();
  void exchange_hellos();
  // Waits for `worker`'s turn, telling the worker the server is alive while the bound holds it.
  void await_turn(ServerState::Turn turn);
  // Reads the parameters into `params` once the worker may go on (the bound), and sends them.
  void send_params(std::vector<float>& params);

  ServerState& state_;
  const int worker_;
  const int server_rank_;
  std::shared_ptr<Transport> transport_;
  const std::chrono::milliseconds timeout_;
  const std::chrono::milliseconds keep_alive_;
  std::mutex finished_mutex_;
  std::condition_variable finished_changed_;
  bool finished_ = false;
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> bytes_received_{0};
  std::thread thread_;
};

}  // namespace ringreduce::ps
