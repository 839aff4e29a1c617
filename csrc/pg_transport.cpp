#include "pg_transport.h"

namespace ringreduce {

// Tags cycle below this bound; far more than the transfers one pair ever has in flight.
constexpr int kTagCycle = 1 << 24;

ProcessGroupTransport::ProcessGroupTransport(c10::intrusive_ptr<c10d::Backend> backend,
                                             std::chrono::milliseconds timeout)
    : backend_(std::move(backend)),
      timeout_(timeout),
      send_tags_(backend_->getSize(), 0),
      recv_tags_(backend_->getSize(), 0) {}

Request ProcessGroupTransport::post(int peer, void* data, std::size_t bytes, bool is_send) {
  std::vector<at::Tensor> tensors{
      at::from_blob(data, {static_cast<int64_t>(bytes)}, at::TensorOptions().dtype(at::kByte))};
  int& tag = (is_send ? send_tags_ : recv_tags_)[peer];
  auto work = is_send ? backend_->send(tensors, peer, tag) : backend_->recv(tensors, peer, tag);
  tag = (tag + 1) % kTagCycle;
  const std::int64_t id = next_id_++;
  pending_.emplace(id, Pending{std::move(work), std::move(tensors), peer, is_send});
  return Request{id};
}

Request ProcessGroupTransport::isend(int peer, const void* data, std::size_t bytes) {
  return post(peer, const_cast<void*>(data), bytes, true);
}

Request ProcessGroupTransport::irecv(int peer, void* data, std::size_t bytes) { return post(peer, data, bytes, false); }

void ProcessGroupTransport::wait_transfer(Request request) {
  auto it = pending_.find(request.id);
  RR_CHECK(it != pending_.end(), "wait() on an unknown or finished request ", request.id);
  Pending pending = std::move(it->second);
  pending_.erase(it);
  try {
    pending.work->wait(timeout_);
  } catch (const std::exception& error) {
    throw std::runtime_error(detail::concat("ringreduce: rank ", rank(), pending.is_send ? " sending to" : " receiving from",
                                            " rank ", pending.peer, " over ", backend_->getBackendName(),
                                            " failed (timeout ", timeout_.count(), " ms): ", error.what()));
  }
}

void ProcessGroupTransport::abort_transfers(const std::string& /*reason*/) {
  for (auto& entry : pending_) entry.second.work->abort();
  pending_.clear();
}

}  // namespace ringreduce
