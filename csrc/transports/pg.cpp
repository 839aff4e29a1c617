#include "transports/pg.h"

namespace ringreduce {
namespace {

// Tags cycle below this bound; far more than the transfers one pair ever has in flight. A multiple
// of kProcessGroupMaxLanes, so every tag keeps its lane in its low part.
constexpr int kTagCycle = 1 << 24;
static_assert(kTagCycle % kProcessGroupMaxLanes == 0, "tags must keep their lane when they wrap");

}  // namespace

ProcessGroupTransport::ProcessGroupTransport(c10::intrusive_ptr<c10d::Backend> backend,
                                             std::unique_ptr<Rendezvous> notices, std::chrono::milliseconds timeout)
    : backend_(std::move(backend)),
      notices_(std::move(notices)),
      rank_(backend_->getRank()),
      world_(backend_->getSize()),
      timeout_(timeout),
      sends_posted_(kProcessGroupMaxLanes * world_, 0),
      recvs_posted_(kProcessGroupMaxLanes * world_, 0) {}

Request ProcessGroupTransport::post(int peer, void* data, std::size_t bytes, bool is_send) {
  RR_CHECK(backend_, "the pg transport was aborted");
  std::vector<at::Tensor> tensors{
      at::from_blob(data, {static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte))};
  int& posted = (is_send ? sends_posted_ : recvs_posted_)[lane_ * world_ + peer];
  const int tag = posted * static_cast<int>(kProcessGroupMaxLanes) + static_cast<int>(lane_);
  posted = (posted + 1) % (kTagCycle / static_cast<int>(kProcessGroupMaxLanes));
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = is_send ? backend_->send(tensors, peer, tag) : backend_->recv(tensors, peer, tag);
  } catch (const std::exception& error) {
    fail_transfer(peer, is_send, error);  // gloo refuses to post on a connection the peer has closed
  }
  const std::int64_t id = next_id_++;
  pending_.emplace(id, Pending{std::move(work), std::move(tensors), peer, is_send});
  return Request{id};
}

Request ProcessGroupTransport::isend(int peer, const void* data, std::size_t bytes) {
  return post(peer, const_cast<void*>(data), bytes, true);
}

Request ProcessGroupTransport::irecv(int peer, void* data, std::size_t bytes) { return post(peer, data, bytes, false); }

void ProcessGroupTransport::wait_work(Pending& pending) {
  const auto cancelled = [&] {
    return std::runtime_error(detail::concat("ringreduce: pg rank ", rank_name(rank_), ": cancelled"));
  };
  {
    std::lock_guard<std::mutex> lock(waiting_mutex_);
    if (cancelled_.load()) throw cancelled();
    waiting_ = pending.work;
  }
  bool completed = false;
  try {
    completed = pending.work->wait(timeout_);
  } catch (const std::exception& error) {
    forget_waiting();
    fail_transfer(pending.peer, pending.is_send, error);
  }
  forget_waiting();
  // gloo answers an aborted wait with false rather than an error.
  if (cancelled_.load()) throw cancelled();
  RR_CHECK(completed, "rank ", rank_name(rank_), ": a transfer with rank ", rank_name(pending.peer), " was aborted");
}

void ProcessGroupTransport::fail_transfer(int peer, bool is_send, const std::exception& error) {
  // A peer that aborted closed its connections: report its notice, the same on every rank.
  std::optional<AbortNotice> notice;
  std::string store_note;
  try {
    notice = published_abort(*notices_);
  } catch (const std::exception& unreachable) {  // no answer in time, or the store's server is gone
    store_unreachable_ = true;
    store_note = detail::concat("; ", unreachable.what());
  }
  if (notice) notice->raise();
  throw std::runtime_error(detail::concat("ringreduce: rank ", rank_name(rank_), is_send ? " sending to" : " receiving from",
                                          " rank ", rank_name(peer), " over ", backend_->getBackendName(),
                                          " failed (timeout ", timeout_.count(), " ms): ", error.what(), store_note));
}

void ProcessGroupTransport::forget_waiting() {
  std::lock_guard<std::mutex> lock(waiting_mutex_);
  waiting_.reset();
}

void ProcessGroupTransport::cancel() {
  std::lock_guard<std::mutex> lock(waiting_mutex_);
  cancelled_.store(true);
  if (waiting_) waiting_->abort();
}

void ProcessGroupTransport::wait_transfer(Request request) {
  auto it = pending_.find(request.id);
  RR_CHECK(it != pending_.end(), "wait() on an unknown or finished request ", request.id);
  Pending pending = std::move(it->second);
  pending_.erase(it);
  wait_work(pending);
}

AbortNotice ProcessGroupTransport::abort_transfers(const AbortNotice& notice) {
  // The peers that can reach the store learn of the failure from their own links where this rank cannot.
  AbortNotice first = notice;
  try {
    if (!store_unreachable_) first = publish_abort(*notices_, notice);
  } catch (const std::exception&) {  // no answer in time, or the store's server is gone
  }
  for (auto& entry : pending_) entry.second.work->abort();
  pending_.clear();
  // Dropping the backend closes its connections, so peers waiting on us fail now, not at timeout.
  backend_.reset();
  return first;
}

}  // namespace ringreduce
