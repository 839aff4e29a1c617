#include "cuda/sim_device.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "cuda/header_check.h"
#include "cuda/host_kernels.h"
#include "transports/shm.h"

namespace ringreduce {
namespace cuda {
namespace {

// The grid the kernels' bodies run over: two blocks of a warp, so a grid-stride loop takes several
// strides on any tensor beyond 64 elements, as on a GPU (host_kernels runs the threads in turn).
constexpr std::size_t kSimBlocks = 2;
constexpr std::size_t kSimThreadsPerBlock = 32;
// Delays by default: up to 200 us before half of the stream operations, far beyond the few
// microseconds the host takes between issuing two of them, so the device runs behind the host and
// its streams overtake each other; a 4-rank test of a few hundred operations stays under a second.
constexpr std::chrono::microseconds kDefaultMaxDelay{200};
constexpr std::uint64_t kDefaultSeed = 0x5eed;
// NCCL has no timeout of its own, and neither has the simulated one: the watchdog above it aborts.
// Its shm wire is given one longer than any test or training step.
constexpr std::chrono::hours kWireTimeout{24};
// How often an operation that waits for a flag in mapped memory looks at it.
constexpr std::chrono::microseconds kFlagPoll{100};
// Exit status of a process that SimFault::Exit ends.
constexpr int kExitStatus = 17;

// A text that lives for good: failures are returned as plain pointers (device_api.h).
const char* lasting(const std::string& text) { return (new std::string(text))->c_str(); }

struct Armed {
  SimFault fault;
  std::size_t after;
  std::chrono::milliseconds duration;
  std::uint64_t armed_at;  // operations queued before were queued before the fault: it spares them
};

// Stream operations queued so far in this process: the stamp that tells an armed fault which
// operations came after it (the streams of a failed collective may still be draining older ones).
std::atomic<std::uint64_t> queued_operations{0};

class SimStream;

// What the simulated GPUs of this process share: the timing, the armed faults and the errors.
struct Settings {
  std::mutex mutex;
  std::uint64_t seed = kDefaultSeed;
  std::chrono::microseconds max_delay = kDefaultMaxDelay;
  std::uint64_t epoch = 0;  // configure_sim() calls so far: streams reseed when it moves
  std::map<int, std::vector<Armed>> faults;
  std::map<int, const char*> errors;  // a device's sticky error, as CUDA keeps one
  std::atomic<std::size_t> streams{0};
  std::atomic<std::size_t> busy{0};          // streams with operations queued or running
  std::map<int, std::size_t> busy_on;        // the same per device, under `mutex`
  std::atomic<std::size_t> most_queued{0};   // the most operations one stream has held
  std::vector<SimStream*> every_stream;  // under `mutex`
};

Settings& settings() {
  static Settings* shared = new Settings;  // stream threads outlive static destructors
  return *shared;
}

// The armed fault that strikes this operation of `device`, queued at `stamp`, if any: a kernel,
// or an NCCL group.
std::optional<Armed> strike(int device, bool nccl_group, std::uint64_t stamp) {
  Settings& all = settings();
  const std::lock_guard<std::mutex> lock(all.mutex);
  auto found = all.faults.find(device);
  if (found == all.faults.end()) return std::nullopt;
  std::vector<Armed>& armed = found->second;
  for (auto it = armed.begin(); it != armed.end(); ++it) {
    if ((it->fault != SimFault::Stall) != nccl_group || stamp <= it->armed_at) continue;
    if (it->after > 0) {
      --it->after;
      continue;
    }
    const Armed struck = *it;
    armed.erase(it);
    return struck;
  }
  return std::nullopt;
}

void set_device_error(int device, const std::string& what) {
  Settings& all = settings();
  const std::lock_guard<std::mutex> lock(all.mutex);
  all.errors.emplace(device, lasting(what));
}

const char* device_error(int device) {
  Settings& all = settings();
  const std::lock_guard<std::mutex> lock(all.mutex);
  auto found = all.errors.find(device);
  return found == all.errors.end() ? nullptr : found->second;
}

thread_local int current_device = 0;

// An in-order queue of operations, run by a thread of its own. Never destroyed, as CUDA streams of
// the engine never are (device_queue.h).
class SimStream {
 public:
  SimStream(int device, std::uint64_t number) : device_(device), number_(number) {
    std::thread([this] { run(); }).detach();
    ++settings().streams;
    const std::lock_guard<std::mutex> lock(settings().mutex);
    settings().every_stream.push_back(this);
  }

  int device() const { return device_; }

  // Queues `operation`, which is given its stamp when it runs. Kernels are what a Stall strikes.
  void push(std::function<void(std::uint64_t stamp)> operation, bool kernel = false) {
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      operations_.push_back({std::move(operation), ++queued_operations, kernel});
      if (pushed_++ == done_) count_busy(+1);
      std::size_t most = settings().most_queued.load();
      const std::size_t held = pushed_ - done_;
      while (held > most && !settings().most_queued.compare_exchange_weak(most, held)) {
      }
    }
    changed_.notify_all();
  }

  void synchronize() {
    std::unique_lock<std::mutex> lock(mutex_);
    const std::uint64_t target = pushed_;
    changed_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  void run() {
    std::mt19937_64 random;
    std::uint64_t epoch = ~std::uint64_t{0};
    for (;;) {
      Queued next;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return !operations_.empty(); });
        next = std::move(operations_.front());
        operations_.pop_front();
      }
      delay(random, epoch);
      if (next.kernel) {
        if (std::optional<Armed> stall = strike(device_, false, next.stamp)) std::this_thread::sleep_for(stall->duration);
      }
      try {
        next.operation(next.stamp);
      } catch (const std::exception& error) {
        set_device_error(device_, error.what());
      }
      {
        const std::lock_guard<std::mutex> lock(mutex_);
        if (++done_ == pushed_) count_busy(-1);
      }
      changed_.notify_all();
    }
  }

  // This stream turned busy (+1) or idle (-1).
  void count_busy(int change) {
    Settings& all = settings();
    all.busy += change;
    const std::lock_guard<std::mutex> lock(all.mutex);
    all.busy_on[device_] += change;
  }

  // Half of the operations wait a random time first (see kDefaultMaxDelay).
  void delay(std::mt19937_64& random, std::uint64_t& epoch) {
    std::chrono::microseconds most{0};
    {
      Settings& all = settings();
      const std::lock_guard<std::mutex> lock(all.mutex);
      if (epoch != all.epoch) {
        epoch = all.epoch;
        random.seed(all.seed ^ (number_ * 0x9e3779b97f4a7c15ull));
      }
      most = all.max_delay;
    }
    if (most.count() == 0 || random() % 2 == 0) return;
    std::this_thread::sleep_for(std::chrono::microseconds(random() % (most.count() + 1)));
  }

  const int device_;
  const std::uint64_t number_;
  std::mutex mutex_;
  std::condition_variable changed_;
  struct Queued {
    std::function<void(std::uint64_t stamp)> operation;
    std::uint64_t stamp = 0;
    bool kernel = false;
  };
  std::deque<Queued> operations_;
  std::uint64_t pushed_ = 0;
  std::uint64_t done_ = 0;
};

SimStream* sim(Stream stream) { return reinterpret_cast<SimStream*>(stream); }

// An event: the records made on it and those their streams have not reached yet. A wait is for the
// latest record when it was queued, as cudaStreamWaitEvent's is.
struct SimEvent {
  int device;
  std::mutex mutex;
  std::condition_variable changed;
  std::uint64_t recorded = 0;
  std::set<std::uint64_t> pending;
};
using EventBox = std::shared_ptr<SimEvent>;
const EventBox& sim(Event event) { return *reinterpret_cast<EventBox*>(event); }

class SimDevice final : public DeviceApi {
 public:
  const char* name() const override { return "sim"; }
  Failure get_device(int* device) override {
    *device = current_device;
    return nullptr;
  }
  Failure set_device(int device) override {
    current_device = device;
    return nullptr;
  }
  void attach_thread(int device) override { current_device = device; }

  Failure create_stream(Stream* stream) override {
    static std::atomic<std::uint64_t> made{0};
    *stream = reinterpret_cast<Stream>(new SimStream(current_device, made++));
    return nullptr;
  }
  Failure synchronize(Stream stream) override {
    sim(stream)->synchronize();
    return device_error(sim(stream)->device());
  }

  Failure create_event(Event* event) override {
    auto made = std::make_shared<SimEvent>();
    made->device = current_device;
    *event = reinterpret_cast<Event>(new EventBox(std::move(made)));
    return nullptr;
  }
  void destroy_event(Event event) override { delete reinterpret_cast<EventBox*>(event); }

  Failure record(Event event, Stream stream) override {
    EventBox state = sim(event);
    std::uint64_t ticket = 0;
    {
      const std::lock_guard<std::mutex> lock(state->mutex);
      ticket = ++state->recorded;
      state->pending.insert(ticket);
    }
    sim(stream)->push([state, ticket](std::uint64_t) {
      {
        const std::lock_guard<std::mutex> lock(state->mutex);
        state->pending.erase(ticket);
      }
      state->changed.notify_all();
    });
    return nullptr;
  }

  Failure wait(Stream stream, Event event) override {
    EventBox state = sim(event);
    std::uint64_t ticket = 0;
    {
      const std::lock_guard<std::mutex> lock(state->mutex);
      ticket = state->recorded;
    }
    if (ticket == 0) return nullptr;  // never recorded: nothing to wait for
    sim(stream)->push([state, ticket](std::uint64_t) {
      std::unique_lock<std::mutex> lock(state->mutex);
      state->changed.wait(lock, [&] { return state->pending.count(ticket) == 0; });
    });
    return nullptr;
  }

  EventState query(Event event, Failure* why) override {
    const EventBox& state = sim(event);
    if (const char* error = device_error(state->device)) {
      *why = error;
      return EventState::Failed;
    }
    const std::lock_guard<std::mutex> lock(state->mutex);
    return state->pending.count(state->recorded) == 0 ? EventState::Done : EventState::Pending;
  }

  bool drained_after_failure(Event event) override {
    Settings& all = settings();
    const std::lock_guard<std::mutex> lock(all.mutex);
    return all.busy_on[sim(event)->device] == 0;
  }

  Failure copy(void* dst, const void* src, std::size_t bytes, Stream stream) override {
    sim(stream)->push([dst, src, bytes](std::uint64_t) { std::memcpy(dst, src, bytes); });
    return nullptr;
  }

  Failure allocate_mapped(std::size_t bytes, void** host, void** device) override {
    *host = std::calloc(1, bytes);
    if (*host == nullptr) return "out of memory";
    *device = *host;
    return nullptr;
  }
  // As cudaFreeHost, which waits for the device first: a kernel may still write the memory.
  void free_mapped(void* host) override {
    std::vector<SimStream*> streams;
    {
      const std::lock_guard<std::mutex> lock(settings().mutex);
      streams = settings().every_stream;
    }
    for (SimStream* stream : streams) stream->synchronize();
    std::free(host);
  }

  Failure reduce(DType dtype, ReduceOp op, void* dst, const void* src, void* copy, std::size_t count, int world,
                 bool last, Stream stream) override {
    if (count == 0) return nullptr;
    sim(stream)->push(
        [=](std::uint64_t) { host_reduce(dtype, op, dst, src, copy, count, world, last, kSimBlocks, kSimThreadsPerBlock); },
        true);
    return nullptr;
  }
  Failure scale(DType dtype, void* data, std::size_t count, float factor, Stream stream) override {
    if (count == 0) return nullptr;
    sim(stream)->push([=](std::uint64_t) { host_scale(dtype, data, count, factor, kSimBlocks, kSimThreadsPerBlock); }, true);
    return nullptr;
  }
  Failure write_header(HeaderSlots* slots, const CollectiveHeader& header, Stream stream) override {
    sim(stream)->push([slots, header](std::uint64_t) { slots->mine = header; }, true);
    return nullptr;
  }
  Failure compare_headers(const HeaderSlots* slots, MismatchReport* report, Stream stream) override {
    sim(stream)->push([slots, report](std::uint64_t) {
      if (!fill_mismatch_report(slots, report)) return;
      std::atomic_thread_fence(std::memory_order_release);  // the pair is visible to the host before the flag
      report->flag = 1;
    }, true);
    return nullptr;
  }
  Failure wait_for_flag(const volatile int* flag, Stream stream) override {
    sim(stream)->push([flag](std::uint64_t) {
      while (*flag == 0) std::this_thread::sleep_for(kFlagPoll);
    }, true);
    return nullptr;
  }
};

// A simulated NCCL communicator. Its groups run one at a time, in the order they were issued
// (NCCL runs one communicator's kernels in turn), each on its own stream's thread.
struct SimComm {
  std::unique_ptr<ShmTransport> wire;
  int device = 0;
  std::mutex mutex;
  std::condition_variable turn;
  std::uint64_t issued = 0;  // groups handed over by the host
  std::uint64_t next = 0;    // the group whose turn it is
  bool aborted = false;
  const char* error = nullptr;  // the asynchronous error, set once
  bool mute = false;            // SimFault::SilentSend struck: no send is posted any more
};
using CommBox = std::shared_ptr<SimComm>;
const CommBox& sim(Comm comm) { return *reinterpret_cast<CommBox*>(comm); }

struct Transfer {
  bool is_send;
  int peer;
  void* data;
  std::size_t bytes;
};

// A group's transfers on the wire, all posted before any is waited for; null, or why it failed.
Failure exchange(SimComm& comm, const std::vector<Transfer>& transfers, std::uint64_t stamp) {
  const std::optional<Armed> fault = strike(comm.device, true, stamp);
  if (fault && fault->fault == SimFault::AsyncError) return "unhandled system error (a fault the simulation injected)";
  if (fault && fault->fault == SimFault::SilentSend) comm.mute = true;
  try {
    std::vector<Request> requests;
    for (const Transfer& t : transfers) {
      if (!t.is_send) {
        requests.push_back(comm.wire->irecv(t.peer, t.data, t.bytes));
      } else if (!comm.mute) {
        requests.push_back(comm.wire->isend(t.peer, t.data, t.bytes));
      }
    }
    if (fault && fault->fault == SimFault::Exit) ::_exit(kExitStatus);
    for (const Request& request : requests) comm.wire->wait(request);
  } catch (const std::exception& error) {
    return lasting(detail::concat("remote process exited or network error: ", error.what()));
  }
  return nullptr;
}

class SimNccl final : public NcclApi {
 public:
  std::string version() override { return "simulated"; }

  Failure unique_id(std::string* id) override {
    static std::atomic<std::uint64_t> made{0};
    *id = detail::concat(::getpid(), "-", std::random_device{}(), "-", made++);
    return nullptr;
  }

  Failure init_rank(Comm* comm, Rendezvous& rendezvous, int world, const std::string& id, int rank) override {
    try {
      auto made = std::make_shared<SimComm>();
      made->device = current_device;
      PrefixRendezvous keys(rendezvous, "sim-nccl/" + id + "/");
      made->wire = std::make_unique<ShmTransport>(keys, rank, world, kWireTimeout);
      made->wire->begin_collective(CollectiveHeader{}, false);  // NCCL compares nothing
      *comm = reinterpret_cast<Comm>(new CommBox(std::move(made)));
      return nullptr;
    } catch (const std::exception& error) {
      return lasting(error.what());
    }
  }

  Failure group_start() override {
    ++grouping_.depth;
    return nullptr;
  }
  Failure group_end() override {
    if (grouping_.depth == 0) return "ncclGroupEnd without ncclGroupStart";
    if (--grouping_.depth == 0) hand_over();
    return nullptr;
  }
  Failure send(const void* data, std::size_t bytes, int peer, Comm comm, Stream stream) override {
    return hold(comm, stream, {true, peer, const_cast<void*>(data), bytes});
  }
  Failure recv(void* data, std::size_t bytes, int peer, Comm comm, Stream stream) override {
    return hold(comm, stream, {false, peer, data, bytes});
  }

  Failure async_error(Comm comm) override {
    const CommBox& state = sim(comm);
    const std::lock_guard<std::mutex> lock(state->mutex);
    return state->error;
  }

  void abort(Comm comm) override {
    const CommBox state = sim(comm);
    delete reinterpret_cast<CommBox*>(comm);
    {
      const std::lock_guard<std::mutex> lock(state->mutex);
      state->aborted = true;
    }
    state->turn.notify_all();
    state->wire->cancel();  // the group in flight stops waiting
  }

  // Collective among the communicator's ranks, as ncclCommDestroy is among a node's: it returns
  // once the groups handed over have run and every rank has called it.
  void destroy(Comm comm) override {
    const CommBox state = sim(comm);
    delete reinterpret_cast<CommBox*>(comm);
    {
      std::unique_lock<std::mutex> lock(state->mutex);
      state->turn.wait(lock, [&] { return state->next == state->issued || state->aborted; });
      if (state->aborted) return;  // its wire is cancelled
    }
    try {
      const int rank = state->wire->rank();
      char sent = 1;
      std::vector<char> heard(state->wire->size());
      std::vector<Request> requests;
      for (int peer = 0; peer < state->wire->size(); ++peer) {
        if (peer == rank) continue;
        requests.push_back(state->wire->isend(peer, &sent, 1));
        requests.push_back(state->wire->irecv(peer, &heard[peer], 1));
      }
      for (const Request& request : requests) state->wire->wait(request);
    } catch (const std::exception&) {
      // A peer that exited never destroys: NCCL's destroy would not return; ours gives up with the wire.
    }
  }

 private:
  struct Held {
    CommBox comm;
    Stream stream;
    std::vector<Transfer> transfers;
  };
  // The calls between ncclGroupStart and ncclGroupEnd on this thread.
  struct Grouping {
    int depth = 0;
    std::vector<Held> held;
  };

  Failure hold(Comm comm, Stream stream, const Transfer& transfer) {
    const CommBox& state = sim(comm);
    if (grouping_.held.empty() || grouping_.held.back().comm != state || grouping_.held.back().stream != stream) {
      grouping_.held.push_back({state, stream, {}});
    }
    grouping_.held.back().transfers.push_back(transfer);
    if (grouping_.depth == 0) hand_over();
    return nullptr;
  }

  // Queues each held group on its stream, behind the work queued there before it.
  void hand_over() {
    for (Held& group : grouping_.held) {
      std::uint64_t ticket = 0;
      {
        const std::lock_guard<std::mutex> lock(group.comm->mutex);
        ticket = group.comm->issued++;
      }
      sim(group.stream)->push([comm = group.comm, ticket, transfers = std::move(group.transfers)](std::uint64_t stamp) {
        std::unique_lock<std::mutex> lock(comm->mutex);
        comm->turn.wait(lock, [&] { return comm->next == ticket || comm->aborted; });
        const bool run = !comm->aborted && comm->error == nullptr;
        lock.unlock();
        const Failure failed = run ? exchange(*comm, transfers, stamp) : nullptr;
        lock.lock();
        if (failed != nullptr && comm->error == nullptr && !comm->aborted) comm->error = failed;
        comm->next = std::max(comm->next, ticket + 1);
        lock.unlock();
        comm->turn.notify_all();
      });
    }
    grouping_.held.clear();
  }

  static thread_local Grouping grouping_;
};

thread_local SimNccl::Grouping SimNccl::grouping_;

}  // namespace

DeviceApi& sim_device() {
  static SimDevice* device = new SimDevice;
  return *device;
}

NcclApi& sim_nccl() {
  static SimNccl* api = new SimNccl;
  return *api;
}

DeviceAllocator sim_allocator() {
  return [](std::size_t bytes, Stream stream) {
    const std::size_t size = std::max<std::size_t>(bytes, 1);
    void* memory = std::malloc(size);
    RR_CHECK(memory != nullptr, "the simulated device could not allocate ", size, " bytes");
    std::memset(memory, kSimPoison, size);
    SimStream* on = sim(stream);
    return std::shared_ptr<void>(memory, [on, size](void* given_back) {
      on->push([given_back, size](std::uint64_t) {
        std::memset(given_back, kSimPoison, size);
        std::free(given_back);
      });
    });
  };
}

void configure_sim(std::uint64_t seed, std::chrono::microseconds max_delay) {
  Settings& all = settings();
  const std::lock_guard<std::mutex> lock(all.mutex);
  all.seed = seed;
  all.max_delay = max_delay;
  ++all.epoch;
}

void inject_sim_fault(int device, SimFault fault, std::size_t after, std::chrono::milliseconds duration) {
  Settings& all = settings();
  const std::lock_guard<std::mutex> lock(all.mutex);
  all.faults[device].push_back({fault, after, duration, queued_operations.load()});
}

void clear_sim_faults() {
  Settings& all = settings();
  const std::lock_guard<std::mutex> lock(all.mutex);
  all.faults.clear();
  all.errors.clear();
  all.most_queued = 0;
}

std::size_t sim_stream_threads() { return settings().streams.load(); }

std::size_t sim_busy_streams() { return settings().busy.load(); }

std::size_t sim_most_queued() { return settings().most_queued.load(); }

}  // namespace cuda
}  // namespace ringreduce
