// What an all-reduce across hosts costs, by algorithm: Hockney's alpha-beta model with a reduction
// term, per stage. An algorithm's schedule gives its terms (how many messages one after another,
// how many bytes through the busiest host link, ...); measured rates turn them into seconds.
// `python -m ringreduce.bench.model` fits the rates to the benchmark's rows across emulated hosts
// and predicts larger groups from them.
#pragma once

#include <cstdint>
#include <vector>

#include "core/header.h"

namespace ringreduce {

// The work on one all-reduce's critical path. Flat algorithms run every message on gloo's pairs,
// even between ranks of one host, so all their messages count as link messages; only the
// hierarchical one uses shared memory inside a host. The stages are summed: the hierarchical
// pipeline overlaps its local and link stages on large buffers, which the sum does not see.
struct CostTerms {
  double link_messages = 0;  // rounds of messages on the link transport, one after another
  double link_bytes = 0;     // bytes through the busiest host link in one direction, one after another
  double local_messages = 0; // rounds of shared-memory steps inside a host
  double local_bytes = 0;    // bytes one rank moves through shared memory
  double reduced_bytes = 0;  // bytes one rank reduces (the most any rank does)
};

// Seconds per unit of each term.
struct CostRates {
  double link_latency_s = 0;      // per round of link messages (alpha)
  double link_s_per_byte = 0;     // per byte through a host link (beta)
  double local_latency_s = 0;     // per shared-memory step
  double local_s_per_byte = 0;    // per byte through shared memory
  double reduce_s_per_byte = 0;   // per byte reduced (gamma)
};

// The terms of an all-reduce of `bytes` by `algorithm` (not Auto) where rank r is on host
// `host_of_rank[r]` (hosts numbered in the order of their first rank, as HostLayout does). Every
// algorithm but doubling pays for the call check's rounds first (agree_on_call); doubling carries
// it in its own messages.
CostTerms all_reduce_cost_terms(Algorithm algorithm, std::uint64_t bytes, const std::vector<int>& host_of_rank);

// The terms priced at `rates`, in seconds.
double predicted_seconds(const CostTerms& terms, const CostRates& rates);

// A measured call: what its schedule does, and how long it took.
struct CostObservation {
  CostTerms terms;
  double seconds = 0;
};

// The rates that best explain `observed`: least squares on each call's error relative to its time,
// each rate measured as a multiple of its `prior` (which must be positive), with a pull of
// `prior_weight` (in squared relative error) toward 1x on each, so that a rate the calls say nothing
// of stays at its prior. No rate negative: a rate the solution makes negative is held at 0 and the
// rest solved again.
CostRates fit_cost_rates(const std::vector<CostObservation>& observed, const CostRates& prior, double prior_weight);

}  // namespace ringreduce
