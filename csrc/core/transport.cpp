#include "core/transport.h"

#include <cstdint>
#include <cstdlib>

namespace ringreduce {

// Staging buffers start on a cache line (and page) boundary so the reduction loops vectorise.
constexpr std::size_t kStagingAlignBytes = 4096;
// A receive-reduce lands in its staging at the same offset from a 64-byte line as its destination,
// so that a misaligned destination (a view such as t[1:]) still lines up with its source for the
// vector loops and the GPU's 16-byte packs. 64 covers both (an AVX-512 vector is 64 bytes).
constexpr std::size_t kStagingMatchBytes = 64;

std::shared_ptr<void> MessageTransport::allocate_staging(std::size_t bytes) {
  const std::size_t rounded = (bytes + kStagingAlignBytes - 1) / kStagingAlignBytes * kStagingAlignBytes;
  void* memory = std::aligned_alloc(kStagingAlignBytes, rounded == 0 ? kStagingAlignBytes : rounded);
  RR_CHECK(memory != nullptr, "cannot allocate ", bytes, " bytes of staging memory");
  return std::shared_ptr<void>(memory, &std::free);
}

MessageTransport::Staging MessageTransport::take_staging(std::size_t bytes) {
  if (free_staging_.size() <= lane_) free_staging_.resize(lane_ + 1);
  std::vector<Staging>& pool = free_staging_[lane_];
  for (auto it = pool.begin(); it != pool.end(); ++it) {
    if (it->capacity >= bytes) {
      Staging found = std::move(*it);
      pool.erase(it);
      return found;
    }
  }
  return Staging{allocate_staging(bytes), bytes};
}

Request MessageTransport::irecv_reduce(int peer, void* data, std::size_t bytes, const Reducer& reducer, bool last) {
  Staging staging = take_staging(bytes + kStagingMatchBytes);
  char* into = static_cast<char*>(staging.memory.get()) + reinterpret_cast<std::uintptr_t>(data) % kStagingMatchBytes;
  const Request request = irecv(peer, into, bytes);
  pending_reduces_.emplace(request.id, PendingReduce{data, into, std::move(staging), lane_, bytes, &reducer, last});
  return request;
}

Request Transport::irecv_forward(int prev, int next, void* data, std::size_t bytes, const Reducer* reducer,
                                 bool last) {
  const Request request = reducer != nullptr ? irecv_reduce(prev, data, bytes, *reducer, last) : irecv(prev, data, bytes);
  forwards_.emplace(request.id, Forward{next, data, bytes});
  return request;
}

void Transport::wait(Request request) {
  complete(request);
  auto it = forwards_.find(request.id);
  if (it == forwards_.end()) return;
  const Forward forward = it->second;
  forwards_.erase(it);
  forwarded_sends_.push_back(isend(forward.next, forward.data, forward.bytes));
}

void Transport::agree_with_every_peer() {
  RR_CHECK(can_post_ahead(), name(), " must compare headers with every peer its own way");
  // One round: an empty message to every peer, then one from every peer.
  std::vector<Request> sent;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank()) sent.push_back(isend(peer, nullptr, 0));
  }
  for (int peer = 0; peer < size(); ++peer) {
    if (peer != rank()) wait(irecv(peer, nullptr, 0));
  }
  for (Request request : sent) wait(request);
}

void Transport::flush() {
  std::vector<Request> sends;
  sends.swap(forwarded_sends_);
  for (Request send : sends) complete(send);
}

AbortNotice Transport::abort(const AbortNotice& notice) {
  forwards_.clear();
  forwarded_sends_.clear();
  return abort_transfers(notice);
}

void MessageTransport::complete(Request request) {
  wait_transfer(request);
  auto it = pending_reduces_.find(request.id);
  if (it == pending_reduces_.end()) return;
  PendingReduce pending = std::move(it->second);
  pending_reduces_.erase(it);
  // The reduction runs in the selected lane's order; only its own lane's order follows the receive.
  RR_CHECK(pending.lane == lane_, "a receive posted in lane ", pending.lane, " was waited for in lane ", lane_);
  before_reduction();
  pending.reducer->reduce(pending.dst, pending.src, pending.bytes / pending.reducer->element_size(), pending.last);
  after_reduction();
  free_staging_[pending.lane].push_back(std::move(pending.staging));
}

void RequestWindow::push(Request request) {
  if (!request.valid()) return;
  pending_.push_back(request);
  if (pending_.size() > capacity_) {
    transport_.wait(pending_.front());
    pending_.pop_front();
  }
}

void RequestWindow::drain() {
  while (!pending_.empty()) {
    transport_.wait(pending_.front());
    pending_.pop_front();
  }
}

}  // namespace ringreduce
