// Who in a group is still there, and the survivors' one answer to "who is lost?".
//
// Every rank pulses: a thread sets the rank's counter in the group's store every kPulsePeriod and
// reads everybody's. A peer whose counter has not moved for `lost_after`, or whose process is gone
// (a peer on this host), is lost. After a failure the survivors agree on the lost ranks through
// the store, in numbered rounds: the first survivor to name a set for a round fixes it (set_once),
// each round's set holds the last one's, and every survivor adopts the newest round it finds. A
// death during the agreement or the shrink that follows opens the next round. This is ULFM's
// revoke, agree and shrink over a store; the store itself must outlive every rank that dies.
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

// How often a rank pulses and reads the others' pulses. A store round trip costs well under a
// millisecond here (a few across the emulated hosts), so 8 ranks cost the store about 64 reads and
// 32 writes a second, and a silence of lost_after spans 6 missed pulses by default.
constexpr std::chrono::milliseconds kPulsePeriod{250};
// A peer silent this long is lost (RINGREDUCE_LOST_AFTER, seconds). With a pulse read every
// kPulsePeriod, a loss is seen within 1.75 s, inside the 2 s a survivor may wait to learn of it;
// a live rank's pulse thread needs no GIL and no progress of the training loop, so only a process
// stopped for 1.5 s (or a store that slow) looks lost.
constexpr std::chrono::milliseconds kDefaultLostAfter{1500};
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
  // each other's pids) and first pulse, and waits for every rank's. `pulse_keys` and `keys` are two
  // handles on one store (the pulse thread's calls never queue behind a waiting get); `keys`, used
  // on failure paths, should bound each call (BoundedRendezvous). `timeout` bounds a shrink's roll
  // call.
  Membership(std::unique_ptr<Rendezvous> pulse_keys, std::unique_ptr<Rendezvous> keys, int rank, int size,
             const std::string& host, std::chrono::milliseconds lost_after, std::chrono::milliseconds timeout);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  std::chrono::milliseconds lost_after() const { return lost_after_; }

  // Called on the pulse thread when it first finds a peer lost, or a loss agreed by others: the
  // owner cancels the transfers that wait (for the lost rank, or for a survivor that has stopped
  // on the failure). Null to stop (before the owner goes).
  void on_loss(std::function<void()> wake);

  // After a failure: waits until every peer has either pulsed since `failed_at` (alive) or is lost
  // (at most lost_after plus three pulses), and then returns the lost ranks every survivor reports:
  // the agreed set, empty when nobody is lost. Raises RanksLostError naming this rank if the others
  // found it lost, and std::runtime_error when the store is gone.
  std::vector<int> agree_on_loss(std::chrono::steady_clock::time_point failed_at);

  // Without waiting: if ranks are lost beyond the agreed set, opens the next round with them. Returns
  // the agreed set (what a shrink checks while the survivors build the shrunk group).
  std::vector<int> poll_loss();

  // The lost ranks agreed so far (empty before any loss), after adopting any round other survivors have
  // fixed since (reads the store).
  std::vector<int> lost_now();

  // Before a shrink that leaves out `excluded` (sorted): checks it against the agreed loss (raising
  // std::invalid_argument for a rank that is alive, and RanksLostError when more are lost), then
  // waits for every survivor to get here. Returns the round the shrink belongs to and the attempt
  // in that round, the same on every survivor, which name the shrunk group's keys.
  std::pair<int, int> roll_call(const std::vector<int>& excluded);

  // Raises RanksLostError for `lost`, saying `why`.
  [[noreturn]] void raise_lost(const std::vector<int>& lost, const std::string& why) const;

  struct Pulse;  // what the pulse thread shares with the callers (membership.cpp)

 private:
  // agree_on_loss, whose store failures that call names as the store's.
  std::vector<int> agree(std::chrono::steady_clock::time_point failed_at);
  // Adopts the newest round some survivor has fixed; raises if it holds this rank.
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
