#include "engine/cost_model.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "algorithms/schedule.h"
#include "core/common.h"

namespace ringreduce {
namespace {

// One step of a log-step schedule, as the model prices it.
struct PricedStep {
  int peer = 0;
  DoublingRole role = DoublingRole::Exchange;
  double sent = 0;     // bytes sent to the peer
  double reduced = 0;  // bytes received and reduced
};

// A log-step schedule (doubling's, halving-doubling's), phase by phase: every rank's steps put in
// common phases (the hand-over, the exchanges in order, the hand-back), and per phase the bytes
// leaving the busiest host and the most any rank reduces. Rank 0 stands in the most phases: its
// steps are the critical path.
template <typename StepsOf>
void add_log_steps(CostTerms& terms, const std::vector<int>& host_of, StepsOf steps_of) {
  const int world = static_cast<int>(host_of.size());
  const std::size_t phases = steps_of(0).size();
  const bool handed_over = (world & (world - 1)) != 0;  // ranks above the largest power of two hand over
  const int hosts = *std::max_element(host_of.begin(), host_of.end()) + 1;
  std::vector<std::vector<double>> leaving(phases, std::vector<double>(static_cast<std::size_t>(hosts), 0.0));
  std::vector<double> reduced(phases, 0.0);
  for (int rank = 0; rank < world; ++rank) {
    std::size_t exchanges = 0;
    for (const PricedStep& step : steps_of(rank)) {
      const bool first = step.role == DoublingRole::HandOver || step.role == DoublingRole::TakeOver;
      const bool last = step.role == DoublingRole::HandBack || step.role == DoublingRole::TakeBack;
      const std::size_t phase = first ? 0 : last ? phases - 1 : (handed_over ? 1 : 0) + exchanges++;
      if (host_of[rank] != host_of[step.peer]) leaving[phase][host_of[rank]] += step.sent;
      reduced[phase] = std::max(reduced[phase], step.reduced);
    }
  }
  for (std::size_t phase = 0; phase < phases; ++phase) {
    terms.link_messages += 1;
    terms.link_bytes += *std::max_element(leaving[phase].begin(), leaving[phase].end());
    terms.reduced_bytes += reduced[phase];
  }
}

// Doubling's steps: each sends or reduces the whole buffer.
std::vector<PricedStep> doubling_steps(double bytes, int world, int rank) {
  std::vector<PricedStep> steps;
  for (const DoublingStep& step : doubling_schedule(world, rank)) {
    const bool sends = step.role != DoublingRole::TakeOver && step.role != DoublingRole::TakeBack;
    const bool reduces = step.role == DoublingRole::TakeOver || step.role == DoublingRole::Exchange;
    steps.push_back({step.peer, step.role, sends ? bytes : 0.0, reduces ? bytes : 0.0});
  }
  return steps;
}

// Halving-doubling's steps: their spans, in bytes.
std::vector<PricedStep> halving_doubling_steps(std::uint64_t bytes, int world, int rank) {
  std::vector<PricedStep> steps;
  for (const HalvingStep& step : halving_doubling_schedule(bytes, 1, world, rank)) {
    steps.push_back({step.peer, step.role, static_cast<double>(step.send.count),
                     step.reduce ? static_cast<double>(step.recv.count) : 0.0});
  }
  return steps;
}

}  // namespace

CostTerms all_reduce_cost_terms(Algorithm algorithm, std::uint64_t bytes, const std::vector<int>& host_of) {
  RR_CHECK(!host_of.empty(), "the cost model needs at least one rank");
  int hosts_seen = 0;
  for (int host : host_of) {
    RR_CHECK(host >= 0 && host <= hosts_seen, "hosts are numbered 0, 1, ... in the order of their first rank; got ",
             host, " after ", hosts_seen, " hosts");
    hosts_seen = std::max(hosts_seen, host + 1);
  }
  std::vector<double> ranks_on(static_cast<std::size_t>(hosts_seen), 0.0);
  for (int host : host_of) ranks_on[host] += 1;
  const double n = static_cast<double>(bytes);
  const double world = static_cast<double>(host_of.size());
  const double hosts = static_cast<double>(hosts_seen);
  const double widest = *std::max_element(ranks_on.begin(), ranks_on.end());
  const double narrowest = *std::min_element(ranks_on.begin(), ranks_on.end());
  CostTerms terms;
  if (algorithm != Algorithm::Doubling) {
    terms.link_messages = static_cast<double>(doubling_schedule(static_cast<int>(world), 0).size());  // the check
  }
  switch (algorithm) {
    case Algorithm::Ring: {
      // 2(N-1) steps of a 1/N chunk; a host's link carries the streams of its ranks whose next
      // rank is elsewhere (one, where a host's ranks are consecutive).
      std::vector<double> leaving(ranks_on.size(), 0.0);
      for (std::size_t r = 0; r < host_of.size(); ++r) {
        if (host_of[r] != host_of[(r + 1) % host_of.size()]) leaving[host_of[r]] += 1;
      }
      terms.link_messages += 2 * (world - 1);
      terms.link_bytes += 2 * (world - 1) / world * n * *std::max_element(leaving.begin(), leaving.end());
      terms.reduced_bytes += (world - 1) / world * n;
      break;
    }
    case Algorithm::Central:
      // Rank 0 takes in every other buffer, then sends the sum back to each: two rounds (its
      // messages to and from different ranks overlap), and its host's link carries the buffers of
      // the ranks on other hosts, in and then out.
      terms.link_messages += 2;
      terms.link_bytes += 2 * (world - ranks_on[host_of[0]]) * n;
      terms.reduced_bytes += (world - 1) * n;
      break;
    case Algorithm::OneShot:
      // Every rank sends its buffer to every other at once: one round, and the widest host's link
      // carries its ranks' buffers to every rank elsewhere.
      terms.link_messages += 1;
      terms.link_bytes += widest * (world - widest) * n;
      terms.reduced_bytes += (world - 1) * n;
      break;
    case Algorithm::Hierarchical: {
      // Reduce-scatter inside each host into `widest` shards, one ring per shard across hosts (the
      // host's link carries all of them), all-gather inside each host. A rank of the narrowest
      // host holds the most shards.
      const double shards_held = std::ceil(widest / narrowest);
      terms.local_messages += 2 * (widest - 1);
      terms.local_bytes += 2 * (widest - 1) / widest * n;
      terms.link_messages += 2 * (hosts - 1);
      terms.link_bytes += 2 * (hosts - 1) / hosts * n;
      terms.reduced_bytes += (widest - 1) / widest * n + (hosts - 1) / hosts * shards_held / widest * n;
      break;
    }
    case Algorithm::Doubling:
      add_log_steps(terms, host_of, [&](int rank) { return doubling_steps(n, static_cast<int>(world), rank); });
      break;
    case Algorithm::HalvingDoubling:
      add_log_steps(terms, host_of,
                    [&](int rank) { return halving_doubling_steps(bytes, static_cast<int>(world), rank); });
      break;
    case Algorithm::Auto:
      RR_CHECK(false, "the cost model prices an algorithm, not auto");
  }
  return terms;
}

namespace {

constexpr std::size_t kRates = 5;
using RateVector = std::array<double, kRates>;

RateVector term_vector(const CostTerms& t) {
  return {t.link_messages, t.link_bytes, t.local_messages, t.local_bytes, t.reduced_bytes};
}
RateVector rate_vector(const CostRates& r) {
  return {r.link_latency_s, r.link_s_per_byte, r.local_latency_s, r.local_s_per_byte, r.reduce_s_per_byte};
}

// Solves the normal equations `matrix` x = `rhs` over the rates in `free` (Gaussian elimination with
// partial pivoting); the others are 0.
RateVector solve(const std::array<RateVector, kRates>& matrix, const RateVector& rhs,
                 const std::array<bool, kRates>& free) {
  std::vector<std::size_t> at;  // the free rates' places
  for (std::size_t j = 0; j < kRates; ++j) {
    if (free[j]) at.push_back(j);
  }
  const std::size_t n = at.size();
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1));  // [sub-matrix | rhs]
  for (std::size_t r = 0; r < n; ++r) {
    for (std::size_t c = 0; c < n; ++c) a[r][c] = matrix[at[r]][at[c]];
    a[r][n] = rhs[at[r]];
  }
  for (std::size_t col = 0; col < n; ++col) {
    std::size_t pivot = col;
    for (std::size_t r = col + 1; r < n; ++r) {
      if (std::fabs(a[r][col]) > std::fabs(a[pivot][col])) pivot = r;
    }
    std::swap(a[col], a[pivot]);
    for (std::size_t r = col + 1; r < n; ++r) {
      const double factor = a[r][col] / a[col][col];
      for (std::size_t c = col; c <= n; ++c) a[r][c] -= factor * a[col][c];
    }
  }
  RateVector x{};
  for (std::size_t col = n; col-- > 0;) {
    double sum = a[col][n];
    for (std::size_t c = col + 1; c < n; ++c) sum -= a[col][c] * x[at[c]];
    x[at[col]] = sum / a[col][col];
  }
  return x;
}

}  // namespace

CostRates fit_cost_rates(const std::vector<CostObservation>& observed, const CostRates& prior, double prior_weight) {
  const RateVector scale = rate_vector(prior);
  RR_CHECK(*std::min_element(scale.begin(), scale.end()) > 0 && prior_weight > 0,
           "the cost model's fit needs positive prior rates and weight");
  // In multiples of the prior: each column is the seconds a term contributes at the prior's rate.
  std::array<RateVector, kRates> matrix{};
  RateVector rhs{};
  for (const CostObservation& seen : observed) {
    if (!(seen.seconds > 0)) continue;
    RateVector row = term_vector(seen.terms);
    for (std::size_t j = 0; j < kRates; ++j) row[j] *= scale[j] / seen.seconds;
    for (std::size_t j = 0; j < kRates; ++j) {
      rhs[j] += row[j];
      for (std::size_t k = 0; k < kRates; ++k) matrix[j][k] += row[j] * row[k];
    }
  }
  for (std::size_t j = 0; j < kRates; ++j) {
    matrix[j][j] += prior_weight;
    rhs[j] += prior_weight;
  }
  std::array<bool, kRates> free;
  free.fill(true);
  RateVector multiple = solve(matrix, rhs, free);
  for (std::size_t round = 0; round < kRates; ++round) {
    const std::size_t lowest = static_cast<std::size_t>(std::min_element(multiple.begin(), multiple.end()) - multiple.begin());
    if (multiple[lowest] >= 0) break;
    free[lowest] = false;
    multiple = solve(matrix, rhs, free);
  }
  return {multiple[0] * scale[0], multiple[1] * scale[1], multiple[2] * scale[2], multiple[3] * scale[3],
          multiple[4] * scale[4]};
}

double predicted_seconds(const CostTerms& terms, const CostRates& rates) {
  return terms.link_messages * rates.link_latency_s + terms.link_bytes * rates.link_s_per_byte +
         terms.local_messages * rates.local_latency_s + terms.local_bytes * rates.local_s_per_byte +
         terms.reduced_bytes * rates.reduce_s_per_byte;
}

}  // namespace ringreduce
