// Collectives for a group whose ranks span hosts, built from the pieces a single level uses: the
// ring's halves inside each host (shared memory), and the ring across hosts (the transport that
// spans them), one rank of each host per ring.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "algorithms/schedule.h"
#include "core/reducer.h"
#include "core/transport.h"
#include "hierarchy/host_layout.h"

namespace ringreduce {

// What a communicator whose group spans several hosts holds beside the transport that spans them.
struct HostTier {
  HostLayout layout;
  // This host's ranks, in layout order (rank i is ranks_of(host)[i]); null when the rank is alone on its host.
  std::unique_ptr<Transport> neighbours;
};

// Blocks a large buffer goes through the stages in: the link works on one block while this host
// reduces the next and gathers the previous one. At 64 MiB on 2 emulated hosts x 2 ranks (2 Gbit/s
// links, 512 KiB segments) the host stages took 14-25 ms each around the crossing when run one after
// the other, 321 ms in all; 16 MiB blocks gave 305 ms, 4 MiB blocks 295 (benchmarks/RESULTS.md).
constexpr std::size_t kHierarchicalBlockBytes = 4 << 20;

// The least a ring step across hosts carries in an all-reduce's block: a block of B bytes gives each
// of W ranks per host a shard of B/W, which a ring of H hosts crosses in H chunks of B/(W*H), and
// every message costs gloo a work object, a wake-up and its own round of TCP. On 8 emulated hosts x
// 2 ranks (2 Gbit/s) at 16 MiB, 4 MiB blocks (256 KiB steps) ran 1.00-1.16x gloo's speed, mean 1.10,
// and 16 MiB blocks (1 MiB steps) 1.08-1.30x, mean 1.23, over six runs each taken in turn, with
// about 16% less system time (benchmarks/RESULTS.md). So a block grows past kHierarchicalBlockBytes where
// its steps would carry less.
constexpr std::size_t kMinCrossingStepBytes = 1 << 20;

// Blocks of the reduce-scatter and all-gather in working memory at once: one crossing, one being
// reduced (or gathered) inside the host, one beside them so neither waits for the other's slot.
// Their working memory is these blocks whatever the buffer's size: 12 MiB.
constexpr std::size_t kHierarchicalStagedBlocks = 3;

// The default segment of the rings across hosts. Smaller than the pg transport's own 4 MiB: each
// ring there has only H ranks, and each segment's reduction and forward wait for its whole
// arrival, so large segments leave the link idle in between. At 64 MiB on 2 emulated hosts x 2 ranks
// (2 Gbit/s) the hierarchical all-reduce took 337-396 ms with 2-4 MiB segments, 311 with 1 MiB and
// 300-303 with 256-512 KiB (benchmarks/RESULTS.md).
constexpr std::size_t kHierarchicalSegmentBytes = 512 << 10;

// Rings of this many hosts or more take segments of kMinCrossingStepBytes instead: one message per
// ring step of an all-reduce's block, each message costing CPU (gloo's work object, its wake-up, a
// round of TCP), where the overlap that a second segment per step buys pays off only in short
// rings. On emulated hosts (2 Gbit/s) at 16 MiB: 8 x 2 ran 1.16-1.31x gloo's speed with 512 KiB
// segments (mean 1.24, five runs) and 1.34-1.45x with 1 MiB (mean 1.41; 2 MiB 1.28-1.38x, three
// runs), using less CPU; on 4 x 2 the two were even (1.15-1.17x and 1.13-1.14x); on 2 x 2 at 64 MiB
// 1 MiB segments were 9% slower (benchmarks/RESULTS.md).
constexpr int kLongRingHosts = 4;

// The default segment of the rings across the hosts of `layout`: kHierarchicalSegmentBytes, or
// kMinCrossingStepBytes in rings of kLongRingHosts hosts or more.
std::size_t hierarchical_segment_bytes(const HostLayout& layout);

// The blocks of `block_bytes` of an all-reduce of `numel` elements (parts = 1; one, possibly empty,
// at least); or, with `parts` chunks of `numel`, the runs of a chunk that make a block together with
// the same run of every other chunk (a reduce-scatter's or all-gather's).
std::vector<Span> hierarchical_blocks(std::size_t numel, std::size_t elem_size, int parts, std::size_t block_bytes);

// The block of an all-reduce over `layout`: kHierarchicalBlockBytes, or as much more as gives each
// ring step across hosts kMinCrossingStepBytes. The all-reduce works in place, so its blocks cost no
// working memory; the reduce-scatter's and all-gather's stay at kHierarchicalBlockBytes.
std::size_t hierarchical_all_reduce_block_bytes(const HostLayout& layout);

// The working memory of a hierarchical reduce-scatter or all-gather of chunks of `chunk_elems` over
// `layout` (HostLayout::column_slots of them, one per rank and one more for each rank a host lacks):
// kHierarchicalStagedBlocks blocks at most, whatever the chunks' size.
std::size_t hierarchical_staging_bytes(std::size_t chunk_elems, std::size_t elem_size, const HostLayout& layout);

// Hierarchical all-reduce (as Horovod's and Open MPI HAN's): the buffer is cut into one shard per
// rank of the widest host. Each host reduce-scatters the shards among its ranks, each rank then
// all-reduces its shards with the ranks that hold the same shards on the other hosts, one ring per
// shard, and each host all-gathers the results. Each host's link carries 2(H-1)/H of the buffer
// for H hosts, against 2(N-1)/N in a flat ring of N ranks, and every rank of a host brings its own
// flow across. Every element is reduced by one rank at each level and copied to the others, so
// every rank ends with the same bits. Large buffers are pipelined in blocks
// (hierarchical_all_reduce_block_bytes).
//
// With a `compression` (float32 SUM or AVG only) the rings across hosts carry compressed values
// (16-bit, or int8 blocks): a rank rounds its shard once to send it, each hop adds the arriving
// partial sum to the rank's own float32 values and rounds once (LinkReducer), and the owner of a
// chunk rounds its final sum, which is what every rank decodes. So a value is rounded once per
// host (H times), every rank still ends with the same bits, and the stages inside each host stay
// exact. Also where every host has one rank.
// A `residual` (float32 SUM, as many values as `data`) gains each rounding this rank made, where it
// made it: summed over the ranks, the residuals gain the exact sum minus the result (error feedback).
void hierarchical_all_reduce(Transport& across, HostTier& tier, const Reducer& reducer, void* data, std::size_t numel,
                             std::size_t segment_bytes, std::size_t lanes, Compression compression = Compression::None,
                             float* residual = nullptr);

// Hierarchical reduce-scatter (what FSDP and ZeRO call) where it moves fewer bytes across hosts
// (HostLayout::chunked_hierarchy_pays): the world chunks of `chunk_elems` are laid out by column in
// `staging` (HostLayout::column_position), each host reduce-scatters its columns among its ranks,
// and then the ranks of column j, one per host, reduce-scatter it across hosts, each ending with
// its own chunk. Where every host has k ranks, each host's link carries (H-1)/H of the buffer
// against (N-1)/N in a flat ring, and a rank makes (k-1)+(H-1) steps against N-1. A host with
// fewer ranks than the widest takes its columns in rounds and carries the missing ones across too.
// Pipelined in blocks as the all-reduce. `source` (every rank's chunk, in rank
// order) is only read; this rank's reduced chunk lands in `result` (chunk_elems elements). `staging`
// is hierarchical_staging_bytes() of working memory, apart from both. A `compression` compresses the
// rings across hosts as the all-reduce's (each value rounded once per host; the owner widens its
// final sum).
void hierarchical_reduce_scatter(Transport& across, HostTier& tier, const Reducer& reducer, const void* source,
                                 void* result, void* staging, std::size_t chunk_elems, std::size_t segment_bytes,
                                 std::size_t lanes, Compression compression = Compression::None);

// Hierarchical all-gather, the same in reverse: rank r's chunk r of `data` first crosses hosts in
// its column's ring, then each host all-gathers its columns, and the chunks go back to rank order
// in `data`. `staging` is hierarchical_staging_bytes() of working memory, apart from `data`.
void hierarchical_all_gather(Transport& across, HostTier& tier, std::size_t elem, void* data, void* staging,
                             std::size_t chunk_elems, std::size_t segment_bytes, std::size_t lanes);

}  // namespace ringreduce
