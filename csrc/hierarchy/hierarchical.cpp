#include "hierarchy/hierarchical.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/schedule.h"
#include "cpu/reducer.h"
#include "hierarchy/subset_transport.h"

namespace ringreduce {
namespace {

// The ring across hosts that carries shard (or column) `shard`: one rank of each host, in host order.
SubsetTransport shard_ring(Transport& across, const HostLayout& layout, int shard) {
  std::vector<int> holders;
  for (int host = 0; host < layout.hosts(); ++host) holders.push_back(layout.shard_owner(host, shard));
  return SubsetTransport(across, std::move(holders));
}

// The compressed copy of a shard that a ring between hosts runs on (LinkReducer), in the codec's
// elements (a value each, or a block of values), kept for the blocks after.
class Wire {
 public:
  Wire() = default;  // uncompressed
  Wire(Compression compression, const Reducer& reducer, int world)
      : compression_(compression),
        codec_(compression == Compression::None ? nullptr : &link_codec(compression)),
        op_(reducer.op()),
        world_(world) {
    RR_CHECK(compression == Compression::None || reducer.dtype() == DType::Float32,
             "the link between hosts compresses float32 only, not ", dtype_name(reducer.dtype()));
  }

  bool compressed() const { return codec_ != nullptr; }
  // Whether each element carries one value, so that any run of values is a run of elements.
  bool per_value() const { return codec_ == nullptr || codec_->values_per_element == 1; }
  std::size_t element_bytes() const { return codec_->element_bytes; }
  // The elements that carry `count` values.
  std::size_t elements(std::size_t count) const {
    return (count + codec_->values_per_element - 1) / codec_->values_per_element;
  }

  // The wire for `count` values, with what `transfers` (this rank's part of the ring, in elements)
  // send as they are rounded into it: every other element is written by a reduction or a copy
  // before it is read. A `residual` (as long as `values`) gains every rounding error of this rank's.
  void* load(const float* values, std::size_t count, const std::vector<RingTransfer>& transfers, float* residual) {
    count_ = count;
    residual_ = residual;
    bytes_.resize(std::max(bytes_.size(), elements(count) * element_bytes()));
    for (const RingTransfer& t : transfers) {
      if (!t.send_own) continue;
      const std::size_t first = first_value(t.send);
      codec_->encode(at(t.send), values + first, values_in(t.send));
      if (residual != nullptr) {
        keep_rounding_error(*codec_, residual + first, values + first, nullptr, at(t.send), values_in(t.send));
      }
    }
    return bytes_.data();
  }
  // The reducer of the ring on the wire, adding `values` (what load() was given).
  LinkReducer reducer(const float* values) const {
    return LinkReducer(compression_, op_, world_, bytes_.data(), values, count_, residual_);
  }
  // Widens the elements `span` of the finished wire back into `values`.
  void unload(float* values, Span span) const {
    codec_->decode(values + first_value(span), at(span), values_in(span));
  }

 private:
  std::size_t first_value(Span elements) const { return std::min(count_, elements.offset * codec_->values_per_element); }
  std::size_t values_in(Span elements) const {
    return std::min(count_, (elements.offset + elements.count) * codec_->values_per_element) - first_value(elements);
  }
  unsigned char* at(Span elements) { return bytes_.data() + elements.offset * element_bytes(); }
  const unsigned char* at(Span elements) const { return bytes_.data() + elements.offset * element_bytes(); }

  Compression compression_ = Compression::None;
  const LinkCodec* codec_ = nullptr;
  ReduceOp op_ = ReduceOp::Sum;
  int world_ = 0;
  std::size_t count_ = 0;  // values on the wire now
  float* residual_ = nullptr;  // load()'s
  std::vector<unsigned char> bytes_;
};

// One block of the buffer through the three stages. Stage 1 and 3 run on the caller's thread, over
// this host's transport; stage 2 over the transport that spans the hosts.
class Stages {
 public:
  Stages(Transport& across, HostTier& tier, const Reducer& reducer, std::size_t segment_bytes, std::size_t lanes,
         Compression compression, const char* data, float* residual)
      : across_(across),
        tier_(tier),
        reducer_(reducer),
        segment_bytes_(segment_bytes),
        lanes_(lanes),
        neighbours_(static_cast<int>(tier.layout.ranks_of(tier.layout.host_of(across.rank())).size())),
        wire_(compression, reducer, tier.layout.world()),
        data_(data),
        residual_(residual) {}

  // Stage 1, inside the host: a reduce-scatter per round of shards leaves this rank with its shards
  // of the block reduced over the host. The elements' last reductions come across hosts.
  void reduce_within(char* block, std::size_t numel) {
    for (const ShardRound& round : rounds(numel)) {
      ring_reduce_scatter(*tier_.neighbours, reducer_, block + round.offset * elem(), round.layout, within_lanes(),
                          /*finishes=*/false);
    }
  }

  // Stage 2, across hosts: each shard this rank holds is all-reduced with the ranks that hold it on
  // the other hosts, one ring per shard. Every rank takes its shards in ascending order, so rings
  // that share a rank (a smaller host's rank carries several shards) meet in the same order everywhere.
  void reduce_across(char* block, std::size_t numel) {
    const HostLayout& layout = tier_.layout;
    const SegmentLayout by_shard = segment_layout(numel, elem(), layout.widest(), segment_bytes_);
    for (const int shard : layout.shards_of(across_.rank())) {
      const Span span = by_shard.chunk(shard);
      if (span.count == 0) continue;  // past the block's end, on every host alike
      SubsetTransport ring = shard_ring(across_, layout, shard);
      char* values = block + span.offset * elem();
      if (wire_.compressed()) {
        reduce_across_compressed(ring, reinterpret_cast<float*>(values), span.count);
      } else {
        ring_all_reduce(ring, reducer_, values, span.count, segment_bytes_, lanes_);
      }
    }
  }

  // One shard's ring across hosts compressed: what this rank sends of its own rounded once, one
  // rounding per hop, and every rank widens the same final bits into `values`.
  void reduce_across_compressed(Transport& ring, float* values, std::size_t count) {
    const std::size_t elements = wire_.elements(count);
    float* residual =
        residual_ == nullptr ? nullptr : residual_ + (reinterpret_cast<const char*>(values) - data_) / sizeof(float);
    const std::vector<RingTransfer> transfers =
        ring_schedule(elements, wire_.element_bytes(), ring.size(), ring.rank(), segment_bytes_, lanes_);
    void* wire = wire_.load(values, count, transfers, residual);
    ring_all_reduce(ring, wire_.reducer(values), wire, elements, segment_bytes_, lanes_);
    wire_.unload(values, Span{0, elements});
  }

  // Stage 3, inside the host: the finished shards reach every rank of the host.
  void gather_within(char* block, std::size_t numel) {
    for (const ShardRound& round : rounds(numel)) {
      ring_all_gather(*tier_.neighbours, elem(), block + round.offset * elem(), round.layout, within_lanes());
    }
  }

 private:
  std::size_t elem() const { return reducer_.element_size(); }
  std::size_t within_lanes() const { return std::min(lanes_, tier_.neighbours->max_lanes()); }
  std::vector<ShardRound> rounds(std::size_t numel) const {
    const std::size_t segment_bytes = tier_.neighbours->default_segment_bytes();
    const int shards = tier_.layout.widest();
    return shard_rounds(numel, segment_layout(numel, elem(), shards, segment_bytes).chunk_elems, elem(), shards,
                        neighbours_, segment_bytes);
  }

  Transport& across_;
  HostTier& tier_;
  const Reducer& reducer_;
  std::size_t segment_bytes_;
  std::size_t lanes_;
  int neighbours_;  // ranks on this rank's host
  Wire wire_;
  const char* data_;  // the whole buffer, where residual_ starts too
  float* residual_;   // null: rounding errors dropped
};

// Where the two threads of a pipeline meet: block b may cross once the host has done its first part
// ("reduced"), and the host may do its last part once the block has crossed.
class Handoff {
 public:
  void reduced(std::size_t blocks) { set(reduced_, blocks); }
  void crossed(std::size_t blocks) { set(crossed_, blocks); }
  // Whether block b is reduced; false when the caller gave up.
  bool wait_reduced(std::size_t block) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return reduced_ > block || stopped_; });
    return !stopped_;
  }
  // Returns once block b has crossed; rethrows what stopped the link thread.
  void wait_crossed(std::size_t block) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return crossed_ > block || failed_; });
    if (failed_) std::rethrow_exception(failed_);
  }
  void fail(std::exception_ptr error) {
    const std::lock_guard<std::mutex> lock(mutex_);
    failed_ = error;
    changed_.notify_all();
  }
  void stop() {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
    changed_.notify_all();
  }

 private:
  void set(std::size_t& counter, std::size_t blocks) {
    const std::lock_guard<std::mutex> lock(mutex_);
    counter = blocks;
    changed_.notify_all();
  }
  std::mutex mutex_;
  std::condition_variable changed_;
  std::size_t reduced_ = 0;
  std::size_t crossed_ = 0;
  bool stopped_ = false;
  std::exception_ptr failed_;
};

// Runs the stages of every block: `before(b)` on this thread, block after block; `cross(b)` on a
// link thread as soon as before(b) is done; `after(b)` on this thread as soon as cross(b) is done.
// At most `window` blocks are between before() and after() at once: before(b) waits for
// after(b - window), so working memory of `window` blocks serves any number of them. The link works
// on one block while this host works on others. The two threads use different transports and meet
// only here; an error in either stops both, and the link thread is joined before it is raised, so
// the caller may abort the transports. Every rank of a host runs its stages in the same order.
void pipeline(std::size_t blocks, std::size_t window, const std::function<void(std::size_t)>& before,
              const std::function<void(std::size_t)>& cross, const std::function<void(std::size_t)>& after) {
  if (blocks == 1) {
    before(0);
    cross(0);
    after(0);
    return;
  }
  Handoff handoff;
  std::thread link([&] {
    try {
      for (std::size_t b = 0; b < blocks; ++b) {
        if (!handoff.wait_reduced(b)) return;
        cross(b);
        handoff.crossed(b + 1);
      }
    } catch (...) {
      handoff.fail(std::current_exception());
    }
  });
  try {
    std::size_t finished = 0;  // blocks through after()
    auto finish_one = [&] {
      handoff.wait_crossed(finished);
      after(finished++);
    };
    for (std::size_t b = 0; b < blocks; ++b) {
      if (b >= finished + window) finish_one();
      before(b);
      handoff.reduced(b + 1);
    }
    while (finished < blocks) finish_one();
  } catch (...) {
    handoff.stop();  // the link thread stops at its next block
    link.join();
    throw;
  }
  link.join();
}

Transport& host_transport(HostTier& tier) {
  RR_CHECK(tier.layout.chunked_hierarchy_pays() && tier.neighbours, "the hierarchical reduce-scatter and all-gather "
           "run where they move fewer bytes across hosts than the ring; this group is ", tier.layout.describe());
  return *tier.neighbours;
}

// The hierarchical reduce-scatter's and all-gather's blocks: block b is the same run of elements
// of every rank's chunk, laid out by column (HostLayout::column_position) in slot b % slots of
// `staging`. Stage by stage, a block is a small reduce-scatter or all-gather of its own. A host
// with fewer ranks than the widest has runs in its columns that belong to no rank: its ranks take
// the columns in rounds inside the host and each carries several across, those runs among them
// (holding zeros) to reach no rank's result.
class Columns {
 public:
  Columns(Transport& across, HostTier& tier, std::size_t chunk_elems, std::size_t elem, void* data, void* staging,
          std::size_t segment_bytes, std::size_t lanes, Wire wire = Wire())
      : across_(across),
        layout_(tier.layout),
        within_(host_transport(tier)),
        elem_(elem),
        chunk_elems_(chunk_elems),
        data_(static_cast<char*>(data)),
        staging_(static_cast<char*>(staging)),
        segment_bytes_(segment_bytes),
        lanes_(lanes),
        blocks_(hierarchical_blocks(chunk_elems, elem, layout_.column_slots(), kHierarchicalBlockBytes)),
        wire_(std::move(wire)) {}

  std::size_t blocks() const { return blocks_.size(); }

  // Every rank's run of block b, from `from` (rank order, `data` or an input) into column order.
  void to_columns(std::size_t b, const char* from) {
    for (int rank = 0; rank < layout_.world(); ++rank) std::memcpy(in_columns(b, rank), from + in_ranks(b, rank), bytes(b));
    zero_runs_of_no_rank(b);
  }
  // Every rank's run of block b back into rank order in `data`.
  void to_ranks(std::size_t b) {
    for (int rank = 0; rank < layout_.world(); ++rank) std::memcpy(data_ + in_ranks(b, rank), in_columns(b, rank), bytes(b));
  }
  // This rank's own run of block b, from `data` into the staging, or from there into `result`
  // (this rank's chunk).
  void mine_to_columns(std::size_t b) {
    std::memcpy(in_columns(b, me()), data_ + in_ranks(b, me()), bytes(b));
    zero_runs_of_no_rank(b);
  }
  void mine_to_result(std::size_t b, char* result) {
    std::memcpy(result + blocks_[b].offset * elem_, in_columns(b, me()), bytes(b));
  }

  // Inside the host, a round of columns at a time (HostLayout::shard_owner): each rank ends with its
  // columns of block b summed over the host (not finished: the hosts' sums come next), or every
  // column reaches every rank of the host.
  void reduce_within(std::size_t b, const Reducer& reducer) {
    for (const ShardRound& round : within_rounds(b)) {
      ring_reduce_scatter(within_, reducer, block(b) + round.offset * elem_, round.layout, within_lanes(),
                          /*finishes=*/false);
    }
  }
  void gather_within(std::size_t b) {
    for (const ShardRound& round : within_rounds(b)) {
      ring_all_gather(within_, elem_, block(b) + round.offset * elem_, round.layout, within_lanes());
    }
  }

  // Across hosts, each column this rank carries in ascending order (as every rank, so that rings
  // sharing a rank meet in the same order): its ranks, one per host, reduce-scatter it (host h's
  // rank ending with host h's run: its own in its own column), or gather it. Compressed, the ring
  // runs on the wire and only this rank's run is widened back.
  void reduce_across(std::size_t b, const Reducer& reducer) {
    for (const int column : layout_.shards_of(me())) {
      SubsetTransport ring = shard_ring(across_, layout_, column);
      if (!wire_.compressed()) {
        ring_reduce_scatter(ring, reducer, column_of(b, column), across_layout(b), lanes_, /*finishes=*/true);
        continue;
      }
      // A host's run is a run of elements only where each element carries one value.
      RR_CHECK(wire_.per_value(), "a reduce-scatter compresses to 16-bit values only");
      float* values = reinterpret_cast<float*>(column_of(b, column));
      const SegmentLayout on_wire =
          chunk_layout(blocks_[b].count, wire_.element_bytes(), layout_.hosts(), segment_bytes_);
      void* wire = wire_.load(values, on_wire.numel,
                              ring_schedule(on_wire, ring.size(), ring.rank(), lanes_, RingPhases::ReduceScatter),
                              /*residual=*/nullptr);
      ring_reduce_scatter(ring, wire_.reducer(values), wire, on_wire, lanes_, /*finishes=*/true);
      wire_.unload(values, on_wire.chunk(ring.rank()));
    }
  }
  void gather_across(std::size_t b) {
    for (const int column : layout_.shards_of(me())) {
      SubsetTransport ring = shard_ring(across_, layout_, column);
      ring_all_gather(ring, elem_, column_of(b, column), across_layout(b), lanes_);
    }
  }

 private:
  int me() const { return across_.rank(); }
  // The runs of block b that belong to no rank (a host short of ranks) carry zeros rather than what
  // the slot last held: the sums they end as reach no result, and what crosses hosts stays defined.
  void zero_runs_of_no_rank(std::size_t b) {
    for (int host = 0; host < layout_.hosts(); ++host) {
      for (int column = static_cast<int>(layout_.ranks_of(host).size()); column < layout_.widest(); ++column) {
        std::memset(column_of(b, column) + static_cast<std::size_t>(host) * bytes(b), 0, bytes(b));
      }
    }
  }
  std::size_t bytes(std::size_t b) const { return blocks_[b].count * elem_; }
  char* block(std::size_t b) const { return staging_ + (b % kHierarchicalStagedBlocks) * slot_bytes(); }
  std::size_t slot_bytes() const { return blocks_[0].count * layout_.column_slots() * elem_; }
  char* in_columns(std::size_t b, int rank) const {
    return block(b) + static_cast<std::size_t>(layout_.column_position(rank)) * bytes(b);
  }
  char* column_of(std::size_t b, int column) const {
    return block(b) + static_cast<std::size_t>(column) * layout_.hosts() * bytes(b);
  }
  // Where rank r's run of block b sits in rank order, in bytes.
  std::size_t in_ranks(std::size_t b, int rank) const {
    return (static_cast<std::size_t>(rank) * chunk_elems_ + blocks_[b].offset) * elem_;
  }
  std::vector<ShardRound> within_rounds(std::size_t b) const {
    const std::size_t column_elems = blocks_[b].count * layout_.hosts();
    return shard_rounds(column_elems * layout_.widest(), column_elems, elem_, layout_.widest(), within_.size(),
                        within_.default_segment_bytes());
  }
  SegmentLayout across_layout(std::size_t b) const {
    return chunk_layout(blocks_[b].count, elem_, layout_.hosts(), segment_bytes_);
  }
  std::size_t within_lanes() const { return std::min(lanes_, within_.max_lanes()); }

  Transport& across_;
  const HostLayout& layout_;
  Transport& within_;
  std::size_t elem_;
  std::size_t chunk_elems_;
  char* data_;  // an all-gather's buffer, every chunk in rank order
  char* staging_;
  std::size_t segment_bytes_;
  std::size_t lanes_;
  std::vector<Span> blocks_;  // runs of a chunk
  Wire wire_;                 // a compressed reduce-scatter's
};

}  // namespace

std::vector<Span> hierarchical_blocks(std::size_t numel, std::size_t elem_size, int parts, std::size_t block_bytes) {
  const std::size_t block = std::max<std::size_t>(1, block_bytes / elem_size / static_cast<std::size_t>(parts));
  std::vector<Span> blocks;
  for (std::size_t offset = 0; offset < numel || blocks.empty(); offset += block) {
    blocks.push_back(Span{offset, std::min(block, numel - offset)});
  }
  return blocks;
}

std::size_t hierarchical_segment_bytes(const HostLayout& layout) {
  return layout.hosts() >= kLongRingHosts ? kMinCrossingStepBytes : kHierarchicalSegmentBytes;
}

std::size_t hierarchical_all_reduce_block_bytes(const HostLayout& layout) {
  const std::size_t steps = static_cast<std::size_t>(layout.widest()) * static_cast<std::size_t>(layout.hosts());
  return std::max(kHierarchicalBlockBytes, steps * kMinCrossingStepBytes);
}

void hierarchical_all_reduce(Transport& across, HostTier& tier, const Reducer& reducer, void* data, std::size_t numel,
                             std::size_t segment_bytes, std::size_t lanes, Compression compression,
                             float* residual) {
  const std::size_t elem = reducer.element_size();
  char* base = static_cast<char*>(data);
  Stages stages(across, tier, reducer, segment_bytes, lanes, compression, base, residual);
  const std::vector<Span> blocks =
      hierarchical_blocks(numel, elem, /*parts=*/1, hierarchical_all_reduce_block_bytes(tier.layout));
  auto at = [&](std::size_t b) { return base + blocks[b].offset * elem; };
  if (!tier.neighbours) {  // alone on this host: the link is all there is
    for (std::size_t b = 0; b < blocks.size(); ++b) stages.reduce_across(at(b), blocks[b].count);
    return;
  }
  pipeline(
      blocks.size(), /*window=*/blocks.size(), [&](std::size_t b) { stages.reduce_within(at(b), blocks[b].count); },
      [&](std::size_t b) { stages.reduce_across(at(b), blocks[b].count); },
      [&](std::size_t b) { stages.gather_within(at(b), blocks[b].count); });
}

std::size_t hierarchical_staging_bytes(std::size_t chunk_elems, std::size_t elem_size, const HostLayout& layout) {
  const int slots = layout.column_slots();
  const std::vector<Span> blocks = hierarchical_blocks(chunk_elems, elem_size, slots, kHierarchicalBlockBytes);
  return std::min(blocks.size(), kHierarchicalStagedBlocks) * blocks[0].count * static_cast<std::size_t>(slots) *
         elem_size;
}

void hierarchical_reduce_scatter(Transport& across, HostTier& tier, const Reducer& reducer, const void* source,
                                 void* result, void* staging, std::size_t chunk_elems, std::size_t segment_bytes,
                                 std::size_t lanes, Compression compression) {
  Columns columns(across, tier, chunk_elems, reducer.element_size(), /*data=*/nullptr, staging, segment_bytes, lanes,
                  Wire(compression, reducer, tier.layout.world()));
  const char* input = static_cast<const char*>(source);
  pipeline(
      columns.blocks(), kHierarchicalStagedBlocks,
      [&](std::size_t b) {
        columns.to_columns(b, input);
        columns.reduce_within(b, reducer);
      },
      [&](std::size_t b) {
        columns.reduce_across(b, reducer);
        columns.mine_to_result(b, static_cast<char*>(result));
      },
      [](std::size_t) {});
}

void hierarchical_all_gather(Transport& across, HostTier& tier, std::size_t elem, void* data, void* staging,
                             std::size_t chunk_elems, std::size_t segment_bytes, std::size_t lanes) {
  Columns columns(across, tier, chunk_elems, elem, data, staging, segment_bytes, lanes);
  pipeline(
      columns.blocks(), kHierarchicalStagedBlocks, [](std::size_t) {},
      [&](std::size_t b) {
        columns.mine_to_columns(b);
        columns.gather_across(b);
      },
      [&](std::size_t b) {
        columns.gather_within(b);
        columns.to_ranks(b);
      });
}

}  // namespace ringreduce
