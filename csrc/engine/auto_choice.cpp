#include "engine/auto_choice.h"

#include <algorithm>
#include <climits>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "core/common.h"

namespace ringreduce {
namespace {

std::mutex table_mutex;
std::shared_ptr<const AutoTable> table = std::make_shared<AutoTable>();
std::uint64_t tables_made = 0;
AutoLogger logger = nullptr;
// (table generation, line) already announced; past the lines, rules.size() + 1 + the prior's algorithm.
std::set<std::pair<std::uint64_t, std::size_t>> logged;

std::string bytes_text(std::uint64_t bytes) {
  return bytes == UINT64_MAX ? std::string("any size") : detail::concat("up to ", bytes, " B");
}

// Whether (table generation, what was chosen) is said for the first time.
bool first_time(std::uint64_t generation, std::size_t chosen) {
  const std::lock_guard<std::mutex> lock(table_mutex);
  return logged.insert({generation, chosen}).second;
}

// The number of bits `bytes` needs (0 for 0): C++20's std::bit_width, which torch builds under C++17
// (torch 2.11 and older) do not have.
int bit_width(std::uint64_t bytes) {
  return bytes == 0 ? 0 : 64 - __builtin_clzll(bytes);
}

// The smallest size of the learner's size class of `bytes` (classes are bit widths).
std::uint64_t class_floor(std::uint64_t bytes) {
  const int width = bit_width(bytes);
  return width == 0 ? 0 : std::uint64_t{1} << (width - 1);
}

}  // namespace

std::shared_ptr<const AutoTable> make_auto_table(std::vector<AutoRule> rules, std::string source) {
  std::sort(rules.begin(), rules.end(), [](const AutoRule& a, const AutoRule& b) {
    return std::tie(a.transport, a.world, a.up_to_bytes) < std::tie(b.transport, b.world, b.up_to_bytes);
  });
  const std::lock_guard<std::mutex> lock(table_mutex);
  return std::make_shared<AutoTable>(AutoTable{std::move(rules), std::move(source), ++tables_made});
}

void set_auto_table(std::vector<AutoRule> rules, std::string source) {
  std::shared_ptr<const AutoTable> made = make_auto_table(std::move(rules), std::move(source));
  const std::lock_guard<std::mutex> lock(table_mutex);
  table = std::move(made);
}

std::shared_ptr<const AutoTable> current_auto_table() {
  const std::lock_guard<std::mutex> lock(table_mutex);
  return table;
}

void set_auto_logger(AutoLogger fn) {
  const std::lock_guard<std::mutex> lock(table_mutex);
  logger = fn;
}

AutoLogger auto_logger() {
  const std::lock_guard<std::mutex> lock(table_mutex);
  return logger;
}

Algorithm prior_algorithm(std::uint64_t bytes, bool host_memory, bool hierarchy, bool spans_hosts) {
  if (host_memory && bytes <= kOneShotPriorBytes) return spans_hosts ? Algorithm::Doubling : Algorithm::OneShot;
  return hierarchy ? Algorithm::Hierarchical : Algorithm::Ring;
}

bool table_covers(const AutoTable& table, const std::string& transport) {
  return std::any_of(table.rules.begin(), table.rules.end(),
                     [&](const AutoRule& rule) { return rule.transport == transport; });
}

Algorithm choose_algorithm(const AutoTable& table, const std::string& transport, int world, std::uint64_t bytes,
                           bool host_memory, bool hierarchy, bool spans_hosts) {
  const std::vector<AutoRule>& rules = table.rules;
  // The world size whose lines apply: the largest measured at or below `world`, else the smallest.
  int below = -1;
  int smallest = INT_MAX;
  for (const AutoRule& rule : rules) {
    if (rule.transport != transport) continue;
    if (rule.world <= world) below = std::max(below, rule.world);
    smallest = std::min(smallest, rule.world);
  }
  const AutoLogger log = auto_logger();
  if (smallest == INT_MAX) {
    const Algorithm prior = prior_algorithm(bytes, host_memory, hierarchy, spans_hosts);
    if (log && first_time(table.generation, rules.size() + 1 + static_cast<std::size_t>(prior))) {
      log(detail::concat("auto chose ", algorithm_name(prior), " for ", bytes, " B on ", transport, " with ", world,
                         " ranks: the prior (", spans_hosts ? "doubling" : "one_shot", " up to ", kOneShotPriorBytes,
                         " B on host memory, ",
                         hierarchy ? "hierarchical" : "ring", " above and on devices), as no table covers ", transport,
                         " and this group does not learn (it learns on host memory with 2 ranks or more)"));
    }
    return prior;
  }
  const int measured = below >= 0 ? below : smallest;
  std::size_t chosen = rules.size();
  for (std::size_t i = 0; i < rules.size(); ++i) {
    if (rules[i].transport == transport && rules[i].world == measured && bytes <= rules[i].up_to_bytes) {
      chosen = i;
      break;
    }
  }
  Algorithm algorithm = chosen < rules.size() ? rules[chosen].algorithm : Algorithm::Ring;
  if ((host_memory_only(algorithm) && !host_memory) ||
      (algorithm == Algorithm::Hierarchical && !hierarchy)) {
    algorithm = Algorithm::Ring;
  }
  if (log && first_time(table.generation, chosen)) {
    const Algorithm listed = chosen < rules.size() ? rules[chosen].algorithm : Algorithm::Ring;
    const bool host_only = host_memory_only(listed);
    const std::string why =
        chosen == rules.size()
            ? detail::concat("no line of the table (", table.source, ") covers ", transport, " at ", bytes, " B: ring")
            : detail::concat("the line \"", transport, ", ", measured, " ranks, ", bytes_text(rules[chosen].up_to_bytes),
                             ": ", algorithm_name(rules[chosen].algorithm), "\" of ", table.source,
                             host_memory || !host_only ? "" : detail::concat(" (", algorithm_name(listed),
                                                                             " is host-only: ring)"),
                             algorithm == listed || host_only ? "" : " (this group does not span hosts: ring)");
    log(detail::concat("auto chose ", algorithm_name(algorithm), " for ", bytes, " B on ", transport, " with ", world,
                       " ranks: ", why));
  }
  return algorithm;
}

AutoLearner::AutoLearner(std::string transport, int world, bool host_memory, bool hierarchy, bool spans_hosts,
                         std::vector<int> host_of_rank)
    : transport_(std::move(transport)),
      world_(world),
      host_memory_(host_memory),
      hierarchy_(hierarchy),
      spans_hosts_(spans_hosts),
      host_of_rank_(std::move(host_of_rank)) {}

const AutoLearner::Tried& AutoLearner::candidates(std::uint64_t bytes) {
  SizeClass& size = size_class(bytes);
  if (!size.priced) price(size, bytes);
  return size.tried;
}

std::string AutoLearner::rates_text() const {
  const std::string rates =
      detail::concat("a link round ", static_cast<long long>(rates_.link_latency_s * 1e7 + 0.5) / 10.0, " us, ",
                     static_cast<long long>(rates_.link_s_per_byte * 1e12 + 0.5) / 1000.0, " ns/B on the link, ",
                     static_cast<long long>(rates_.reduce_s_per_byte * 1e12 + 0.5) / 1000.0, " ns/B reduced");
  return observed_.empty() ? detail::concat("rates of 2 Gbit/s emulated hosts: ", rates)
                           : detail::concat("rates fitted to ", observed_.size(), " measured calls: ", rates);
}

void AutoLearner::measure_rates(const SizeClass& size, const Tried& tried, const std::vector<std::int64_t>& typical) {
  const std::uint64_t mean_bytes = size.timed_bytes / static_cast<std::uint64_t>(size.calls * tried.count);
  for (std::size_t i = 0; i < tried.count; ++i) {
    observed_.push_back({all_reduce_cost_terms(tried.list[i], mean_bytes, host_of_rank_),
                         static_cast<double>(typical[i]) * 1e-9});
  }
  if (observed_.size() > kAutoModelObservations) {
    observed_.erase(observed_.begin(), observed_.end() - static_cast<std::ptrdiff_t>(kAutoModelObservations));
  }
  rates_ = fit_cost_rates(observed_, kAcrossHostsRates, kAutoModelPriorWeight);
  if (const AutoLogger log = auto_logger()) {
    log(detail::concat("auto on ", transport_, " with ", world_, " ranks across hosts: ", rates_text(),
                       " (the size classes priced from now on)"));
  }
}

void AutoLearner::price(SizeClass& size, std::uint64_t bytes) {
  const std::uint64_t floor = class_floor(bytes);
  Tried& tried = size.tried;
  tried.count = 0;
  for (const Algorithm candidate : kCandidates) {
    if (candidate == Algorithm::OneShot && !(host_memory_ && floor < kOneShotCandidateBytes)) continue;
    if (candidate == Algorithm::Hierarchical && !hierarchy_) continue;
    if (candidate == Algorithm::Doubling && !(host_memory_ && spans_hosts_ && floor < kDoublingCandidateBytes)) {
      continue;
    }
    if (candidate == Algorithm::HalvingDoubling && !(host_memory_ && spans_hosts_)) continue;
    tried.list[tried.count++] = candidate;
  }
  size.prior = prior_algorithm(bytes, host_memory_, hierarchy_, spans_hosts_);
  size.priced = true;
  if (host_of_rank_.empty()) return;
  // Priced at the class's smallest size, so that the class is priced alike whichever call comes first.
  std::array<double, kCandidates.size()> seconds{};
  for (std::size_t i = 0; i < tried.count; ++i) {
    seconds[i] = predicted_seconds(all_reduce_cost_terms(tried.list[i], std::max<std::uint64_t>(floor, 1),
                                                         host_of_rank_), rates_);
  }
  const double cheapest = *std::min_element(seconds.begin(), seconds.begin() + tried.count);
  std::string priced;
  const Tried all = tried;
  tried.count = 0;
  for (std::size_t i = 0; i < all.count; ++i) {
    priced += detail::concat(i ? ", " : "", algorithm_name(all.list[i]), " ", static_cast<long long>(seconds[i] * 1e5 + 0.5) / 100.0, " ms");
    if (seconds[i] == cheapest) size.prior = all.list[i];
    if (seconds[i] <= cheapest * kAutoModelTryFactor) tried.list[tried.count++] = all.list[i];
  }
  if (const AutoLogger log = auto_logger()) {
    std::string names;
    for (std::size_t i = 0; i < tried.count; ++i) names += detail::concat(i ? ", " : "", algorithm_name(tried.list[i]));
    log(detail::concat("auto on ", transport_, " with ", world_, " ranks across hosts, from ", floor,
                       " B: the cost model prices ", priced, " (", rates_text(), "); starts from ",
                       algorithm_name(size.prior), " and tries ", names, " (those within ", kAutoModelTryFactor,
                       "x of the cheapest)"));
  }
}

AutoLearner::SizeClass& AutoLearner::size_class(std::uint64_t bytes) {
  return classes_[static_cast<std::size_t>(bit_width(bytes))];
}

int AutoLearner::first_round_calls(std::uint64_t bytes) {
  // By the class's smallest size, so that every call of a class explores alike.
  return class_floor(bytes) < kAutoLargeBytes ? kAutoSmallTrialCalls : kAutoLargeTrialCalls;
}

void AutoLearner::start_round(SizeClass& size) {
  size.trial = 0;
  size.times.fill(0);
  size.timed_bytes = 0;
}

AutoLearner::Pick AutoLearner::pick(std::uint64_t bytes) {
  const Tried& tried = candidates(bytes);
  SizeClass& size = size_class(bytes);
  const int count = static_cast<int>(tried.count);
  if (!size.decided && !size.exploring) {
    size.chosen = size.prior;
    size.exploring = true;  // the class's first call
    size.calls = first_round_calls(bytes);
    size.trial = -count;
  } else if (!size.exploring &&
             ++size.since_decided >=
                 std::max(kAutoRevisitEvery, kAutoRevisitShare * static_cast<std::uint64_t>(size.calls * count))) {
    size.exploring = true;  // look again: the machine's load or placement may have changed
    start_round(size);
  }
  if (!size.exploring) return {size.chosen, false};
  const int candidate = size.trial < 0 ? size.trial + count : size.trial / size.calls;
  return {tried.list[static_cast<std::size_t>(candidate)], true};
}

bool AutoLearner::record(std::uint64_t bytes, std::int64_t nanoseconds) {
  SizeClass& size = size_class(bytes);
  if (size.trial >= 0) {
    size.times[static_cast<std::size_t>(size.trial / size.calls)] += nanoseconds;
    size.timed_bytes += bytes;
  }
  return ++size.trial == static_cast<int>(candidates(bytes).count) * size.calls;
}

void AutoLearner::decide(std::uint64_t bytes) {
  const Tried& tried = candidates(bytes);
  SizeClass& size = size_class(bytes);
  const std::size_t count = tried.count;
  const int calls = size.calls;
  std::vector<std::int64_t> typical(count);  // each candidate's mean call on the slowest rank
  for (std::size_t i = 0; i < count; ++i) typical[i] = size.times[i] / calls;
  const std::size_t best = static_cast<std::size_t>(std::min_element(typical.begin(), typical.end()) - typical.begin());
  const std::int64_t shortest = std::max<std::int64_t>(size.times[best], 1);  // the best candidate's calls, in all
  const AutoLogger log = auto_logger();
  if (shortest < kAutoRoundNanoseconds / 2 && calls < kAutoMaxRoundCalls) {
    // Too short to judge: the next round gives the best candidate about kAutoRoundNanoseconds.
    const std::int64_t wanted = (kAutoRoundNanoseconds * calls + shortest - 1) / shortest;
    size.calls = static_cast<int>(std::clamp<std::int64_t>(wanted, calls + 1, kAutoMaxRoundCalls));
    start_round(size);
    if (log) {
      log(detail::concat("auto on ", transport_, " with ", world_, " ranks, from ", class_floor(bytes), " B: ", calls,
                         " calls of each candidate took ", (shortest + 500) / 1000, " us at the fastest, too few to "
                         "judge; trying ", size.calls, " of each"));
    }
    return;
  }
  if (!host_of_rank_.empty()) measure_rates(size, tried, typical);
  const std::size_t current = static_cast<std::size_t>(
      std::find(tried.list.begin(), tried.list.begin() + count, size.chosen) - tried.list.begin());
  const Algorithm before = size.chosen;
  const bool first = !size.decided;
  const bool faster = static_cast<double>(typical[best]) < static_cast<double>(typical[current]) * (1.0 - kAutoSwitchMargin);
  if (faster && !size.beaten) {
    // The choice (the prior, or a measured one) gives way only when it loses two rounds in a
    // row: one round can fall in a burst of the machine's noise, or in the first calls of a
    // workload, which pay for caches and pages, and slow the candidates unevenly.
    size.beaten = true;
    start_round(size);  // exploring again, at once
    if (log) {
      log(detail::concat("auto on ", transport_, " with ", world_, " ranks, from ", class_floor(bytes), " B: ",
                         algorithm_name(tried.list[best]), " looked faster than ", algorithm_name(before),
                         "; trying again before switching"));
    }
    return;
  }
  if (faster) size.chosen = tried.list[best];  // lost twice in a row: this round's winner takes over
  size.beaten = false;
  size.decided = true;
  size.exploring = false;
  size.since_decided = 0;
  if (log && (first || size.chosen != before)) {
    const std::uint64_t floor = class_floor(bytes);
    std::string measured;
    for (std::size_t i = 0; i < count; ++i) {
      measured += detail::concat(i ? ", " : "", algorithm_name(tried.list[i]), " ", (typical[i] + 50) / 100 / 10.0,
                                 " us");
    }
    log(detail::concat("auto on ", transport_, " with ", world_, " ranks, ", floor, "-",
                       floor == 0 ? 0 : floor * 2 - 1, " B: tried ", measured,
                       " (the slowest rank's mean of ", calls, " calls each): ", algorithm_name(size.chosen),
                       first ? (size.chosen == before ? " (the prior)" : detail::concat(" (the prior was ",
                                                                                        algorithm_name(before), ")"))
                             : detail::concat(" (was ", algorithm_name(before), ")")));
  }
}

std::vector<std::pair<std::uint64_t, Algorithm>> AutoLearner::choices() const {
  std::vector<std::pair<std::uint64_t, Algorithm>> decided;
  for (std::size_t width = 0; width < classes_.size(); ++width) {
    const std::uint64_t floor = width == 0 ? 0 : std::uint64_t{1} << (width - 1);
    if (classes_[width].decided) decided.emplace_back(floor, classes_[width].chosen);
  }
  return decided;
}

}  // namespace ringreduce
