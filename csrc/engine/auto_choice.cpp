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

Algorithm choose_algorithm(const std::string& transport, int world, std::uint64_t bytes, bool host_memory) {
  std::shared_ptr<const AutoTable> current;
  AutoLogger log = nullptr;
  {
    const std::lock_guard<std::mutex> lock(table_mutex);
    current = table;
    log = logger;
  }
  const std::vector<AutoRule>& rules = current->rules;
  // The world size whose lines apply: the largest measured at or below `world`, else the smallest.
  int below = -1;
  int smallest = INT_MAX;
  for (const AutoRule& rule : rules) {
    if (rule.transport != transport) continue;
    if (rule.world <= world) below = std::max(below, rule.world);
    smallest = std::min(smallest, rule.world);
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
  if (algorithm == Algorithm::OneShot && !host_memory) algorithm = Algorithm::Ring;
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

}  // namespace ringreduce
