#include <cstring>

#include "algorithms/algorithms.h"

namespace ringreduce {

void one_shot_all_reduce(Transport& transport, const Reducer& reducer, void* data, void* scratch, std::size_t numel) {
  const int world = transport.size();
  const int rank = transport.rank();
  RR_CHECK(transport.can_post_ahead(), "one_shot needs a transport that posts ahead; ", transport.name(),
           " does not (use ring or central)");
  if (world == 1 || numel == 0) return;
  const std::size_t bytes = numel * reducer.element_size();

  // Step 1: every peer gets this rank's whole buffer.
  std::vector<Request> sends;
  for (int peer = 0; peer < world; ++peer) {
    if (peer != rank) sends.push_back(transport.isend(peer, data, bytes));
  }
  // Step 2: fold the N contributions into `scratch` in rank order, the same order on every rank,
  // so every rank ends with the same bits. Rank 0's contribution lands first; each later one is
  // reduced in as its receive is waited for.
  std::vector<Request> contributions(world);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    contributions[peer] = peer == 0 ? transport.irecv(0, scratch, bytes)
                                    : transport.irecv_reduce(peer, scratch, bytes, reducer, peer == world - 1);
  }
  for (int peer = 0; peer < world; ++peer) {
    if (peer != rank) {
      transport.wait(contributions[peer]);
    } else if (rank == 0) {
      std::memcpy(scratch, data, bytes);
    } else {
      reducer.reduce(scratch, data, numel, rank == world - 1);
    }
  }
  // Step 3: the result replaces the input once every peer has its copy of the input.
  for (Request send : sends) transport.wait(send);
  std::memcpy(data, scratch, bytes);
}

}  // namespace ringreduce
