#include "engine/membership.h"

#include "engine/liveness.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <future>
#include <sstream>

namespace ringreduce {
namespace {

using Clock = std::chrono::steady_clock;

// A reading that starts this much later than it was due (a period after the last one ended) is a
// gap (see Pulse::run): the pulse thread was not running (a process stopped, a machine paused).
// Two periods: a thread on a loaded machine is scheduled far sooner. A slow store is no gap: the
// time a reading spends waiting for its answers is not counted against anyone.
constexpr std::chrono::milliseconds kLateReading = 2 * kPulsePeriod;
// How often a caller waiting on the agreement or the roll call looks again: a few store reads, so
// a survivor joins the others within a fraction of a pulse.
constexpr std::chrono::milliseconds kAgreementPoll{20};

// A shrink's outcome, as fixed by its first survivor to decide.
constexpr const char* kCommit = "commit";
constexpr const char* kAbort = "abort";

std::string pulse_key(int rank) { return detail::concat("pulse/", rank); }
std::string round_key(int round) { return detail::concat("lost/", round); }
std::string here_key(int round, int attempt, int rank) {
  return detail::concat("shrink/", round, ".", attempt, "/here/", rank);
}

std::string encode(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) text += detail::concat(text.empty() ? "" : ",", rank);
  return text;
}

std::vector<int> decode(const std::string& text) {
  std::vector<int> ranks;
  std::istringstream in(text);
  for (std::string part; std::getline(in, part, ',');) ranks.push_back(std::stoi(part));
  return ranks;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (!text.empty() && text.back() == '\n') lines.emplace_back();  // getline drops a last empty line
  return lines;
}

bool contains(const std::vector<int>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

std::vector<int> merged(std::vector<int> a, const std::vector<int>& b) {
  for (int rank : b) {
    if (!contains(a, rank)) a.push_back(rank);
  }
  std::sort(a.begin(), a.end());
  return a;
}

}  // namespace

std::chrono::milliseconds lost_after_from_env() {
  const char* text = std::getenv(kLostAfterEnv);
  if (text == nullptr || *text == '\0') return kDefaultLostAfter;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0)) {
    throw std::invalid_argument(detail::concat("ringreduce: ", kLostAfterEnv, "=", text,
                                               " is not a positive number of seconds (the silence after which a "
                                               "rank counts as lost; default ", kDefaultLostAfter.count() / 1000.0, ")"));
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
}

// Every membership's pulse, for stop_every_pulse() at exit. Never destroyed: threads may outlive
// static destruction.
struct LivePulses {
  std::mutex mutex;
  std::vector<std::weak_ptr<Membership::Pulse>> pulses;
};
LivePulses& live_pulses() {
  static auto* live = new LivePulses;
  return *live;
}

// The pulse thread's state. The thread holds it too, so a thread left to finish a slow store call
// at teardown touches nothing freed.
struct Membership::Pulse {
  std::unique_ptr<Rendezvous> keys;
  std::unique_ptr<LivenessPort> port;  // what peers on other hosts probe
  int rank = 0;
  std::chrono::milliseconds lost_after{};
  std::vector<std::int64_t> pids;      // a peer's pid where this process can see it, else -1
  std::vector<std::string> endpoints;  // else its liveness port, where it has one

  std::mutex mutex;
  std::condition_variable changed;
  bool stopping = false;
  std::promise<void> stopped;
  std::shared_future<void> ended = stopped.get_future().share();
  std::vector<bool> watching;            // whether its pulse is read (see watched_now)
  std::vector<std::string> seen;         // each watched rank's pulse as last read
  std::vector<Clock::time_point> moved;  // when it was last seen to change (or first watched)
  std::vector<std::uint64_t> changes;    // how often it was seen to change
  std::vector<bool> gone;                // its process is known to be gone (a process never comes back)
  std::vector<Clock::time_point> probed; // when its liveness port was last probed
  std::vector<bool> unproven;            // watched in place of a rank found lost, not yet probed
  Clock::time_point last_read;           // when the last reading that got its answers began
  std::string store_error;               // the last store call's failure, while it fails
  int rounds = 0;                        // agreement rounds some survivor has fixed, as last read
  std::vector<int> agreed;               // the newest round's set
  int everyone_wanted = 0;               // callers that need every pulse read (EveryPulseRead)
  std::function<void()> wake;
  bool woke = false;

  int size() const { return static_cast<int>(moved.size()); }
  // The peers whose pulses this rank reads (under `mutex`): its next kWatchers successors in rank
  // order that are not known lost, so each rank is watched by kWatchers others and a rank's death
  // is found though a watcher dies with it; every peer while a caller needs to hear from everyone.
  std::vector<int> watched_now() const {
    std::vector<int> peers;
    for (int step = 1; step < size(); ++step) {
      const int peer = (rank + step) % size();
      if (everyone_wanted > 0) {
        peers.push_back(peer);
      } else if (!gone[peer] && !contains(agreed, peer) && static_cast<int>(peers.size()) < kWatchers) {
        peers.push_back(peer);
      }
    }
    return peers;
  }
  // Peers lost as of the last reading (under `mutex`): gone, or watched and silent. Silence counts
  // only while the readings go on: a store that stops answering makes nobody lost (see store_gone).
  std::vector<int> lost() const {
    std::vector<int> ranks;
    for (int peer = 0; peer < size(); ++peer) {
      if (peer != rank && (gone[peer] || (watching[peer] && last_read - moved[peer] > lost_after))) {
        ranks.push_back(peer);
      }
    }
    return ranks;
  }
  // Watched peers on other hosts silent long enough to ask their kernel whether they still exist,
  // or watched in place of a rank found lost (under `mutex`).
  std::vector<int> due_for_probe(Clock::time_point now) const {
    std::vector<int> ranks;
    for (int peer = 0; peer < size(); ++peer) {
      if (watching[peer] && !endpoints[peer].empty() && !gone[peer] &&
          (unproven[peer] || (last_read - moved[peer] >= kSuspectAfter && now - probed[peer] >= kProbeEvery))) {
        ranks.push_back(peer);
      }
    }
    return ranks;
  }
  // Stops the thread and drops the owner's callback; waits for the thread up to kPulseStopWait (a
  // thread still inside a store call past that ends on its own, holding only this).
  void stop() {
    {
      const std::lock_guard<std::mutex> lock(mutex);
      if (stopping) return;
      stopping = true;
      wake = nullptr;
    }
    changed.notify_all();
    ended.wait_for(kPulseStopWait);
  }
  // Whether the pulses have gone unread for lost_after (under `mutex`).
  bool store_gone(Clock::time_point now) const { return now - last_read > lost_after; }

  // Adopts the rounds fixed after `fixed` (store calls; returns the newest and its set in `fixed` and `set`).
  void read_rounds(int& fixed, std::vector<int>& set) const {
    while (keys->has(round_key(fixed + 1))) {
      ++fixed;
      set = decode(keys->get(round_key(fixed)));
    }
  }
  // Records `suspects` in the round after `fixed`, unless another survivor fixed that round first;
  // then the next, until some round holds them all. A fenced rank records nothing.
  void record(const std::vector<int>& suspects, int& fixed, std::vector<int>& set) const {
    while (!contains(set, rank) && !std::includes(set.begin(), set.end(), suspects.begin(), suspects.end())) {
      set = decode(keys->set_once(round_key(fixed + 1), encode(merged(set, suspects))));
      ++fixed;
      read_rounds(fixed, set);
    }
  }

  // Each period: this rank's pulse, the watched peers' pulses (one request), and any new round:
  // three store requests whatever the group's size.
  void run() {
    std::uint64_t count = 1;  // the constructor published the first
    std::unique_lock<std::mutex> lock(mutex);
    Clock::time_point waited_from = Clock::now();
    bool first = true;  // the first reading: every watched peer is new
    while (!changed.wait_for(lock, kPulsePeriod, [&] { return stopping; })) {
      const Clock::time_point began = Clock::now();
      const std::vector<int> suspected = due_for_probe(began);
      const std::vector<int> watched = watched_now();
      const bool everyone = everyone_wanted > 0;
      std::vector<int> set = agreed;  // only this thread writes `agreed` and `rounds`
      int fixed = rounds;
      lock.unlock();
      if (port) port->drain();
      std::vector<std::string> pulse_keys;
      for (int peer : watched) pulse_keys.push_back(pulse_key(peer));
      std::vector<std::string> read;
      std::string error;
      try {
        keys->set(pulse_key(rank), std::to_string(++count));
        read = keys->get_all(pulse_keys);
        read_rounds(fixed, set);
      } catch (const std::exception& failure) {
        error = failure.what();
      }
      std::vector<bool> exited(pids.size(), false);  // watched host-mates whose pid is gone
      for (int peer : watched) exited[peer] = pids[peer] > 0 && process_gone(pids[peer]);
      std::vector<std::string> asked;
      for (int peer : suspected) asked.push_back(endpoints[peer]);
      const std::vector<Liveness> answers = probe(asked, kProbeWait);
      lock.lock();
      const Clock::time_point now = Clock::now();
      store_error = error;
      if (error.empty()) {
        // After a gap (this thread not running), every silence starts again: a peer is lost for
        // lost_after of readings that saw it still, not of gap. Silence is timed from when each
        // reading began, so a store slow to answer stretches nobody's.
        if (began - waited_from > kPulsePeriod + kLateReading) std::fill(moved.begin(), moved.end(), began);
        last_read = began;
        std::vector<bool> now_watching(watching.size(), false);
        for (std::size_t i = 0; i < watched.size(); ++i) {
          const int peer = watched[i];
          now_watching[peer] = true;
          if (!watching[peer]) {
            moved[peer] = began;  // newly watched: its silence starts now
            // In place of a rank found lost: its kernel is asked at once, as a host's ranks die
            // together and its next ranks would each wait out kSuspectAfter in turn.
            unproven[peer] = !first && !everyone;
          } else if (read[i] != seen[peer]) {
            moved[peer] = began;
            ++changes[peer];
          }
          seen[peer] = read[i];
        }
        watching = now_watching;
        first = false;
      }
      for (std::size_t peer = 0; peer < exited.size(); ++peer) gone[peer] = gone[peer] || exited[peer];
      for (std::size_t i = 0; i < suspected.size(); ++i) {
        probed[suspected[i]] = now;
        unproven[suspected[i]] = false;
        gone[suspected[i]] = gone[suspected[i]] || answers[i] == Liveness::Gone;
      }
      const std::vector<int> suspects = lost();
      lock.unlock();
      // A loss is recorded before anything is cancelled: whatever this rank's transfers then
      // raise, the agreement finds it (a peer that resumes later changes nothing).
      if (error.empty() && !suspects.empty()) {
        try {
          record(suspects, fixed, set);
        } catch (const std::exception&) {
          // The store failed meanwhile: nothing recorded, nothing cancelled; the next pulse tries again.
        }
      }
      lock.lock();
      rounds = fixed;
      agreed = set;
      changed.notify_all();
      // A loss recorded, here or by another survivor (a rank waiting on a live peer learns it here).
      if (!woke && rounds > 0 && wake) {
        woke = true;
        const std::function<void()> call = wake;
        lock.unlock();
        try {
          call();
        } catch (const std::exception&) {
          // The owner's transfers are already ending; the agreement reports the loss.
        }
        lock.lock();
      }
      waited_from = Clock::now();
    }
  }
};

namespace {

// While one lives, the pulse thread reads every peer's pulse, not only the watched ones': an
// agreement or a roll call must hear from every rank (a store request per period still, carrying
// every key).
class EveryPulseRead {
 public:
  explicit EveryPulseRead(Membership::Pulse& pulse) : pulse_(pulse) {
    const std::lock_guard<std::mutex> lock(pulse_.mutex);
    ++pulse_.everyone_wanted;
  }
  ~EveryPulseRead() {
    const std::lock_guard<std::mutex> lock(pulse_.mutex);
    --pulse_.everyone_wanted;
  }
  EveryPulseRead(const EveryPulseRead&) = delete;
  EveryPulseRead& operator=(const EveryPulseRead&) = delete;

 private:
  Membership::Pulse& pulse_;
};

}  // namespace

Membership::Membership(std::unique_ptr<Rendezvous> pulse_keys, std::unique_ptr<Rendezvous> keys, int rank, int size,
                       const std::string& host, const std::string& probe_address, std::chrono::milliseconds lost_after,
                       std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), lost_after_(lost_after), timeout_(timeout), keys_(std::move(keys)),
      pulse_(std::make_shared<Pulse>()) {
  Pulse& pulse = *pulse_;
  pulse.port = std::make_unique<LivenessPort>();
  // A member is "<host>\n<pid namespace>\n<pid>\n<network>\n<liveness port>\n<probe address>".
  const std::string process = detail::concat(host, "\n", own_pid_namespace(), "\n");
  const std::string network = own_network();
  // The setup waits for the others as long as the store lets it: on the pulse thread's handle, as
  // `keys` may bound every call (a failure path must not wait minutes for a store gone with a link).
  // The first pulse goes first: once the records are gathered, every rank's pulse is there to read.
  pulse_keys->set(pulse_key(rank), "1");
  const std::vector<std::string> members = all_gather_values(
      *pulse_keys, "member", rank, size,
      detail::concat(process, ::getpid(), "\n", network, "\n", pulse.port->port(), "\n", probe_address));
  pulse.keys = std::move(pulse_keys);
  pulse.rank = rank;
  pulse.lost_after = lost_after;
  pulse.pids.assign(size, -1);
  pulse.endpoints.assign(size, "");
  for (int peer = 0; peer < size; ++peer) {
    const std::vector<std::string> theirs = split_lines(members[peer]);
    RR_CHECK(theirs.size() == 6, "rank ", peer, "'s membership record is malformed (a different ringreduce version?)");
    if (peer == rank) continue;
    if (theirs[0] == host && theirs[1] == std::to_string(own_pid_namespace())) {
      pulse.pids[peer] = std::stoll(theirs[2]);  // its pid says whether it exists
    } else if (!network.empty() && theirs[3] == network) {
      pulse.endpoints[peer] = "127.0.0.1 " + theirs[4];  // one loopback
    } else if (!theirs[5].empty()) {
      pulse.endpoints[peer] = theirs[5] + " " + theirs[4];
    }  // else silence is all there is to go by
  }
  // A refusal is evidence only from a port seen to answer: where a firewall rejects the probes (or
  // they never arrive), those peers are found by silence instead, not wrongly found gone.
  const std::vector<Liveness> reachable = probe(pulse.endpoints, kProbeWait);
  for (int peer = 0; peer < size; ++peer) {
    if (reachable[peer] != Liveness::Exists) pulse.endpoints[peer].clear();
  }
  pulse.watching.assign(size, false);
  pulse.seen.assign(size, "");
  pulse.moved.assign(size, Clock::now());
  pulse.changes.assign(size, 0);
  pulse.gone.assign(size, false);
  pulse.probed.assign(size, Clock::now());
  pulse.unproven.assign(size, false);
  pulse.last_read = Clock::now();
  {
    LivePulses& live = live_pulses();
    const std::lock_guard<std::mutex> lock(live.mutex);
    live.pulses.erase(std::remove_if(live.pulses.begin(), live.pulses.end(),
                                     [](const std::weak_ptr<Pulse>& weak) { return weak.expired(); }),
                      live.pulses.end());
    live.pulses.push_back(pulse_);
  }
  std::thread([shared = pulse_] {
    shared->run();
    shared->stopped.set_value();
  }).detach();
}

Membership::~Membership() { pulse_->stop(); }

void Membership::on_loss(std::function<void()> wake) {
  const std::lock_guard<std::mutex> lock(pulse_->mutex);
  pulse_->wake = std::move(wake);
}

void Membership::adopt_rounds() {
  while (keys_->has(round_key(round_ + 1))) {
    ++round_;
    lost_ = decode(keys_->get(round_key(round_)));
  }
}

void Membership::catch_up() {
  adopt_rounds();
  if (contains(lost_, rank_)) {
    raise_lost(lost_, detail::concat("this rank (", rank_, ") was excluded: the other ranks found it lost, silent for more "
                                     "than ", lost_after_.count() / 1000.0, " s (", kLostAfterEnv, "; a process or "
                                     "host stopped, or cut off), and went on without it; it cannot rejoin"));
  }
}

void Membership::propose(const std::vector<int>& lost) {
  const std::string held = keys_->set_once(round_key(round_ + 1), encode(lost));
  ++round_;
  lost_ = decode(held);
  catch_up();
}

void Membership::raise_lost(const std::vector<int>& lost, const std::string& why) const {
  throw RanksLostError(detail::concat("ringreduce: rank ", rank_, " of ", size_, ": the group lost ranks ",
                                      rank_list(lost), " (", why, "); the survivors can go on without them: "
                                      "torch.distributed.shrink_group(", rank_list(lost), ") or ringreduce.shrink"),
                       lost);
}

std::vector<int> Membership::agree_on_loss(Clock::time_point failed_at) {
  try {
    return agree(failed_at);
  } catch (const RanksLostError&) {
    throw;
  } catch (const std::exception& store) {  // what else can fail here is a store call
    throw std::runtime_error(detail::concat(
        "ringreduce: rank ", rank_, " cannot tell which ranks are lost: the store the group agrees through is gone (",
        store.what(), "). The store is the one part a group cannot lose: host it where no rank can take it down "
        "(docs/elastic.md)"));
  }
}

std::vector<int> Membership::agree(Clock::time_point failed_at) {
  const std::lock_guard<std::mutex> agreement(mutex_);
  const EveryPulseRead everyone(*pulse_);
  // A dead peer's last pulse may be read after the failure; two changes read since mean a live one.
  std::vector<std::uint64_t> changes_then;
  {
    const std::lock_guard<std::mutex> lock(pulse_->mutex);
    changes_then = pulse_->changes;
  }
  // A dead peer's last pulse is read within a cycle, and it is lost lost_after of readings later. A
  // cycle is a period plus the store's round trips, which a loaded store stretches: twice the
  // loss bound leaves room for cycles of up to a second.
  const Clock::time_point deadline = failed_at + 2 * lost_after_ + 4 * kPulsePeriod;
  for (;;) {
    catch_up();
    std::vector<int> suspects;
    bool all_heard = true;
    {
      std::unique_lock<std::mutex> lock(pulse_->mutex);
      const Clock::time_point now = Clock::now();
      if (pulse_->store_gone(now)) {
        throw StoreUnreachable(detail::concat("no pulse read for ", lost_after_.count(), " ms",
                                              pulse_->store_error.empty() ? "" : ": ", pulse_->store_error));
      }
      suspects = merged(lost_, pulse_->lost());
      for (int peer = 0; peer < size_; ++peer) {
        if (peer != rank_ && !contains(suspects, peer) && pulse_->changes[peer] < changes_then[peer] + 2) {
          all_heard = false;
        }
      }
    }
    if (suspects.size() > lost_.size()) {
      propose(suspects);
      continue;  // a round fixed by another survivor may lack some of ours: the next one adds them
    }
    // Not before every peer is heard from or lost: a survivor that answered at its first loss could
    // name fewer ranks than one that saw a second death a moment later.
    if (all_heard || Clock::now() > deadline) return lost_;
    std::unique_lock<std::mutex> lock(pulse_->mutex);
    pulse_->changed.wait_for(lock, kAgreementPoll);
  }
}

std::vector<int> Membership::poll_loss() {
  const std::lock_guard<std::mutex> agreement(mutex_);
  catch_up();
  std::vector<int> suspects;
  {
    const std::lock_guard<std::mutex> lock(pulse_->mutex);
    suspects = merged(lost_, pulse_->lost());
  }
  if (suspects.size() > lost_.size()) propose(suspects);
  return lost_;
}

std::pair<int, int> Membership::roll_call(const std::vector<int>& excluded) {
  for (int rank : excluded) {
    if (rank < 0 || rank >= size_ || rank == rank_) {
      throw std::invalid_argument(detail::concat("ringreduce: shrink cannot leave out rank ", rank, " of a group of ",
                                                 size_, " seen from rank ", rank_));
    }
  }
  std::unique_lock<std::mutex> agreement(mutex_);
  const EveryPulseRead everyone(*pulse_);
  // The excluded ranks must be lost: wait until each is, or has pulsed twice since we began (alive;
  // one change may be a dead rank's last pulse, read late).
  std::vector<std::uint64_t> changes_then;
  {
    const std::lock_guard<std::mutex> lock(pulse_->mutex);
    changes_then = pulse_->changes;
  }
  const Clock::time_point began = Clock::now();
  for (;;) {
    catch_up();
    std::vector<int> suspects;
    std::vector<int> alive;
    {
      const std::lock_guard<std::mutex> lock(pulse_->mutex);
      if (pulse_->store_gone(Clock::now())) {
        throw StoreUnreachable(detail::concat("ringreduce: shrink: no pulse read for ", lost_after_.count(),
                                              " ms; the group's store is gone (", pulse_->store_error, ")"));
      }
      suspects = merged(lost_, pulse_->lost());
      for (int rank : excluded) {
        if (!contains(suspects, rank) && pulse_->changes[rank] >= changes_then[rank] + 2) alive.push_back(rank);
      }
    }
    if (suspects.size() > lost_.size()) {
      propose(suspects);
      continue;
    }
    if (!alive.empty()) {
      throw std::invalid_argument(detail::concat(
          "ringreduce: shrink leaves out rank(s) ", rank_list(alive), ", which are alive (their pulse moved twice while "
          "this rank looked). A shrink leaves out ranks that are lost; a rank to be removed must leave first (destroy "
          "its group or exit). Lost so far: ", rank_list(lost_)));
    }
    const std::vector<int> sorted = merged({}, excluded);
    if (std::includes(lost_.begin(), lost_.end(), sorted.begin(), sorted.end())) break;
    if (Clock::now() - began > timeout_) {
      throw TimeoutError(detail::concat(timed_out_after(timeout_), "shrink: ranks ", rank_list(excluded),
                                        " neither pulse nor count as lost"));
    }
    agreement.unlock();
    std::this_thread::sleep_for(kAgreementPoll);
    agreement.lock();
  }
  if (lost_ != merged({}, excluded)) {
    raise_lost(lost_, detail::concat("shrink was asked to leave out ", rank_list(excluded), " only; call it again with "
                                     "all of the lost ranks"));
  }
  // Every survivor of this round meets here before any builds the shrunk group; a shrink tried
  // again in the same round (a build that failed with nobody lost) meets under a new attempt.
  const int round = round_;
  const int attempt = ++attempts_[round];
  const std::vector<int> lost = lost_;
  // Each survivor counts itself in (one request, and one per look: a key per peer to look at would
  // make N² requests in all), and leaves its own key, which names the missing ones should the
  // meeting time out.
  keys_->set(here_key(round, attempt, rank_), "1");
  const std::string count_key = detail::concat("shrink/", round, ".", attempt, "/here");
  const std::int64_t survivors = size_ - static_cast<std::int64_t>(lost.size());
  const Clock::time_point deadline = Clock::now() + timeout_;
  for (std::int64_t here = keys_->add(count_key, 1); here < survivors; here = keys_->add(count_key, 0)) {
    catch_up();
    std::vector<int> suspects;
    {
      const std::lock_guard<std::mutex> lock(pulse_->mutex);
      suspects = merged(lost_, pulse_->lost());
    }
    if (suspects.size() > lost_.size()) propose(suspects);
    if (round_ != round) raise_lost(lost_, "another rank was lost while the survivors met to shrink");
    if (Clock::now() > deadline) {
      std::vector<int> missing;
      for (int peer = 0; peer < size_; ++peer) {
        if (!contains(lost, peer) && !keys_->has(here_key(round, attempt, peer))) missing.push_back(peer);
      }
      throw TimeoutError(detail::concat(timed_out_after(timeout_), "shrink: rank(s) ", rank_list(missing),
                                        " are alive but have not called shrink; every survivor must, with the same "
                                        "lost ranks ", rank_list(lost)));
    }
    agreement.unlock();  // lost_ranks() and a failure's agreement may look meanwhile
    std::this_thread::sleep_for(kAgreementPoll);
    agreement.lock();
  }
  return {round, attempt};
}

bool Membership::decide_shrink(int round, int attempt, const std::vector<int>& excluded, bool built) {
  const std::string attempt_keys = detail::concat("shrink/", round, ".", attempt, "/");
  const std::string decision_key = attempt_keys + "decision";
  const auto decide = [&](const char* outcome) { return keys_->set_once(decision_key, outcome) == kCommit; };
  if (!built) return decide(kAbort);
  const std::string built_key = attempt_keys + "built";  // a count, as the roll call's
  keys_->add(built_key, 1);
  const std::vector<int> expected = merged({}, excluded);
  const std::int64_t survivors = size_ - static_cast<std::int64_t>(expected.size());
  const Clock::time_point deadline = Clock::now() + timeout_;
  for (;;) {
    if (keys_->has(decision_key)) return keys_->get(decision_key) == kCommit;
    if (keys_->add(built_key, 0) >= survivors) return decide(kCommit);
    if (poll_loss() != expected || Clock::now() > deadline) return decide(kAbort);
    std::this_thread::sleep_for(kAgreementPoll);
  }
}

std::vector<int> Membership::lost_now() {
  const std::lock_guard<std::mutex> agreement(mutex_);
  adopt_rounds();
  return lost_;
}

void stop_every_pulse() {
  std::vector<std::shared_ptr<Membership::Pulse>> pulses;
  {
    const std::lock_guard<std::mutex> lock(live_pulses().mutex);
    for (const auto& weak : live_pulses().pulses) {
      if (auto pulse = weak.lock()) pulses.push_back(std::move(pulse));
    }
  }
  for (const auto& pulse : pulses) pulse->stop();
}

}  // namespace ringreduce
