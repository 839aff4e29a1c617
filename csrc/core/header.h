// The call header every rank compares before moving data. Plain data, usable in device code (the
// GPU compares headers in a kernel), so no standard-library types.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace ringreduce {

// The all-reduce algorithms; a reduce-scatter or all-gather runs Ring or Hierarchical. Auto is never
// run: the communicator resolves it to one of the others (engine/auto_choice.h) before the header
// is made. Hierarchical runs only on a group that spans hosts (csrc/hierarchy/). Doubling is
// recursive doubling, the log-step algorithm, and HalvingDoubling Rabenseifner's reduce-scatter by
// halving and all-gather by doubling (algorithms/algorithms.h).
enum class Algorithm : int { Ring, Central, OneShot, Hierarchical, Doubling, HalvingDoubling, Auto };

// One-shot and the log-step algorithms run on host memory only.
inline bool host_memory_only(Algorithm algorithm) {
  return algorithm == Algorithm::OneShot || algorithm == Algorithm::Doubling || algorithm == Algorithm::HalvingDoubling;
}

// The format an all-reduce's values take on the link between hosts (None: they cross as they
// are): 16-bit floats, or int8 with a scale per block. Only that ring is compressed; the stages
// inside each host stay in the buffer's dtype.
enum class Compression : int { None, BFloat16, Float16, Int8 };

// The collectives the engine runs.
enum class Collective : int { AllReduce, ReduceScatter, AllGather, Broadcast, Reduce };

// The ring's halves: `world` chunks, one per rank.
inline bool is_chunked(Collective collective) {
  return collective == Collective::ReduceScatter || collective == Collective::AllGather;
}

// What every rank must agree on for one collective. It travels with the first message to each
// peer (in a slot header, a message descriptor, or a small message of its own) and is compared on
// arrival, before any data is touched.
struct CollectiveHeader {
  std::uint64_t sequence = 0;  // collectives issued on this communicator before this one
  std::uint64_t numel = 0;
  std::uint64_t segment_bytes = 0;  // pipeline segment size of the call
  std::int32_t root = 0;            // central reducer only
  std::uint8_t dtype = 0;
  std::uint8_t op = 0;
  std::uint8_t algorithm = 0;
  std::uint8_t lanes = 1;      // pipeline lanes of the ring (RINGREDUCE_LANES)
  std::uint8_t collective = 0;  // Collective
  std::uint8_t compression = 0;  // Compression

  // The root matters to the central reducer, a broadcast and a reduce.
  RR_HOST_DEVICE bool has_root() const {
    return algorithm == static_cast<std::uint8_t>(Algorithm::Central) ||
           collective == static_cast<std::uint8_t>(Collective::Broadcast) ||
           collective == static_cast<std::uint8_t>(Collective::Reduce);
  }

  RR_HOST_DEVICE bool operator==(const CollectiveHeader& other) const {
    return sequence == other.sequence && numel == other.numel && segment_bytes == other.segment_bytes &&
           dtype == other.dtype && op == other.op && algorithm == other.algorithm && lanes == other.lanes &&
           collective == other.collective && compression == other.compression &&
           (!has_root() || root == other.root);
  }
  RR_HOST_DEVICE bool operator!=(const CollectiveHeader& other) const { return !(*this == other); }
};

}  // namespace ringreduce
