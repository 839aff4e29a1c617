#include "ps/parameter_server.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "core/common.h"

namespace ringreduce::ps {
namespace {

// Ranks of the two-rank transport between the server and one remote worker.
constexpr int kServerSide = 0;
constexpr int kWorkerSide = 1;

std::uint64_t payload_bytes(std::size_t numel) { return numel * sizeof(float); }

Message make_message(Kind kind, std::uint64_t step, std::uint64_t version, std::uint64_t numel) {
  Message message;
  message.kind = static_cast<std::uint32_t>(kind);
  message.step = step;
  message.version = version;
  message.numel = numel;
  return message;
}

bool is(const Message& message, Kind kind) { return message.kind == static_cast<std::uint32_t>(kind); }

// Receives the next Message from `peer`; a frame without the magic is refused.
Message receive_message(Transport& transport, int peer) {
  Message message;
  transport.wait(transport.irecv(peer, &message, sizeof message));
  RR_CHECK(message.magic == kMagic, "a parameter-server message without its magic number arrived (",
           message.magic, "): the peer is not a ringreduce parameter server of this version");
  return message;
}

// Sends our Hello to `peer` and checks theirs: the same protocol, and the same Message. `who` names
// the peer in the error.
void exchange_hello(Transport& transport, int peer, const std::string& who) {
  Hello ours;
  ours.message_bytes = sizeof(Message);
  Hello theirs;
  const Request sent = transport.isend(peer, &ours, sizeof ours);
  transport.wait(transport.irecv(peer, &theirs, sizeof theirs));
  // Checked before waiting for our own hello to arrive: a foreign peer may never take it.
  RR_CHECK(theirs.magic == kMagic, who, " is not a ringreduce parameter server peer (its first frame has magic ",
           theirs.magic, ")");
  RR_CHECK(theirs.version == kProtocolVersion && theirs.message_bytes == sizeof(Message), who,
           " speaks parameter-server protocol version ", theirs.version, " (", theirs.message_bytes,
           "-byte messages), this rank version ", kProtocolVersion, " (", sizeof(Message),
           "-byte messages): install the same ringreduce on every rank");
  transport.wait(sent);
}

// Sends `message` and the message.numel floats of its payload; returns the bytes sent.
std::uint64_t send_message(Transport& transport, int peer, const Message& message, const float* payload) {
  const Request header = transport.isend(peer, &message, sizeof message);
  const Request data = transport.isend(peer, payload, payload_bytes(message.numel));
  transport.wait(header);
  transport.wait(data);
  return sizeof message + payload_bytes(message.numel);
}

}  // namespace

void sgd_update(float* params, const float* grad, std::size_t numel, float step) {
  for (std::size_t i = 0; i < numel; ++i) params[i] -= step * grad[i];
}

ServerState::ServerState(float* params, std::size_t numel, int workers, std::int64_t staleness, Update update,
                         bool keep_gradients)
    : params_(params),
      numel_(numel),
      staleness_(staleness),
      update_(std::move(update)),
      keep_gradients_(keep_gradients),
      steps_(workers, 0),
      reads_(workers, 0),
      pushing_(workers, true),
      reports_(workers) {
  RR_CHECK(workers >= 1, "a parameter server needs at least one worker");
  RR_CHECK(staleness >= kUnbounded, "staleness bound ", staleness, " is neither unbounded nor >= 0");
}

bool ServerState::may(int worker, Turn turn) const {
  return turn == Turn::Apply ? may_apply(worker) : may_start(worker);
}

void ServerState::throw_stopped() const {
  throw std::runtime_error(failure_.empty() ? stop_reason_ : failure_);
}

bool ServerState::await_turn(int worker, Turn turn, std::chrono::milliseconds within) {
  std::unique_lock<std::mutex> lock(mutex_);
  const bool ended = progressed_.wait_for(lock, within, [&] { return stopped_ || may(worker, turn); });
  if (stopped_) throw_stopped();
  return ended;
}

std::chrono::steady_clock::duration ServerState::idle_for() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::chrono::steady_clock::now() - last_progress_;
}

std::string ServerState::slowest(int server_rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::uint64_t fewest = ~std::uint64_t{0};
  for (std::size_t w = 0; w < steps_.size(); ++w) {
    if (pushing_[w]) fewest = std::min(fewest, steps_[w]);
  }
  std::string names;
  for (std::size_t w = 0; w < steps_.size(); ++w) {
    if (!pushing_[w] || steps_[w] != fewest) continue;
    names += detail::concat(names.empty() ? "" : ", ", "worker ", w,
                            static_cast<int>(w) == server_rank ? " (the server rank)" : "");
  }
  return names;
}

void ServerState::apply(int worker, std::uint64_t version_read, const float* grad) {
  std::unique_lock<std::mutex> lock(mutex_);
  progressed_.wait(lock, [&] { return stopped_ || may_apply(worker); });
  if (stopped_) throw_stopped();
  RR_CHECK(pushing_[worker], "worker ", worker, " has left and may push no more");
  RR_CHECK(version_read <= version_, "worker ", worker, " read version ", version_read, ", which the server (at version ",
           version_, ") never had");
  try {
    update_(params_, grad, numel_);
  } catch (const std::exception& error) {
    // The parameters may be half updated: nothing more is applied, and every worker is told why.
    failure_ = detail::concat("ringreduce.ps: the parameter server stopped: its update failed at version ", version_,
                              " (applying worker ", worker, "'s push): ", error.what());
    stopped_ = true;
    progressed_.notify_all();
    throw std::runtime_error(failure_);
  }
  const std::uint64_t staleness = version_ - version_read;
  log_.push_back(PushRecord{worker, steps_[worker], version_read, version_});
  if (keep_gradients_) gradients_.emplace_back(grad, grad + numel_);
  WorkerReport& report = reports_[worker];
  ++report.pushes;
  report.staleness_sum += staleness;
  report.staleness_max = std::max(report.staleness_max, staleness);
  ++steps_[worker];
  ++version_;
  last_progress_ = std::chrono::steady_clock::now();
  progressed_.notify_all();
}

bool ServerState::may_start(int worker) const {
  if (staleness_ == kUnbounded) return true;
  std::uint64_t slowest = steps_[worker];
  for (std::size_t other = 0; other < steps_.size(); ++other) {
    if (pushing_[other]) slowest = std::min(slowest, steps_[other]);
  }
  return steps_[worker] <= slowest + static_cast<std::uint64_t>(staleness_);
}

bool ServerState::may_apply(int worker) const {
  if (staleness_ == kUnbounded) return true;
  // Has every worker still pushing read its parameters for step (this push's step - bound)?
  const std::uint64_t step = steps_[worker];
  if (step < static_cast<std::uint64_t>(staleness_)) return true;
  const std::uint64_t reads_needed = step - static_cast<std::uint64_t>(staleness_) + 1;
  for (std::size_t other = 0; other < reads_.size(); ++other) {
    if (pushing_[other] && reads_[other] < reads_needed) return false;
  }
  return true;
}

std::uint64_t ServerState::read_for_next_step(int worker, float* out) {
  std::unique_lock<std::mutex> lock(mutex_);
  progressed_.wait(lock, [&] { return stopped_ || may_start(worker); });
  if (stopped_) throw_stopped();
  std::copy(params_, params_ + numel_, out);
  ++reads_[worker];
  last_progress_ = std::chrono::steady_clock::now();
  progressed_.notify_all();
  return version_;
}

void ServerState::leave(int worker, const std::string& lost) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!pushing_[worker]) return;
  pushing_[worker] = false;
  reports_[worker].lost = lost;
  last_progress_ = std::chrono::steady_clock::now();
  progressed_.notify_all();
}

void ServerState::stop(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stopped_) return;  // the first reason stands
  stopped_ = true;
  stop_reason_ = why;
  progressed_.notify_all();
}

std::string ServerState::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

std::string ServerState::stop_notice() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!stopped_) return "";
  return failure_.empty() ? stop_reason_ : failure_;
}

std::uint64_t ServerState::version() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return version_;
}

std::vector<PushRecord> ServerState::log() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return log_;
}

std::vector<WorkerReport> ServerState::reports() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reports_;
}

std::vector<std::vector<float>> ServerState::gradients() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return gradients_;
}

std::uint64_t LocalWorker::join(float* params) { return version_ = state_.read_for_next_step(rank_, params); }

std::uint64_t LocalWorker::push(const float* grad, float* params) {
  RR_CHECK(!left_, "this worker has left the parameter server");
  state_.apply(rank_, version_, grad);
  return version_ = state_.read_for_next_step(rank_, params);
}

void LocalWorker::leave() {
  left_ = true;
  state_.leave(rank_, "");
}

RemoteWorker::RemoteWorker(std::shared_ptr<Transport> transport, std::size_t numel, int server_rank)
    : transport_(std::move(transport)), numel_(numel), server_rank_(server_rank) {
  RR_CHECK(transport_->size() == 2 && transport_->rank() == kWorkerSide, "a worker's link is rank 1 of two ranks");
}

RemoteWorker::~RemoteWorker() {
  if (left_ || !broken_.empty()) return;
  try {
    leave();
  } catch (const std::exception&) {
    // The server is gone; nothing to tell it.
  }
}

template <typename Body>
auto RemoteWorker::guarded(Body body) {
  RR_CHECK(broken_.empty(), broken_);
  RR_CHECK(!left_, "this worker has left the parameter server");
  try {
    return body();
  } catch (const std::invalid_argument&) {
    throw;  // this rank's own mistake, said as such; the server was told
  } catch (const std::exception& error) {
    broken_ = detail::concat("ringreduce.ps: lost the parameter server (rank ", server_rank_, "): ", error.what());
    try {
      transport_->abort(AbortNotice{AbortNotice::Kind::Failure, broken_});
    } catch (const std::exception&) {
      // The server is gone already; there is nobody left to tell.
    }
    throw std::runtime_error(broken_);
  }
}

Message RemoteWorker::receive_message() {
  for (;;) {
    const Message message = ringreduce::ps::receive_message(*transport_, kServerSide);
    bytes_received_ += sizeof message;
    if (is(message, Kind::KeepAlive)) continue;  // the bound holds us back; the server is alive
    RR_CHECK(is(message, Kind::Params), "the server sent message kind ", message.kind, " where parameters were due");
    return message;
  }
}

std::uint64_t RemoteWorker::receive_params(const Message& reply, float* params) {
  RR_CHECK(reply.numel == numel_, "the server sent ", reply.numel, " parameters where ", numel_, " were due");
  transport_->wait(transport_->irecv(kServerSide, params, payload_bytes(numel_)));
  bytes_received_ += payload_bytes(numel_);
  return version_ = reply.version;
}

std::uint64_t RemoteWorker::join(float* params) {
  return guarded([&] {
    exchange_hello(*transport_, kServerSide, detail::concat("the parameter server (rank ", server_rank_, ")"));
    bytes_sent_ += sizeof(Hello);
    bytes_received_ += sizeof(Hello);
    const Message first = receive_message();
    if (first.numel != numel_) {
      // Take what the server sent, so it is not left waiting, and leave saying why.
      std::vector<float> theirs(first.numel);
      transport_->wait(transport_->irecv(kServerSide, theirs.data(), payload_bytes(first.numel)));
      const Message message = make_message(Kind::Leave, 0, 0, numel_);
      transport_->wait(transport_->isend(kServerSide, &message, sizeof message));
      transport_->flush();
      left_ = true;
      throw std::invalid_argument(detail::concat("ringreduce.ps: this rank's parameters have ", numel_,
                                                 " elements, the server's (rank ", server_rank_, ") ", first.numel,
                                                 ": every rank must pass the same parameters"));
    }
    return receive_params(first, params);
  });
}

std::uint64_t RemoteWorker::push(const float* grad, float* params) {
  return guarded([&] {
    // One exchange: the gradient with the version it came from, then the parameters to go on with.
    const Message message = make_message(Kind::Push, step_, version_, numel_);
    bytes_sent_ += send_message(*transport_, kServerSide, message, grad);
    ++step_;
    return receive_params(receive_message(), params);
  });
}

void RemoteWorker::leave() {
  guarded([&] {
    const Message message = make_message(Kind::Leave, step_, version_, numel_);
    transport_->wait(transport_->isend(kServerSide, &message, sizeof message));
    transport_->flush();
    bytes_sent_ += sizeof message;
  });
  left_ = true;
}

ServerLink::ServerLink(ServerState& state, int worker, int server_rank, std::shared_ptr<Transport> transport,
                       std::chrono::milliseconds timeout)
    : state_(state),
      worker_(worker),
      server_rank_(server_rank),
      transport_(std::move(transport)),
      timeout_(timeout),
      keep_alive_(std::min(kMaxKeepAliveInterval, timeout / kKeepAlivesPerTimeout)) {
  RR_CHECK(transport_->size() == 2 && transport_->rank() == kServerSide, "the server's link is rank 0 of two ranks");
  thread_ = std::thread([this] {
    serve();
    std::lock_guard<std::mutex> lock(finished_mutex_);
    finished_ = true;
    finished_changed_.notify_all();
  });
}

ServerLink::~ServerLink() { join(); }

void ServerLink::join() {
  if (thread_.joinable()) thread_.join();
}

bool ServerLink::finished_within(std::chrono::milliseconds within) {
  std::unique_lock<std::mutex> lock(finished_mutex_);
  return finished_changed_.wait_for(lock, within, [&] { return finished_; });
}

void ServerLink::exchange_hellos() {
  exchange_hello(*transport_, kWorkerSide, detail::concat("worker ", worker_));
  bytes_sent_ += sizeof(Hello);
  bytes_received_ += sizeof(Hello);
}

void ServerLink::await_turn(ServerState::Turn turn) {
  while (!state_.await_turn(worker_, turn, keep_alive_)) {
    const auto idle = state_.idle_for();
    if (idle > kHeldTimeouts * timeout_) {
      throw std::runtime_error(detail::concat(
          "the staleness bound held worker ", worker_, " while nothing happened on the server for ",
          std::chrono::duration_cast<std::chrono::milliseconds>(idle).count(), " ms, waiting for ",
          state_.slowest(server_rank_), ": every worker must step within the timeout (", timeout_.count(),
          " ms; RINGREDUCE_TIMEOUT or the group's timeout sets it)"));
    }
    const Message alive = make_message(Kind::KeepAlive, 0, 0, 0);
    transport_->wait(transport_->isend(kWorkerSide, &alive, sizeof alive));
    bytes_sent_ += sizeof alive;
  }
}

void ServerLink::send_params(std::vector<float>& params) {
  await_turn(ServerState::Turn::Start);
  const Message reply = make_message(Kind::Params, 0, state_.read_for_next_step(worker_, params.data()), params.size());
  bytes_sent_ += send_message(*transport_, kWorkerSide, reply, params.data());
}

void ServerLink::serve() {
  const std::size_t numel = state_.numel();
  std::vector<float> grad(numel), params(numel);
  try {
    exchange_hellos();
    send_params(params);  // the worker joins with the parameters as they are now
    for (std::uint64_t step = 0;; ++step) {
      const Message message = receive_message(*transport_, kWorkerSide);
      bytes_received_ += sizeof message;
      if (is(message, Kind::Leave)) {
        RR_CHECK(message.numel == numel, "worker ", worker_, " has ", message.numel, " parameters, the server ", numel);
        state_.leave(worker_, "");
        return;
      }
      RR_CHECK(is(message, Kind::Push) && message.numel == numel && message.step == step, "worker ", worker_,
               " sent a malformed push (kind ", message.kind, ", step ", message.step, " of ", message.numel,
               " elements; expected step ", step, " of ", numel, ")");
      transport_->wait(transport_->irecv(kWorkerSide, grad.data(), payload_bytes(numel)));
      bytes_received_ += payload_bytes(numel);
      await_turn(ServerState::Turn::Apply);
      state_.apply(worker_, message.version, grad.data());
      send_params(params);
    }
  } catch (const std::exception& error) {
    // A stopped server (its failure, or stopped by its rank) tells the worker why; otherwise the
    // worker is lost.
    std::string notice = state_.stop_notice();
    if (notice.empty()) {
      const std::string why = error.what();
      state_.leave(worker_, why);
      std::fprintf(stderr, "ringreduce.ps: the server lost worker %d and goes on without it: %s\n", worker_,
                   why.c_str());
      notice = detail::concat("ringreduce.ps: the parameter server dropped worker ", worker_, ": ", why);
    }
    try {
      transport_->abort(AbortNotice{AbortNotice::Kind::Failure, notice});
    } catch (const std::exception&) {
      // The worker is gone already; there is nobody left to tell.
    }
  }
}

}  // namespace ringreduce::ps
