#include "engine/auto_choice.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "core/common.h"

namespace ringreduce {
namespace {

struct AutoTable {
  std::vector<AutoRule> rules;  // sorted by transport, world, up_to_bytes
  std::string source;
  std::uint64_t generation = 0;  // tables set so far, when this one was
};

std::mutex table_mutex;
std::shared_ptr<const AutoTable> table = std::make_shared<AutoTable>();
AutoLogger logger = nullptr;
std::set<std::pair<std::uint64_t, std::size_t>> logged;  // (table generation, line) already announced

std::string bytes_text(std::uint64_t bytes) {
  return bytes == UINT64_MAX ? std::string("any size") : detail::concat("up to ", bytes, " B");
}

std::shared_ptr<const AutoTable> current_table() {
  const std::lock_guard<std::mutex> lock(table_mutex);
  return table;
}

}  // namespace

void set_auto_table(std::vector<AutoRule> rules, std::string source) {
  std::sort(rules.begin(), rules.end(), [](const AutoRule& a, const AutoRule& b) {
    return std::tie(a.transport, a.world, a.up_to_bytes) < std::tie(b.transport, b.world, b.up_to_bytes);
  });
  const std::lock_guard<std::mutex> lock(table_mutex);
  table = std::make_shared<AutoTable>(AutoTable{std::move(rules), std::move(source), table->generation + 1});
}

void set_auto_logger(AutoLogger fn) {
  const std::lock_guard<std::mutex> lock(table_mutex);
  logger = fn;
}

AutoLogger auto_logger() {
  const std::lock_guard<std::mutex> lock(table_mutex);
  return logger;
}

Algorithm prior_algorithm(std::uint64_t bytes, bool host_memory) {
  return host_memory && bytes <= kOneShotPriorBytes ? Algorithm::OneShot : Algorithm::Ring;
}

bool table_covers(const std::string& transport) {
  const std::shared_ptr<const AutoTable> current = current_table();
  return std::any_of(current->rules.begin(), current->rules.end(),
                     [&](const AutoRule& rule) { return rule.transport == transport; });
}

Algorithm choose_algorithm(const std::string& transport, int world, std::uint64_t bytes, bool host_memory) {
  const std::shared_ptr<const AutoTable> current = current_table();
  const std::vector<AutoRule>& rules = current->rules;
  // The world size whose lines apply: the largest measured at or below `world`, else the smallest.
  int below = -1;
  int smallest = INT_MAX;
  for (const AutoRule& rule : rules) {
    if (rule.transport != transport) continue;
    if (rule.world <= world) below = std::max(below, rule.world);
    smallest = std::min(smallest, rule.world);
  }
  if (smallest == INT_MAX) return prior_algorithm(bytes, host_memory);
  const int measured = below >= 0 ? below : smallest;
  std::size_t chosen = rules.size();
  for (std::size_t i = 0; i < rules.size(); ++i) {
    if (rules[i].transport == transport && rules[i].world == measured && bytes <= rules[i].up_to_bytes) {
      chosen = i;
      break;
    }
  }
  Algorithm algorithm = chosen < rules.size() ? rules[chosen].algorithm : Algorithm::Ring;
  if (algorithm == Algorithm::OneShot && !host_memory) algorithm = Algorithm::Ring;
  const AutoLogger log = auto_logger();
  if (log) {
    bool first;
    {
      const std::lock_guard<std::mutex> lock(table_mutex);
      first = logged.insert({current->generation, chosen}).second;
    }
    if (first) {
      const std::string why =
          chosen == rules.size()
              ? detail::concat("no line of the table (", current->source, ") covers ", transport, " at ", bytes,
                               " B: ring")
              : detail::concat("the line \"", transport, ", ", measured, " ranks, ", bytes_text(rules[chosen].up_to_bytes),
                               ": ", algorithm_name(rules[chosen].algorithm), "\" of ", current->source,
                               host_memory || rules[chosen].algorithm != Algorithm::OneShot ? ""
                                                                                            : " (one_shot is host-only: ring)");
      log(detail::concat("auto chose ", algorithm_name(algorithm), " for ", bytes, " B on ", transport, " with ", world,
                         " ranks: ", why));
    }
  }
  return algorithm;
}

AutoLearner::AutoLearner(std::string transport, int world, bool host_memory)
    : transport_(std::move(transport)), world_(world) {
  candidates_ = {Algorithm::Ring, Algorithm::Central};
  if (host_memory) candidates_.push_back(Algorithm::OneShot);
}

AutoLearner::SizeClass& AutoLearner::size_class(std::uint64_t bytes) {
  return classes_[static_cast<std::size_t>(std::bit_width(bytes))];
}

AutoLearner::Pick AutoLearner::pick(std::uint64_t bytes) {
  SizeClass& size = size_class(bytes);
  const int count = static_cast<int>(candidates_.size());
  if (!size.decided && !size.exploring) {
    size.chosen = prior_algorithm(bytes, count > 2);
    size.exploring = true;  // the class's first call
    size.trial = -count;
  } else if (!size.exploring && ++size.since_decided >= kAutoRevisitEvery) {
    size.exploring = true;  // look again: the machine's load or placement may have changed
    size.trial = 0;
  }
  if (!size.exploring) return {size.chosen, false};
  return {candidates_[static_cast<std::size_t>((size.trial + count) % count)], true};
}

bool AutoLearner::record(std::uint64_t bytes, std::int64_t nanoseconds) {
  SizeClass& size = size_class(bytes);
  if (size.trial >= 0) size.times[static_cast<std::size_t>(size.trial)] = nanoseconds;
  return ++size.trial == static_cast<int>(candidates_.size()) * kAutoRounds;
}

void AutoLearner::decide(std::uint64_t bytes) {
  SizeClass& size = size_class(bytes);
  const std::size_t count = candidates_.size();
  std::vector<std::int64_t> fastest(count, INT64_MAX);
  for (std::size_t trial = 0; trial < count * kAutoRounds; ++trial) {
    fastest[trial % count] = std::min(fastest[trial % count], size.times[trial]);
  }
  const std::size_t best = static_cast<std::size_t>(std::min_element(fastest.begin(), fastest.end()) - fastest.begin());
  const std::size_t current =
      static_cast<std::size_t>(std::find(candidates_.begin(), candidates_.end(), size.chosen) - candidates_.begin());
  const Algorithm before = size.chosen;
  if (static_cast<double>(fastest[best]) < static_cast<double>(fastest[current]) * (1.0 - kAutoSwitchMargin)) {
    size.chosen = candidates_[best];
  }
  const bool first = !size.decided;
  size.decided = true;
  size.exploring = false;
  size.since_decided = 0;
  const AutoLogger log = auto_logger();
  if (log && (first || size.chosen != before)) {
    const int width = std::bit_width(bytes);
    std::string measured;
    for (std::size_t i = 0; i < count; ++i) {
      measured += detail::concat(i ? ", " : "", algorithm_name(candidates_[i]), " ", (fastest[i] + 50) / 100 / 10.0,
                                 " us");
    }
    log(detail::concat("auto on ", transport_, " with ", world_, " ranks, ",
                       width == 0 ? 0 : std::uint64_t{1} << (width - 1), "-",
                       width == 64 ? UINT64_MAX : (std::uint64_t{1} << width) - 1, " B: tried ", measured,
                       " (the slowest rank, fastest of ", kAutoRounds, " calls each): ", algorithm_name(size.chosen),
                       first ? (size.chosen == before ? " (the prior)" : detail::concat(" (the prior was ",
                                                                                        algorithm_name(before), ")"))
                             : detail::concat(" (was ", algorithm_name(before), ")")));
  }
}

}  // namespace ringreduce
