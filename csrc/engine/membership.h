// Who in a group is still there, and the survivors' one answer to "who is lost?".
//
// Every rank pulses: a thread sets the rank's counter in the group's store every kPulsePeriod and
// reads those of the kWatchers ranks after it (every rank's while an agreement needs them all). A peer is lost on evidence that its process is gone (its pid, on this host;
// its liveness port refused, on another: engine/liveness.h), or after `lost_after` of silence,
// whatever its process does: a rank stopped for less is forgiven, one stopped for longer is fenced
// and told so when it resumes. The thread that finds a loss records it before it cancels anything.
// The survivors agree on the lost ranks through the store, in numbered rounds: the first survivor
// to name a set for a round fixes it (set_once), each round's set holds the last one's, and every
// survivor adopts the newest round it finds. A death during the agreement or the shrink that
// follows opens the next round. This is ULFM's revoke, agree and shrink over a store; the store
// itself must outlive every rank that dies.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/rendezvous.h"

namespace ringreduce {

// How often a rank pulses and reads the pulses it watches: three store requests a period (its
// pulse, the watched pulses in one multi_get, a look for a new round), 12 a second per rank whatever
// the group's size; a silence of lost_after spans 40 missed pulses by default.
constexpr std::chrono::milliseconds kPulsePeriod{250};
// How many ranks watch each rank (its predecessors in rank order): the store's load stays O(N), and
// a death is found though one watcher dies with it. Two is the fewest that survives that; a watched
// rank found lost hands its watchers on to the next one, so a run of deaths is found a period or a
// probe later per rank of the run. (ULFM's detector watches one neighbour, and spreads a failure.)
constexpr int kWatchers = 2;
// A peer silent this long is lost though nothing says its process is gone (RINGREDUCE_LOST_AFTER,
// seconds): a whole host cut off, or a process stopped that long. The anchors wait 5 s (torchft's
// lighthouse), 10 s (Open MPI ULFM's detector, whose docs warn that shorter values cause false
// suspicions), 15 s (torchrun's rendezvous) and 60 s (NCCL's RAS). Processes do stop for seconds
// while alive (swap, a debugger attach, a cgroup freeze, a VM pause): ULFM's 10 s forgives a
// 5 s stop with room to spare, and a death with evidence is named within about 2 s regardless.
constexpr std::chrono::milliseconds kDefaultLostAfter{10000};
// A peer on another host silent this long has its liveness port probed, once every kProbeEvery:
// four missed pulses, which a live, running rank does not miss (its pulse thread needs no GIL),
// so a killed rank is named within about 1.5 s of its last pulse plus the agreement.
constexpr std::chrono::milliseconds kSuspectAfter{1000};
constexpr std::chrono::milliseconds kProbeEvery{1000};
constexpr const char* kLostAfterEnv = "RINGREDUCE_LOST_AFTER";
// How long the pulse thread may take to stop at teardown before it is left to end on its own (a
// store call to a store that is gone blocks until the store's own timeout).
constexpr std::chrono::milliseconds kPulseStopWait{1000};

// lost_after from RINGREDUCE_LOST_AFTER, or the default; raises std::invalid_argument when set to
// anything but a positive number of seconds.
std::chrono::milliseconds lost_after_from_env();

// At exit: stops every membership's pulse thread (each within kPulseStopWait), so none runs on
// while the process tears down; the groups they watch are being dropped.
void stop_every_pulse();

class Membership {
 public:
  // Collective over the group: publishes this rank's process (`host` says which processes can see
  // each other's pids), its liveness port (which the others probe on `probe_address`, the address
  // they reach this host by, or on 127.0.0.1 from the same network namespace; with neither, a rank
  // on another host is lost by silence only) and first pulse, and waits for every rank's. `pulse_keys` and `keys` are two
  // handles on one store (the pulse thread's calls never queue behind a waiting get); `keys`, used
  // on failure paths, should bound each call (BoundedRendezvous). `timeout` bounds a shrink's roll
  // call.
  Membership(std::unique_ptr<Rendezvous> pulse_keys, std::unique_ptr<Rendezvous> keys, int rank, int size,
             const std::string& host, const std::string& probe_address, std::chrono::milliseconds lost_after,
             std::chrono::milliseconds timeout);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds lost_after() const { return lost_after_; }

  // Called on the pulse thread once a loss is recorded (by this rank or another): the owner cancels
  // the transfers that wait (for the lost rank, or for a survivor that has stopped on the
  // failure). Null to stop (before the owner goes).
  void on_loss(std::function<void()> wake);

  // After a failure: waits until every peer has either pulsed since `failed_at` (alive) or is lost
  // (at most lost_after plus three pulses), and then returns the lost ranks every survivor reports:
  // the agreed set, empty when nobody is lost. Raises RanksLostError naming this rank if the others
  // found it lost, and std::runtime_error when the store is gone.
  std::vector<int> agree_on_loss(std::chrono::steady_clock::time_point failed_at);

  // Without waiting: if ranks are lost beyond the agreed set, opens the next round with them. Returns
  // the agreed set (what a shrink checks while the survivors build the shrunk group).
  std::vector<int> poll_loss();

  // The lost ranks agreed so far (empty before any loss; this rank among them if it was fenced),
  // after adopting any round other survivors have fixed since (reads the store).
  std::vector<int> lost_now();

  // Before a shrink that leaves out `excluded` (sorted): checks it against the agreed loss (raising
  // std::invalid_argument for a rank that is alive, and RanksLostError when more are lost), then
  // waits for every survivor to get here. Returns the round the shrink belongs to and the attempt
  // in that round, the same on every survivor, which name the shrunk group's keys.
  std::pair<int, int> roll_call(const std::vector<int>& excluded);

  // After the survivors of (round, attempt) (a roll_call's answer) each built the shrunk group or
  // failed to: one outcome for all. Each says whether its part is `built`; the first to decide fixes
  // the outcome (set_once), and every survivor follows it. Commit once every survivor has built;
  // abort at once when this one has not, when a rank beyond `excluded` is lost meanwhile, or after
  // the timeout. Returns whether the shrunk group is committed, the same on every survivor.
  bool decide_shrink(int round, int attempt, const std::vector<int>& excluded, bool built);

  // Raises RanksLostError for `lost`, saying `why`.
  [[noreturn]] void raise_lost(const std::vector<int>& lost, const std::string& why) const;

  struct Pulse;  // what the pulse thread shares with the callers (membership.cpp)

 private:
  // agree_on_loss, whose store failures that call names as the store's.
  std::vector<int> agree(std::chrono::steady_clock::time_point failed_at);
  // Adopts the newest round some survivor has fixed.
  void adopt_rounds();
  // adopt_rounds, then raises if the round holds this rank.
  void catch_up();
  // Fixes `lost` for the round after ours, unless another survivor fixed that round first; adopts it.
  void propose(const std::vector<int>& lost);

  const int rank_;
  const int size_;
  const std::chrono::milliseconds lost_after_;
  const std::chrono::milliseconds timeout_;
  std::unique_ptr<Rendezvous> keys_;
  mutable std::mutex mutex_;        // guards the agreement below (callers may be several threads)
  int round_ = 0;                   // the newest round adopted
  std::map<int, int> attempts_;     // shrinks tried, by round
  std::vector<int> lost_;           // its set
  std::shared_ptr<Pulse> pulse_;    // shared with the thread, which may outlive us (kPulseStopWait)
};

}  // namespace ringreduce
