// A probe for the tests: the NCCL-style exchange groups one rank hands over in a whole all-reduce,
// traced through the real algorithms.
#pragma once

#include <cstddef>
#include <vector>

namespace ringreduce {

// One transfer of a group as a transport hands it over.
struct TracedTransfer {
  bool is_send;
  int peer;
  std::size_t bytes;
};

// The groups rank `rank` of `world` hands over, in order, for one float32 all-reduce of `numel`
// elements (`ring`, else the central reducer at root 0; numel 0 makes the empty exchange), traced
// through a transport that groups like the nccl one. Lets tests check on any machine that every
// rank's groups match its peers' and cannot deadlock.
std::vector<std::vector<TracedTransfer>> trace_exchange_groups(std::size_t numel, int world, int rank,
                                                               std::size_t segment_bytes, std::size_t lanes,
                                                               bool ring);

}  // namespace ringreduce
