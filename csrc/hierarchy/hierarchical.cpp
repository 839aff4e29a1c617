#include "hierarchy/hierarchical.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/schedule.h"
#include "hierarchy/subset_transport.h"

namespace ringreduce {
namespace {

// One block of the buffer through the three stages. Stage 1 and 3 run on the caller's thread, over
// this host's transport; stage 2 over the transport that spans the hosts.
class Stages {
 public:
  Stages(Transport& across, HostTier& tier, const Reducer& reducer, std::size_t segment_bytes, std::size_t lanes)
      : across_(across),
        tier_(tier),
        reducer_(reducer),
        segment_bytes_(segment_bytes),
        lanes_(lanes),
        neighbours_(static_cast<int>(tier.layout.ranks_of(tier.layout.host_of(across.rank())).size())) {}

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
    for (int shard = layout.local_of(across_.rank()); shard < layout.widest(); shard += neighbours_) {
      const Span span = by_shard.chunk(shard);
      if (span.count == 0) continue;  // past the block's end, on every host alike
      std::vector<int> holders;
      for (int host = 0; host < layout.hosts(); ++host) holders.push_back(layout.shard_owner(host, shard));
      SubsetTransport ring(across_, std::move(holders));
      ring_all_reduce(ring, reducer_, block + span.offset * elem(), span.count, segment_bytes_, lanes_);
    }
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
    return shard_rounds(numel, elem(), tier_.layout.widest(), neighbours_, tier_.neighbours->default_segment_bytes());
  }

  Transport& across_;
  HostTier& tier_;
  const Reducer& reducer_;
  std::size_t segment_bytes_;
  std::size_t lanes_;
  int neighbours_;  // ranks on this rank's host
};

// The link thread's side of the pipeline: block b may cross once the host has reduced it, and may
// be gathered once it has crossed.
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

}  // namespace

std::vector<Span> hierarchical_blocks(std::size_t numel, std::size_t elem_size) {
  const std::size_t block = std::max<std::size_t>(1, kHierarchicalBlockBytes / elem_size);
  std::vector<Span> blocks;
  for (std::size_t offset = 0; offset < numel || blocks.empty(); offset += block) {
    blocks.push_back(Span{offset, std::min(block, numel - offset)});
  }
  return blocks;
}

void hierarchical_all_reduce(Transport& across, HostTier& tier, const Reducer& reducer, void* data, std::size_t numel,
                             std::size_t segment_bytes, std::size_t lanes) {
  const std::size_t elem = reducer.element_size();
  char* base = static_cast<char*>(data);
  Stages stages(across, tier, reducer, segment_bytes, lanes);
  const std::vector<Span> blocks = hierarchical_blocks(numel, elem);
  auto at = [&](const Span& block) { return base + block.offset * elem; };

  if (!tier.neighbours) {  // alone on this host: the link is all there is
    for (const Span& block : blocks) stages.reduce_across(at(block), block.count);
    return;
  }
  if (blocks.size() == 1) {
    stages.reduce_within(base, numel);
    stages.reduce_across(base, numel);
    stages.gather_within(base, numel);
    return;
  }

  // Several blocks: a link thread takes each block across as soon as the host has reduced it, while
  // this thread reduces the next ones and then gathers those that have crossed. The two threads use
  // different transports, and meet only here.
  Handoff handoff;
  std::thread link([&] {
    try {
      for (std::size_t b = 0; b < blocks.size(); ++b) {
        if (!handoff.wait_reduced(b)) return;
        stages.reduce_across(at(blocks[b]), blocks[b].count);
        handoff.crossed(b + 1);
      }
    } catch (...) {
      handoff.fail(std::current_exception());
    }
  });
  try {
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      stages.reduce_within(at(blocks[b]), blocks[b].count);
      handoff.reduced(b + 1);
    }
    for (std::size_t b = 0; b < blocks.size(); ++b) {
      handoff.wait_crossed(b);
      stages.gather_within(at(blocks[b]), blocks[b].count);
    }
  } catch (...) {
    // The link thread stops at its next block; the caller aborts the transports once it has.
    handoff.stop();
    link.join();
    throw;
  }
  link.join();
}

}  // namespace ringreduce
