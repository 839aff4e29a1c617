// algorithm="auto": the all-reduce algorithm for a call.
//
// A table the user gives (`python -m ringreduce.tune` writes one; ringreduce/tuning.py loads it)
// fixes the choice on the transports it has lines for. Everywhere else a communicator on host
// memory learns online (AutoLearner): the first calls of each size class try every candidate, the
// group's slowest time decides, and a small fraction of later calls checks the choice again. On a
// device, whose calls return before the work is done, the prior from theory stands.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/header.h"
#include "engine/cost_model.h"

namespace ringreduce {

// One line of the table: all-reduces on `transport` of at most `up_to_bytes` run `algorithm`.
// The lines of one transport and world size are read in ascending `up_to_bytes`.
struct AutoRule {
  std::string transport;
  int world = 0;  // the world size the line was measured at
  std::uint64_t up_to_bytes = 0;
  Algorithm algorithm = Algorithm::Ring;
};

// A table and where it came from. A communicator takes the process's table when it is made and
// keeps it, so a table loaded later never changes the choice under queued calls, and the ranks of
// a group agree on one table then (ringreduce/_groups.py: rank 0's).
struct AutoTable {
  std::vector<AutoRule> rules;  // sorted by transport, world, up_to_bytes
  std::string source;
  std::uint64_t generation = 0;  // tables made so far, when this one was
};

// A table of `rules`; `source` says where it came from. An empty table leaves every choice to the
// learner and the prior.
std::shared_ptr<const AutoTable> make_auto_table(std::vector<AutoRule> rules, std::string source);
// Replaces the process's table (what communicators made from now on take).
void set_auto_table(std::vector<AutoRule> rules, std::string source);
std::shared_ptr<const AutoTable> current_auto_table();

// Hears what auto decides (RINGREDUCE_DEBUG=INFO); null turns it off. A plain function, never a
// closure: the logger lives in a global, which is destroyed after the Python interpreter, so it
// must hold nothing of Python's.
using AutoLogger = void (*)(const std::string& sentence);
void set_auto_logger(AutoLogger logger);
AutoLogger auto_logger();

// Messages up to this size start on one-shot on host memory (one step, every rank reads every
// other's buffer), larger ones on ring (2(N-1) steps, but each rank moves only 2(N-1)/N of the
// message). 64 KiB: within the one-shot crossovers `python -m ringreduce.tune` measured on the
// 2-core machine on 2026-11-30 (shm 32 KiB at 2 ranks, local 64 KiB at 2 and 256 KiB at 4;
// benchmarks/RESULTS.md, "Small messages and auto"); the learner corrects it wherever it is wrong.
constexpr std::uint64_t kOneShotPriorBytes = 64 * 1024;

// What theory says before anything is measured: for small messages on host memory the fewest
// rounds of messages, one-shot on one host (one step) and doubling on a group that `spans_hosts`
// (log2(N) rounds, the call's check inside them, where one-shot's N-1 messages per rank each cross
// a network and the check takes rounds of its own: 4 KiB on 16 emulated hosts, 4.5 ms against
// central's 8-11, benchmarks/RESULTS.md); above them the algorithm that moves the fewest bytes over
// the slowest links: across hosts (`hierarchy`: a group over several hosts, some with several
// ranks) the hierarchical one, whose host links carry 2(H-1)/H of the buffer for H hosts instead of
// the flat ring's 2(N-1)/N; else the ring (one-shot and doubling do not run on a device). A learner
// of a group across hosts on host memory starts from the cost model's cheapest instead.
Algorithm prior_algorithm(std::uint64_t bytes, bool host_memory, bool hierarchy = false, bool spans_hosts = false);

// Whether the table has lines for `transport` (then they fix the choice there).
bool table_covers(const AutoTable& table, const std::string& transport);

// The fixed choice for `bytes` on `transport` with `world` ranks: the table's when it covers the
// transport, else the prior. Of the table, the lines measured at the largest world size not above
// `world` apply (the smallest measured, when all are above it); the first line that covers `bytes`
// wins, and ring where none does. One-shot gives way to ring on a device, and hierarchical where
// the group has no `hierarchy`.
Algorithm choose_algorithm(const AutoTable& table, const std::string& transport, int world, std::uint64_t bytes,
                           bool host_memory, bool hierarchy = false, bool spans_hosts = false);

// Timed calls of each candidate in a class's first round, one candidate's calls after another (the
// way a training loop calls; taking turns call by call, 4 ranks on 2 cores at 64 KiB measured all
// three at 74-79 us where their rows in the bench took 30, 46 and 62 us, each call paying for the
// state the other algorithm left). They are judged by the slowest rank's mean: what a loop of such
// calls takes. Not the median of the calls: beside a busy process (2 ranks, 4 KiB, 2026-12-02)
// one_shot's calls had a median of 22 us against ring's 20, yet a mean of 17 against 21 (many calls
// fast, the rest waiting for a descheduled peer), and the median of 5 calls chose central where the
// bench's rows took 47 us for central and 14 for one_shot. Five below kAutoLargeBytes, two above,
// where a call takes milliseconds and each extra call of a slow candidate costs as much as hundreds
// of small ones; a round that short only sizes the next one (kAutoRoundNanoseconds) unless it
// already took that long.
constexpr int kAutoSmallTrialCalls = 5;
constexpr int kAutoLargeTrialCalls = 2;
constexpr std::uint64_t kAutoLargeBytes = 4 * 1024 * 1024;
// A round judges only when the fastest candidate's calls in it took at least half this long on the
// slowest rank (a round sized for it may come out a little short); a shorter one sets the calls of
// the next, so that they take this long. Five 4 KiB calls on 4 ranks of 2 cores take about 125 us,
// while a rank whose core runs a peer waits up to a scheduler time slice (milliseconds): rounds that
// short crowned whichever candidate the stalls happened to miss (bench, 2026-12-02: ring at 64 KiB
// at 1.4x central's time, central at 4 MiB at 1.2x ring's). 10 ms spans a few time slices; a
// class's first exploration then took 11-78 ms in all, 3-33 ms more than the same calls of the
// choice (2 and 4 ranks, 4 KiB-16 MiB, benchmarks/RESULTS.md), and revisits come seldom
// (kAutoRevisitShare).
constexpr std::int64_t kAutoRoundNanoseconds = 10'000'000;
// At most this many timed calls of each candidate in a round: 2 ranks on shm at 4 KiB take 2-3 us
// a call, and 1000 of them (2-3 ms) already spread over many wake-ups of the other rank.
constexpr int kAutoMaxRoundCalls = 1000;
// Calls of a size class between two explorations of it: at least kAutoRevisitEvery, and at least
// kAutoRevisitShare times a round's calls, so that exploring takes about 1% of the class's calls
// (2% where the slower candidates take twice the best one's time, 4% with a second round).
constexpr std::uint64_t kAutoRevisitEvery = 2000;
constexpr std::uint64_t kAutoRevisitShare = 100;
// The current choice gives way only to a candidate this much faster, so measurement noise does not
// flip the choice back and forth; and only when it loses that way in a second round run at once,
// as a burst of noise (seen here: every candidate at 4-10x its time, the order among them random)
// spans one round far more often than two. The first exploration too: at 64 MiB its one round
// measured ring at 27.7 ms and central at 26.3 (2 ranks), where the bench's rows then took 9.6 and
// 24.5. The second round's winner takes over, whoever won the first: two candidates within a few
// percent of each other and both well ahead of the choice (4 ranks on 2 cores, 64 KiB: ring 34 us,
// central 32, the prior one_shot 47) could otherwise crown each other in turn, round after round,
// and leave the choice where it was.
constexpr double kAutoSwitchMargin = 0.05;
// One-shot is tried in the size classes below this. It is the latency algorithm: one step instead
// of 2(N-1), but every rank reduces the whole buffer and copies it once more; once a call takes
// milliseconds the saved steps are worth nothing and it lost everywhere measured (from 1 MiB: 1.6-4.4x
// ring's time at 2 and 4 ranks, every bench run of 2026-11-30 and 2026-12-01). Its exploring calls
// there were the dearest of all: at 64 MiB, 2 ranks, 33 ms against ring's 7.5.
constexpr std::uint64_t kOneShotCandidateBytes = 1024 * 1024;
// Doubling is tried below this, on groups that span hosts. Like one-shot it is a latency algorithm
// (log2 N steps, the whole buffer at each), and the same bound keeps its dear exploring calls
// away from the sizes where moving 2(N-1)/N of the buffer (ring, hierarchical) wins.
constexpr std::uint64_t kDoublingCandidateBytes = kOneShotCandidateBytes;

// The rates auto prices the candidates at on a group that spans hosts (engine/cost_model.h): fitted
// to 16 emulated hosts x 1 rank and 8 x 2 at 2 Gbit/s, all-reduces of 4 KiB-16 MiB by ring,
// hierarchical, doubling and halving-doubling, on the 2-core machine (benchmarks/RESULTS.md,
// 2026-12-06, "auto with halving-doubling"; every row within 0.70-1.37 of the model). A real
// network's differ: they price only the first size class, and the learner refits them to its own
// rounds (kAutoModelPriorWeight) before it prices the next.
constexpr CostRates kAcrossHostsRates{1.24e-3, 4.77e-9, 364e-6, 1.16e-9, 4.89e-9};
// On a group that spans hosts, a candidate the model prices this many times the cheapest one is not
// tried: across hosts an exploring call of the wrong algorithm costs the most (at 4 KiB on 16 hosts
// the ring took 49 ms against doubling's 5.4, the model 41 against 4.9), and the model's errors
// measured stay within a factor 1.3 either way, so 4 leaves out only what no measurement there
// would have chosen.
constexpr double kAutoModelTryFactor = 4.0;
// The learner refits the rates to its own judged rounds (each candidate's mean call on the slowest
// rank is one measured call), pulled toward kAcrossHostsRates with this weight per rate, in squared
// relative error: a hundredth of one call's, so three calls measured outweigh it and a rate they say
// nothing of (shared memory, on one rank per host) stays at its prior.
constexpr double kAutoModelPriorWeight = 0.01;
// The measured calls the refit keeps, the latest: about 20 rounds of three candidates.
constexpr std::size_t kAutoModelObservations = 64;

// The online choice of one communicator. Pure bookkeeping: the communicator times the calls and
// hands over the group's slowest times; every rank holds the same counts and the same times, so
// every rank reaches the same choice for the same call (the call header carries it, and a rank that
// differed would raise MismatchError).
class AutoLearner {
 public:
  // In this order; one_shot only on host memory and below kOneShotCandidateBytes, hierarchical only
  // on a group with a `hierarchy`, doubling only on host memory of a group that `spans_hosts` and
  // below kDoublingCandidateBytes, halving-doubling (the ring's bytes in log steps: any size) only on
  // host memory of a group that `spans_hosts`.
  static constexpr std::array<Algorithm, 6> kCandidates = {Algorithm::Ring,         Algorithm::Central,
                                                           Algorithm::OneShot,      Algorithm::Hierarchical,
                                                           Algorithm::Doubling,     Algorithm::HalvingDoubling};
  // Nanoseconds of each tried candidate's timed calls of a round, summed (by place among those
  // tried): this rank's, then (after the all-reduce) the slowest rank's.
  using Times = std::array<std::int64_t, kCandidates.size()>;

  // `host_of_rank` (rank r's host, hosts numbered by their first rank), where the group spans hosts
  // on host memory: then the cost model sets each size class's prior and leaves out the candidates
  // it prices kAutoModelTryFactor times the cheapest.
  AutoLearner(std::string transport, int world, bool host_memory, bool hierarchy = false, bool spans_hosts = false,
              std::vector<int> host_of_rank = {});

  struct Pick {
    Algorithm algorithm = Algorithm::Ring;
    bool exploring = false;
  };
  // The algorithm of the next call of `bytes`.
  Pick pick(std::uint64_t bytes);
  // This rank's time of the exploring call just picked. True when it ended its round: then
  // round_times() goes through an all-reduce (MAX) across the group, and decide() follows.
  bool record(std::uint64_t bytes, std::int64_t nanoseconds);
  Times& round_times(std::uint64_t bytes) { return size_class(bytes).times; }
  // Takes the candidate whose calls took least in the (group-wide) times; says so through
  // the logger. A round too short to judge (kAutoRoundNanoseconds) starts a longer one; a round the
  // choice loses (kAutoSwitchMargin) starts a second round instead, and when the choice loses that
  // too, the second round's winner takes over.
  void decide(std::uint64_t bytes);
  // The choice of every decided size class, by the class's smallest size.
  std::vector<std::pair<std::uint64_t, Algorithm>> choices() const;
  // The rates new size classes are priced at (kAcrossHostsRates until rounds were measured).
  const CostRates& rates() const { return rates_; }

 private:
  // The candidates tried at `bytes`, in kCandidates' order: the first `count` of `list`.
  struct Tried {
    std::array<Algorithm, kCandidates.size()> list{};
    std::size_t count = 0;
  };
  struct SizeClass {
    Algorithm chosen = Algorithm::Ring;
    bool priced = false;  // `tried` and `prior` are set (at the class's first call)
    Tried tried;
    Algorithm prior = Algorithm::Ring;
    bool decided = false;
    bool exploring = false;
    // The exploring call next picked: from 0, each candidate's `calls` timed calls in a row; the
    // class's first exploration starts with an untimed call of each from -candidates, as a first
    // call pays for the pages and buffers it touches.
    int trial = 0;
    int calls = 0;  // timed calls of each candidate in a round
    std::uint64_t since_decided = 0;  // calls since the last decision
    bool beaten = false;               // `chosen` lost this exploration's first round
    Times times{};
    std::uint64_t timed_bytes = 0;     // the bytes of the round's timed calls, summed
  };
  static void start_round(SizeClass& size);
  SizeClass& size_class(std::uint64_t bytes);
  static int first_round_calls(std::uint64_t bytes);
  // The class of `bytes`'s candidates, chosen at its first call: the same on every rank.
  const Tried& candidates(std::uint64_t bytes);
  // Sets the class's candidates and prior: the rules by size, then the cost model where it prices.
  void price(SizeClass& size, std::uint64_t bytes);
  // What the rates are and where they come from, for the log.
  std::string rates_text() const;
  // Adds a judged round's mean calls to what the rates are fitted to, and refits them.
  void measure_rates(const SizeClass& size, const Tried& tried, const std::vector<std::int64_t>& typical);

  std::string transport_;
  int world_;
  bool host_memory_;
  bool hierarchy_;
  bool spans_hosts_;
  std::vector<int> host_of_rank_;  // empty: no cost model
  CostRates rates_ = kAcrossHostsRates;
  std::vector<CostObservation> observed_;  // the latest kAutoModelObservations measured calls
  std::array<SizeClass, 65> classes_;  // by bit width of the size: 0 B, 1 B, 2-3 B, 4-7 B, ...
};

}  // namespace ringreduce
