#include "transports/shm.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <thread>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ringreduce {
namespace {

constexpr std::uint64_t kMagic = 0x72696e6772656431ULL;  // "ringred1"
constexpr std::size_t kPageBytes = 4096;
constexpr std::size_t kAbortReasonBytes = 1024;  // room for a mismatch message naming both calls
// Segment names start with this, then the creating pid and the identity of its pid namespace (the
// inode of /proc/self/ns/pid): leftovers of dead jobs are recognisable, and only by a process that
// can see their creator's pid (containers sharing /dev/shm may not share pids).
constexpr const char* kNamePrefix = "ringreduce-";
// RINGREDUCE_WAIT=spin: poll this long, then sleep. A peer on another core usually answers within
// a few microseconds, and a futex sleep and wake-up cost about 10 us here.
constexpr std::chrono::microseconds kSpinWhenCoresSuffice{50};
// The default, while ranks do not outnumber the cores: poll this long first, which catches a peer
// running on another core, ...
constexpr std::chrono::microseconds kSpinBeforeYield{5};
// ... then yield the core at most this long before sleeping: the peer waited for is often runnable
// on this very core (4 ranks on 2 cores; or 2 ranks that the scheduler put on one), and a yield
// hands it over without a futex wake-up. Measured in benchmarks/RESULTS.md ("Small messages and
// auto").
constexpr std::chrono::microseconds kYieldBeforeSleep{1000};
// ... but stop yielding once yields that handed the core to no one add up to this, as long as the
// "spin" plan polls: a rank waiting for another host (hierarchical, 8 emulated hosts x 2 ranks on
// 2 cores) otherwise polled through its 1 ms on a core where nothing else was queued, while work
// queued on the other one: at 16 MiB it ran at 0.64-0.70x gloo's speed, and at 1.02-1.03x with
// this limit (benchmarks/RESULTS.md, "waiting without polling"); 2 and 4 ranks of one host lost nothing.
constexpr std::chrono::microseconds kIdleYieldBeforeSleep = kSpinWhenCoresSuffice;
// A sleeping rank wakes at least this often to check that its peers are alive and not aborted.
constexpr std::chrono::milliseconds kLivenessPoll{100};

struct alignas(64) Header {
  std::uint64_t magic;
  std::uint32_t world;
  std::uint32_t rank;
  std::int64_t pid;
  std::uint64_t pid_namespace;  // pids are comparable only inside one pid namespace
  alignas(64) std::atomic<std::uint32_t> doorbell;  // bumped by a peer after it posts to or consumes from us
  alignas(64) std::atomic<std::uint32_t> sleeping;  // we are (about to be) in futex_wait on the doorbell
  alignas(64) std::atomic<std::uint32_t> aborted;  // set after abort_kind and abort_reason are written
  std::uint8_t abort_kind;
  char abort_reason[kAbortReasonBytes];
  // Only rank 0's is used: the first rank of the group to abort, whose notice every rank reports.
  alignas(64) std::atomic<std::int32_t> abort_owner;
};

// The sender's side of a channel, in the sender's segment.
// The counters of a channel, in the sender's segment; each on a cache line of its own, since the
// two sides write them.
struct alignas(64) Channel {
  alignas(64) std::atomic<std::uint64_t> posted;    // pieces written so far (by the sender)
  alignas(64) std::atomic<std::uint64_t> consumed;  // pieces read so far (by the receiver)
};



std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }
std::size_t channels_offset() { return round_up(sizeof(Header), kPageBytes); }
std::size_t slots_offset(int world) { return round_up(channels_offset() + world * sizeof(Channel), kPageBytes); }
std::size_t segment_size(int world) { return slots_offset(world) + world * kShmChannelBytes; }

// Test-only: set to 1, no group sweeps. The test suite sets it so that a segment its killed ranks
// leave behind stays for its leftover checks, instead of being swept by another test's group at a
// time that depends on the scheduling (docs/design.md).
constexpr const char* kKeepStaleEnv = "RINGREDUCE_TESTING_KEEP_STALE_SEGMENTS";

// Unlinks segments left in /dev/shm by ringreduce processes that died before they unlinked them. A
// segment whose creator lived in another pid namespace is never judged: its pid means nothing here,
// and the job it belongs to may be running in the container beside this one.
void remove_stale_segments() {
  const char* keep = std::getenv(kKeepStaleEnv);
  if (keep != nullptr && std::string(keep) == "1") return;
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string prefix = kNamePrefix;
  const std::uint64_t own_namespace = own_pid_namespace();
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    long long pid = 0;
    unsigned long long pid_namespace = 0;
    if (std::sscanf(name.c_str() + prefix.size(), "%lld-%llu-", &pid, &pid_namespace) != 2) continue;
    if (pid > 0 && pid_namespace == own_namespace && process_gone(pid)) ::shm_unlink(("/" + name).c_str());
  }
  ::closedir(dir);
}

// The names this process created in /dev/shm and has not removed yet. A group's build that waits
// for a peer which died keeps its name until it gives up; a shrink leaves such a build to end on a
// thread of its own, and the process may end first. The names left are removed at exit. Never
// destroyed, as such a thread may still remove its own while the process ends.
struct CreatedNames {
  std::mutex mutex;
  std::set<std::string> names;
};

CreatedNames& created_names() {
  static CreatedNames* const created = [] {
    auto* made = new CreatedNames;
    std::atexit([] {
      CreatedNames& left = created_names();
      const std::lock_guard<std::mutex> lock(left.mutex);
      for (const std::string& name : left.names) ::shm_unlink(name.c_str());
      left.names.clear();
    });
    return made;
  }();
  return *created;
}

void futex_wait(std::atomic<std::uint32_t>* word, std::uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

WaitPlan wait_plan(int world) {
  const char* text = std::getenv(kWaitEnv);
  const std::string name = text == nullptr ? "" : text;
  if (name.empty()) {
    return {world <= usable_cores() ? kSpinBeforeYield : std::chrono::microseconds(0), kYieldBeforeSleep,
            kIdleYieldBeforeSleep};
  }
  if (name == "spin") return {kSpinWhenCoresSuffice, {}, {}};
  if (name == "yield") return {{}, kYieldBeforeSleep, kYieldBeforeSleep};
  if (name == "sleep") return {};
  throw std::invalid_argument(detail::concat("ringreduce: ", kWaitEnv, "='", name,
                                             "' is not a wait strategy; unset it or set spin, yield or sleep"));
}

}  // namespace

bool YieldPhase::again(std::chrono::nanoseconds took, std::chrono::nanoseconds elapsed) {
  if (took < kHandoverTime) idle_ += took;
  return elapsed < plan_.yield && idle_ < plan_.idle_yield;
}

namespace {

std::string random_token() {
  std::random_device device;
  const std::uint64_t value = (static_cast<std::uint64_t>(device()) << 32) ^ device();
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

// Request ids carry the peer, the direction and a sequence number, so no lookup table is needed.
Request make_request(std::uint64_t sequence, int peer, bool is_send) {
  return Request{static_cast<std::int64_t>((sequence << 16) | (static_cast<std::uint64_t>(peer) << 1) | is_send)};
}
std::uint64_t request_sequence(Request r) { return static_cast<std::uint64_t>(r.id) >> 16; }
int request_peer(Request r) { return static_cast<int>((r.id >> 1) & 0x7fff); }
bool request_is_send(Request r) { return (r.id & 1) != 0; }

}  // namespace

// The line in front of each slot's data, written by the sender before it posts the piece.
struct alignas(64) ShmTransport::SlotHeader {
  std::uint64_t bytes;      // size of the piece
  CollectiveHeader header;  // the collective it belongs to, checked by the receiver first
};
static_assert(sizeof(ShmTransport::SlotHeader) == kShmSlotHeaderBytes, "slot data must stay 64-byte aligned");

// One mapped segment. Ours is created (and unlinked once every peer has it mapped); peers' are opened.
struct ShmTransport::Segment {
  std::string name;
  char* base = nullptr;
  std::size_t bytes = 0;
  bool linked = false;  // the name still exists in /dev/shm and is ours to remove

  Segment(const std::string& segment_name, int world, bool create) : name(segment_name), bytes(segment_size(world)) {
    const int fd = create ? ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600) : ::shm_open(name.c_str(), O_RDWR, 0);
    RR_CHECK(fd >= 0, "shm_open(", name, ") failed: ", std::strerror(errno));
    linked = create;
    if (create) {
      CreatedNames& created = created_names();
      const std::lock_guard<std::mutex> lock(created.mutex);
      created.names.insert(name);
    }
    if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int error = errno;
      ::close(fd);
      release();
      RR_CHECK(false, "cannot size shared memory ", name, " to ", bytes, " bytes: ", std::strerror(error),
               " (is /dev/shm large enough?)");
    }
    void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    const int error = errno;
    ::close(fd);
    if (mapped == MAP_FAILED) {
      release();
      RR_CHECK(false, "mmap of shared memory ", name, " failed: ", std::strerror(error));
    }
    base = static_cast<char*>(mapped);
  }
  ~Segment() { release(); }

  void release() {
    if (base != nullptr) ::munmap(base, bytes);
    base = nullptr;
    unlink();
  }
  void unlink() {
    if (!linked) return;
    CreatedNames& created = created_names();
    const std::lock_guard<std::mutex> lock(created.mutex);
    if (created.names.erase(name) > 0) ::shm_unlink(name.c_str());  // (gone already at exit)
    linked = false;
  }

  Header* header() const { return reinterpret_cast<Header*>(base); }
  Channel* channel(int dst) const { return reinterpret_cast<Channel*>(base + channels_offset()) + dst; }
  // The header of the slot that holds piece number `piece` of the channel to `dst`; data follows it.
  SlotHeader* slot(int world, int dst, std::uint64_t piece) const {
    const std::size_t slot_stride = kShmSlotHeaderBytes + kShmSlotBytes;
    return reinterpret_cast<SlotHeader*>(base + slots_offset(world) + dst * kShmChannelBytes +
                                         (piece % kShmSlots) * slot_stride);
  }
};

ShmTransport::ShmTransport(Rendezvous& rendezvous, int rank, int world, std::chrono::milliseconds timeout)
    : rank_(rank), world_(world), timeout_(timeout), segments_(world), sends_(world), recvs_(world) {
  RR_CHECK(world >= 1 && world < (1 << 15) && rank >= 0 && rank < world, "bad shm rank ", rank, " of ", world);
  wait_ = wait_plan(world);
  remove_stale_segments();

  const std::string own_name =
      detail::concat("/", kNamePrefix, ::getpid(), "-", own_pid_namespace(), "-", random_token());
  segments_[rank] = std::make_unique<Segment>(own_name, world, true);
  Header* header = new (segments_[rank]->base) Header{};
  header->magic = kMagic;
  header->world = static_cast<std::uint32_t>(world);
  header->rank = static_cast<std::uint32_t>(rank);
  header->pid = ::getpid();
  header->pid_namespace = own_pid_namespace();
  header->abort_owner.store(-1);
  for (int dst = 0; dst < world; ++dst) new (segments_[rank]->channel(dst)) Channel{};

  // Publish our segment, map every peer's, and remove the names once all are mapped: from then on
  // nothing is left in /dev/shm, however the job ends.
  const std::vector<std::string> names = all_gather_values(rendezvous, "shm", rank, world, own_name);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    segments_[peer] = std::make_unique<Segment>(names[peer], world, false);
    const Header* theirs = segments_[peer]->header();
    RR_CHECK(theirs->magic == kMagic && theirs->world == static_cast<std::uint32_t>(world) &&
                 theirs->rank == static_cast<std::uint32_t>(peer),
             "shared memory of rank ", peer, " does not belong to this group (world ", world, ")");
  }
  all_gather_values(rendezvous, "shm-mapped", rank, world, "");
  segments_[rank]->unlink();
}

ShmTransport::~ShmTransport() = default;

Request ShmTransport::isend(int peer, const void* data, std::size_t bytes) {
  const std::uint64_t sequence = next_sequence_++;
  sends_[peer].push_back(SendOp{sequence, static_cast<const char*>(data), bytes});
  push_sends(peer);  // eager: small messages leave before the caller waits for anything
  return make_request(sequence, peer, true);
}

Request ShmTransport::post_recv(int peer, void* data, std::size_t bytes, const Reducer* reducer, bool last,
                                int forward_to) {
  const std::uint64_t sequence = next_sequence_++;
  recvs_[peer].push_back(RecvOp{sequence, static_cast<char*>(data), bytes, reducer, last, forward_to});
  return make_request(sequence, peer, false);
}

Request ShmTransport::irecv(int peer, void* data, std::size_t bytes) {
  return post_recv(peer, data, bytes, nullptr, false, -1);
}

Request ShmTransport::irecv_reduce(int peer, void* data, std::size_t bytes, const Reducer& reducer, bool last) {
  return post_recv(peer, data, bytes, &reducer, last, -1);
}

Request ShmTransport::irecv_forward(int prev, int next, void* data, std::size_t bytes, const Reducer* reducer,
                                    bool last) {
  return post_recv(prev, data, bytes, reducer, last, next);
}

void ShmTransport::ring(int peer) {
  Header* theirs = segments_[peer]->header();
  theirs->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (theirs->sleeping.load(std::memory_order_seq_cst) != 0) futex_wake(&theirs->doorbell);
}

ShmTransport::SlotHeader* ShmTransport::free_slot(int peer) {
  const Channel* channel = segments_[rank_]->channel(peer);
  const std::uint64_t posted = channel->posted.load(std::memory_order_relaxed);
  if (posted - channel->consumed.load(std::memory_order_acquire) >= kShmSlots) return nullptr;
  return segments_[rank_]->slot(world_, peer, posted);
}

void ShmTransport::post_piece(int peer, SlotHeader* slot, std::size_t bytes) {
  Channel* channel = segments_[rank_]->channel(peer);
  slot->bytes = bytes;
  slot->header = header_;
  channel->posted.store(channel->posted.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  ring(peer);
}

bool ShmTransport::push_sends(int peer) {
  std::deque<SendOp>& queue = sends_[peer];
  bool progressed = false;
  while (!queue.empty()) {
    SendOp& op = queue.front();
    do {
      SlotHeader* slot = free_slot(peer);
      if (slot == nullptr) return progressed;
      const std::size_t piece = std::min(kShmSlotBytes, op.bytes - op.done);
      std::memcpy(slot + 1, op.data + op.done, piece);
      post_piece(peer, slot, piece);
      op.done += piece;
      progressed = true;
    } while (op.done < op.bytes);
    queue.pop_front();
  }
  return progressed;
}

bool ShmTransport::pull_recvs(int peer, std::uint64_t through_sequence) {
  const Segment& theirs = *segments_[peer];
  Channel* channel = theirs.channel(rank_);
  std::deque<RecvOp>& queue = recvs_[peer];
  bool progressed = false;
  while (!queue.empty() && queue.front().sequence <= through_sequence) {
    RecvOp& op = queue.front();
    do {
      const std::uint64_t consumed = channel->consumed.load(std::memory_order_relaxed);
      if (channel->posted.load(std::memory_order_acquire) == consumed) return progressed;
      const SlotHeader* slot = theirs.slot(world_, rank_, consumed);
      check_header(peer, slot->header);
      const std::size_t piece = slot->bytes;
      const std::size_t expected = std::min(kShmSlotBytes, op.bytes - op.done);
      if (piece != expected) {
        fail(detail::concat("rank ", rank_name(rank_), " expected a piece of ", expected, " bytes from rank ", rank_name(peer), " but got ",
                            piece, ": the ranks are not running the same collective"));
      }
      take_piece(op, reinterpret_cast<const char*>(slot + 1), piece);
      channel->consumed.store(consumed + 1, std::memory_order_release);
      ring(peer);
      op.done += piece;
      progressed = true;
    } while (op.done < op.bytes);
    queue.pop_front();
  }
  return progressed;
}

void ShmTransport::take_piece(RecvOp& op, const char* source, std::size_t piece) {
  char* dst = op.data + op.done;
  const std::size_t count = op.reducer != nullptr ? piece / op.reducer->element_size() : 0;
  SlotHeader* slot = op.forward_to >= 0 && sends_[op.forward_to].empty() ? free_slot(op.forward_to) : nullptr;
  if (slot != nullptr) {
    // Fusion: the result goes to our buffer and to the next rank's slot in the same pass.
    char* slot_data = reinterpret_cast<char*>(slot + 1);
    if (op.reducer != nullptr) {
      op.reducer->reduce_copy(dst, source, slot_data, count, op.last);
    } else {
      std::memcpy(slot_data, source, piece);
      std::memcpy(dst, slot_data, piece);
    }
    post_piece(op.forward_to, slot, piece);
    return;
  }
  // Fusion: reduce straight out of the sender's slot, no copy into our memory first.
  if (op.reducer != nullptr) {
    op.reducer->reduce(dst, source, count, op.last);
  } else {
    std::memcpy(dst, source, piece);
  }
  // The outgoing slots are full: pass the result on as an ordinary send, which never blocks here.
  if (op.forward_to >= 0) sends_[op.forward_to].push_back(SendOp{next_sequence_++, dst, piece});
}

bool ShmTransport::is_done(Request request) const {
  const auto& matches = [&](const auto& queue) {
    return queue.empty() || queue.front().sequence > request_sequence(request);
  };
  const int peer = request_peer(request);
  return request_is_send(request) ? matches(sends_[peer]) : matches(recvs_[peer]);
}

bool ShmTransport::push_all_sends() {
  bool progressed = false;
  for (int peer = 0; peer < world_; ++peer) {
    if (!sends_[peer].empty()) progressed |= push_sends(peer);
  }
  return progressed;
}

void ShmTransport::complete(Request request) {
  const int peer = request_peer(request);
  if (request_is_send(request)) {
    drive([] { return false; }, [&] { return is_done(request); }, peer, true);
  } else {
    drive([&] { return pull_recvs(peer, request_sequence(request)); }, [&] { return is_done(request); }, peer, false);
  }
}

void ShmTransport::flush() {
  for (int peer = 0; peer < world_; ++peer) {
    drive([] { return false; }, [&] { return sends_[peer].empty(); }, peer, true);
  }
}

template <typename Pull, typename Done>
void ShmTransport::drive(Pull pull, Done done, int peer, bool sending) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  Header* own = segments_[rank_]->header();
  // While spinning, watch the counter that will change first: the peer's posted count for a
  // receive (one cache-line transfer sooner than the doorbell), our consumed count for a send.
  const std::atomic<std::uint64_t>* watch =
      sending ? &segments_[rank_]->channel(peer)->consumed : &segments_[peer]->channel(rank_)->posted;
  for (;;) {
    const std::uint32_t doorbell = own->doorbell.load(std::memory_order_acquire);
    const std::uint64_t watched = watch->load(std::memory_order_relaxed);
    // Keep every peer fed while we wait, so nobody waits on us.
    bool progressed = push_all_sends();
    progressed |= pull();
    if (done()) return;
    if (!progressed) idle(doorbell, watch, watched, deadline, sending ? "send to" : "receive from", peer);
  }
}

template <typename Moved>
bool ShmTransport::pass_time(Moved moved, std::chrono::steady_clock::time_point start) {
  using Clock = std::chrono::steady_clock;
  while (Clock::now() - start < wait_.spin) {
    if (moved()) return true;
    cpu_relax();
  }
  YieldPhase phase(wait_);
  const auto yield_start = Clock::now();
  bool again = wait_.yield.count() > 0;
  while (again) {
    if (moved()) break;
    const auto before = Clock::now();
    ::sched_yield();
    const auto after = Clock::now();
    again = phase.again(after - before, after - yield_start);
  }
  idle_yielded_ += phase.idle();
  return moved();
}

void ShmTransport::idle(std::uint32_t doorbell_seen, const std::atomic<std::uint64_t>* watch, std::uint64_t watch_seen,
                        std::chrono::steady_clock::time_point deadline, const char* doing, int peer) {
  // An aborting peer rings our doorbell, which ends the wait below: look before waiting again, so
  // its notice arrives within microseconds instead of after a liveness poll.
  raise_if_a_peer_aborted();
  Header* own = segments_[rank_]->header();
  const auto moved = [&] {
    return watch->load(std::memory_order_acquire) != watch_seen ||
           own->doorbell.load(std::memory_order_acquire) != doorbell_seen;
  };
  if (pass_time(moved, std::chrono::steady_clock::now())) return;
  // Nothing came while spinning: sleep until a peer rings, checking on the peers now and then.
  own->sleeping.store(1, std::memory_order_seq_cst);
  if (own->doorbell.load(std::memory_order_seq_cst) == doorbell_seen) {
    const auto now = std::chrono::steady_clock::now();
    futex_wait(&own->doorbell, doorbell_seen, std::min<std::chrono::nanoseconds>(kLivenessPoll, deadline - now));
  }
  own->sleeping.store(0, std::memory_order_relaxed);
  if (own->doorbell.load(std::memory_order_acquire) != doorbell_seen) return;

  raise_if_a_peer_aborted();
  for (int other = 0; other < world_; ++other) {
    if (other == rank_) continue;
    const Header* theirs = segments_[other]->header();
    check_waiting_header(other);
    if (theirs->pid_namespace == own->pid_namespace && process_gone(theirs->pid)) {
      fail(detail::concat("rank ", rank_name(other), " (pid ", theirs->pid, ") exited while rank ", rank_name(rank_),
                          " was waiting to ", doing, " rank ", rank_name(peer)));
    }
  }
  if (std::chrono::steady_clock::now() >= deadline) {
    throw TimeoutError(detail::concat(timed_out_after(timeout_), "shm rank ", rank_name(rank_), " waiting to ", doing, " rank ", rank_name(peer),
                                      "; is every rank running the same collectives? (RINGREDUCE_TIMEOUT sets the limit)"));
  }
}

void ShmTransport::cancel() {
  cancelled_.store(true);
  ring(rank_);
}

void ShmTransport::raise_if_a_peer_aborted() const {
  if (cancelled_.load()) throw std::runtime_error(detail::concat("ringreduce: shm rank ", rank_name(rank_), ": cancelled"));
  for (int other = 0; other < world_; ++other) {
    if (other != rank_ && segments_[other]->header()->aborted.load(std::memory_order_acquire) != 0) {
      group_notice().raise();
    }
  }
}

void ShmTransport::check_waiting_header(int peer) const {
  // A piece that arrived from a peer we are not waiting for yet: if it belongs to this collective
  // (or an earlier one, which we have finished), its header must match ours. Pieces of later
  // collectives are a peer running ahead, which is fine.
  const Segment& theirs = *segments_[peer];
  const Channel* channel = theirs.channel(rank_);
  const std::uint64_t consumed = channel->consumed.load(std::memory_order_relaxed);
  if (channel->posted.load(std::memory_order_acquire) == consumed) return;
  const CollectiveHeader& header = theirs.slot(world_, rank_, consumed)->header;
  if (header.sequence <= header_.sequence) check_header(peer, header);
}

void ShmTransport::fail(const std::string& what) { throw std::runtime_error("ringreduce: shm: " + what); }

AbortNotice ShmTransport::abort_transfers(const AbortNotice& notice) {
  Header* own = segments_[rank_]->header();
  std::int32_t nobody = -1;
  segments_[0]->header()->abort_owner.compare_exchange_strong(nobody, rank_);
  if (own->aborted.load(std::memory_order_relaxed) == 0) {
    own->abort_kind = static_cast<std::uint8_t>(notice.kind);
    std::strncpy(own->abort_reason, notice.message.c_str(), kAbortReasonBytes - 1);
    own->aborted.store(1, std::memory_order_release);  // after the notice, which peers then read
  }
  for (int peer = 0; peer < world_; ++peer) {
    if (peer != rank_) ring(peer);
  }
  for (auto& queue : sends_) queue.clear();
  for (auto& queue : recvs_) queue.clear();
  return group_notice();
}

AbortNotice ShmTransport::group_notice() const {
  // The first rank to abort took ownership before writing its notice: wait (briefly) until it is there.
  const std::int32_t owner = segments_[0]->header()->abort_owner.load(std::memory_order_acquire);
  const Header* first = segments_[owner < 0 ? rank_ : owner]->header();
  const auto give_up = std::chrono::steady_clock::now() + kLivenessPoll;
  while (first->aborted.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < give_up) cpu_relax();
  if (first->aborted.load(std::memory_order_acquire) == 0) {
    return {AbortNotice::Kind::Failure, detail::concat("ringreduce: shm: rank ", owner, " aborted without a reason")};
  }
  return {static_cast<AbortNotice::Kind>(first->abort_kind),
          std::string(first->abort_reason, strnlen(first->abort_reason, kAbortReasonBytes))};
}

}  // namespace ringreduce
