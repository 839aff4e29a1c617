#include "transports/local.h"

#include <cstring>

namespace ringreduce {

void HostMemory::copy(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }

LocalHub::LocalHub(int world, std::chrono::milliseconds timeout)
    : world_(world), timeout_(timeout), channels_(kLocalMaxLanes * world * world) {
  RR_CHECK(world >= 1, "a local world needs at least one rank, got ", world);
}

AbortNotice LocalHub::abort(const AbortNotice& notice) {
  AbortNotice first;
  {
    std::lock_guard<std::mutex> lock(notice_mutex_);
    if (first_notice_.message.empty()) first_notice_ = notice;
    first = first_notice_;
  }
  aborted_ = true;
  for (Channel& channel : channels_) {
    std::lock_guard<std::mutex> lock(channel.mutex);
    channel.changed.notify_all();
  }
  return first;
}

AbortNotice LocalHub::first_notice() {
  std::lock_guard<std::mutex> lock(notice_mutex_);
  return first_notice_;
}

LocalTransport::LocalTransport(std::shared_ptr<LocalHub> hub, int rank, std::unique_ptr<LocalMemory> memory)
    : hub_(std::move(hub)), rank_(rank), memory_(std::move(memory)), recv_sequence_(kLocalMaxLanes * hub_->world(), 0) {
  RR_CHECK(rank >= 0 && rank < hub_->world(), "rank ", rank, " is outside a local world of ", hub_->world());
}

void LocalTransport::begin_collective(const CollectiveHeader& header, bool check) {
  Transport::begin_collective(header, check);
  memory_->fork_lanes();
}

void LocalTransport::select_lane(std::size_t lane) {
  Transport::select_lane(lane);
  memory_->select_lane(lane);
}

LocalTransport::~LocalTransport() { withdraw_sends(); }

void LocalTransport::withdraw_sends() {
  // A peer may still be reading one of our buffers: withdraw what it has not taken, and wait
  // until it has finished what it has, so the caller may free its memory.
  for (std::size_t lane = 0; lane < kLocalMaxLanes; ++lane) {
    for (int peer = 0; peer < hub_->world(); ++peer) {
      LocalHub::Channel& channel = hub_->channel(rank_, peer, lane);
      std::unique_lock<std::mutex> lock(channel.mutex);
      for (auto it = channel.messages.begin(); it != channel.messages.end();) {
        it = it->second.state == LocalHub::State::Posted ? channel.messages.erase(it) : std::next(it);
      }
      channel.changed.wait(lock, [&] {
        for (const auto& entry : channel.messages) {
          if (entry.second.state == LocalHub::State::Taken) return false;
        }
        return true;
      });
    }
  }
}

AbortNotice LocalTransport::abort_transfers(const AbortNotice& notice) {
  const AbortNotice first = hub_->abort(notice);
  withdraw_sends();
  // As at the end of a collective, the rank's later work waits for its lanes. A device error here
  // is dropped: the failure being reported is the one that matters.
  try {
    memory_->join_lanes();
  } catch (const std::exception&) {
  }
  return first;
}

Request LocalTransport::add(Pending pending) {
  const std::int64_t id = next_id_++;
  pending_.emplace(id, pending);
  return Request{id};
}

Request LocalTransport::isend(int peer, const void* data, std::size_t bytes) {
  LocalHub::Channel& channel = hub_->channel(rank_, peer, lane_);
  auto ready = memory_->record();
  std::uint64_t sequence;
  {
    std::lock_guard<std::mutex> lock(channel.mutex);
    sequence = channel.sent++;
    channel.messages.emplace(sequence, LocalHub::Message{data, bytes, header_, std::move(ready), nullptr});
  }
  channel.changed.notify_all();
  return add(Pending{true, peer, lane_, sequence});
}

Request LocalTransport::irecv(int peer, void* data, std::size_t bytes) {
  return add(Pending{false, peer, lane_, recv_sequence_[lane_ * hub_->world() + peer]++, data, bytes});
}

Request LocalTransport::irecv_reduce(int peer, void* data, std::size_t bytes, const Reducer& reducer, bool last) {
  return add(Pending{false, peer, lane_, recv_sequence_[lane_ * hub_->world() + peer]++, data, bytes, &reducer, last});
}

void LocalTransport::complete(Request request) {
  auto it = pending_.find(request.id);
  RR_CHECK(it != pending_.end(), "wait() on an unknown or finished request ", request.id);
  const Pending pending = it->second;
  pending_.erase(it);
  if (pending.is_send) {
    wait_send(pending);
  } else {
    wait_recv(pending);
  }
}

void LocalTransport::fail_waiting(const Pending& pending) {
  withdraw_sends();
  if (hub_->aborted_) hub_->first_notice().raise();
  const std::string what = pending.is_send ? "to take message " : "to send message ";
  throw TimeoutError(detail::concat(timed_out_after(hub_->timeout()), "local rank ", rank_, " waiting for rank ",
                                    pending.peer, " ", what, pending.sequence,
                                    "; is that rank still running the same collectives?"));
}

void LocalTransport::wait_until(LocalHub::Channel& channel, std::unique_lock<std::mutex>& lock,
                                const std::function<bool()>& ready, const Pending& pending) {
  const auto deadline = std::chrono::steady_clock::now() + hub_->timeout();
  for (;;) {
    if (channel.changed.wait_for(lock, kPeekInterval, [&] { return ready() || hub_->aborted_; })) break;
    // Nothing yet: a message from another peer may show that the ranks disagree on this call.
    lock.unlock();
    for (std::size_t lane = 0; lane < kLocalMaxLanes; ++lane) {
      for (int peer = 0; peer < hub_->world(); ++peer) {
        if (peer != rank_) check_waiting_header(peer, lane);
      }
    }
    lock.lock();
    if (std::chrono::steady_clock::now() >= deadline) break;
  }
  if (!ready() || hub_->aborted_) {
    lock.unlock();
    fail_waiting(pending);
  }
}

void LocalTransport::check_waiting_header(int peer, std::size_t lane) {
  // The oldest message from `peer` in `lane` that we have not taken. If it belongs to this call (or
  // an earlier one, which we have finished), its header must match ours; later calls are a peer
  // running ahead.
  LocalHub::Channel& channel = hub_->channel(peer, rank_, lane);
  std::lock_guard<std::mutex> lock(channel.mutex);
  for (const auto& entry : channel.messages) {
    if (entry.first < recv_sequence_[lane * hub_->world() + peer] || entry.second.state != LocalHub::State::Posted) {
      continue;
    }
    if (entry.second.header.sequence <= header_.sequence) check_header(peer, entry.second.header);
    return;
  }
}

void LocalTransport::wait_send(const Pending& pending) {
  LocalHub::Channel& channel = hub_->channel(rank_, pending.peer, pending.lane);
  std::unique_lock<std::mutex> lock(channel.mutex);
  wait_until(channel, lock, [&] { return channel.messages.at(pending.sequence).state == LocalHub::State::Done; },
             pending);
  auto consumed = std::move(channel.messages.find(pending.sequence)->second.consumed);
  channel.messages.erase(pending.sequence);
  lock.unlock();
  // The buffer may be overwritten only after the receiver has read it.
  memory_->wait_for(consumed);
}

void LocalTransport::wait_recv(const Pending& pending) {
  LocalHub::Channel& channel = hub_->channel(pending.peer, rank_, pending.lane);
  std::unique_lock<std::mutex> lock(channel.mutex);
  wait_until(channel, lock, [&] { return channel.messages.count(pending.sequence) > 0; }, pending);
  LocalHub::Message& message = channel.messages.find(pending.sequence)->second;
  check_header(pending.peer, message.header);
  RR_CHECK(message.bytes == pending.bytes, "local rank ", rank_, " expected ", pending.bytes,
           " bytes from rank ", pending.peer, " but it sent ", message.bytes);
  message.state = LocalHub::State::Taken;
  lock.unlock();

  memory_->wait_for(message.ready);
  if (pending.reducer != nullptr) {
    // Fusion: reduce straight from the sender's buffer, no staging copy.
    pending.reducer->reduce(pending.dst, message.data, pending.bytes / pending.reducer->element_size(), pending.last);
  } else {
    memory_->copy(pending.dst, message.data, pending.bytes);
  }
  auto consumed = memory_->record();

  lock.lock();
  message.consumed = std::move(consumed);
  message.state = LocalHub::State::Done;
  lock.unlock();
  channel.changed.notify_all();
}

}  // namespace ringreduce
