#include "algorithms/schedule.h"

#include <algorithm>
#include <optional>

#include "core/common.h"

namespace ringreduce {
namespace {

std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

int wrap(int value, int world) { return ((value % world) + world) % world; }

}  // namespace

Span SegmentLayout::segment(int chunk, std::size_t index) const {
  const Span whole = this->chunk(chunk);
  const std::size_t chunk_end = whole.offset + whole.count;
  const std::size_t begin = std::min(chunk_end, whole.offset + index * segment_elems);
  const std::size_t end = std::min(chunk_end, begin + segment_elems);
  return Span{begin, end - begin};
}

Span SegmentLayout::chunk(int chunk) const {
  const std::size_t begin = std::min(numel, static_cast<std::size_t>(chunk) * chunk_elems);
  return Span{begin, std::min(numel, begin + chunk_elems) - begin};
}

SegmentLayout segment_layout(std::size_t numel, std::size_t elem_size, int world, std::size_t segment_bytes) {
  RR_CHECK(world >= 1, "world size must be at least 1, got ", world);
  RR_CHECK(elem_size >= 1, "element size must be at least 1");
  RR_CHECK(segment_bytes >= 1, "segment size must be at least 1 byte");
  SegmentLayout layout;
  layout.numel = numel;
  const std::size_t align = std::max<std::size_t>(1, kChunkAlignBytes / elem_size);
  layout.chunk_elems = ceil_div(ceil_div(numel, world), align) * align;
  layout.segment_elems = std::max<std::size_t>(1, segment_bytes / elem_size);
  if (layout.segment_elems >= align) layout.segment_elems -= layout.segment_elems % align;
  layout.segments_per_chunk = ceil_div(layout.chunk_elems, layout.segment_elems);
  return layout;
}

SegmentLayout chunk_layout(std::size_t chunk_elems, std::size_t elem_size, int world, std::size_t segment_bytes) {
  SegmentLayout layout = segment_layout(chunk_elems * static_cast<std::size_t>(world), elem_size, world, segment_bytes);
  layout.chunk_elems = chunk_elems;
  layout.segments_per_chunk = ceil_div(chunk_elems, layout.segment_elems);
  return layout;
}

std::vector<ShardRound> shard_rounds(std::size_t numel, std::size_t shard_elems, std::size_t elem_size, int shards,
                                     int neighbours, std::size_t segment_bytes) {
  RR_CHECK(neighbours >= 1 && neighbours <= shards, "a host of ", neighbours, " ranks cannot split ", shards, " shards");
  std::vector<ShardRound> rounds;
  for (int first = 0; first < shards; first += neighbours) {
    ShardRound round;
    round.offset = std::min(numel, static_cast<std::size_t>(first) * shard_elems);
    round.layout = chunk_layout(shard_elems, elem_size, neighbours, segment_bytes);
    // Shards past the round's last, and past the buffer's end, are empty.
    const int in_round = std::min(neighbours, shards - first);
    round.layout.numel = std::min(numel, round.offset + static_cast<std::size_t>(in_round) * shard_elems) - round.offset;
    rounds.push_back(round);
  }
  return rounds;
}

std::vector<RingTransfer> ring_schedule(const SegmentLayout& layout, int world, int rank, std::size_t lanes,
                                        RingPhases phases) {
  RR_CHECK(rank >= 0 && rank < world, "rank ", rank, " is outside a world of ", world);
  RR_CHECK(lanes >= 1, "a ring needs at least one lane");
  std::vector<RingTransfer> transfers;
  if (world == 1) return transfers;
  const bool scatter = phases != RingPhases::AllGather;
  const bool gather = phases != RingPhases::ReduceScatter;
  // The chunk this rank owns between the halves.
  const int owned = phases == RingPhases::AllReduce ? rank + 1 : rank;
  const int first_step = scatter ? 0 : world - 1;
  const int steps = gather ? 2 * (world - 1) : world - 1;
  transfers.reserve((steps - first_step) * layout.segments_per_chunk);
  // Segments overlap in flight through the transport's slots, as slices do in NCCL's ring, and,
  // with several lanes, through the lanes: while one segment is reduced, the next one travels.
  for (std::size_t first = 0; first < layout.segments_per_chunk; first += lanes) {
    const std::size_t group_end = std::min(layout.segments_per_chunk, first + lanes);
    for (int step = first_step; step < steps; ++step) {
      for (std::size_t seg = first; seg < group_end; ++seg) {
        RingTransfer t;
        t.lane = seg - first;
        if (step < world - 1) {
          // Reduce-scatter, step s: pass on chunk owned-1-s (own data at s = 0, a partial sum
          // after), receive chunk owned-2-s and reduce it. After world-1 steps rank r holds the
          // result of chunk `owned`.
          t.send = layout.segment(wrap(owned - 1 - step, world), seg);
          t.recv = layout.segment(wrap(owned - 2 - step, world), seg);
          t.reduce = true;
          t.last = step == world - 2;
        } else {
          // All-gather, step s: pass on chunk owned-s (the owned result at s = 0, a copy after),
          // receive the finished chunk owned-1-s in place.
          const int s = step - (world - 1);
          t.send = layout.segment(wrap(owned - s, world), seg);
          t.recv = layout.segment(wrap(owned - 1 - s, world), seg);
        }
        t.send_own = step == first_step;
        t.forward = step < steps - 1;  // a segment's last step keeps what it gets
        transfers.push_back(t);
      }
    }
  }
  return transfers;
}

std::vector<RingTransfer> ring_schedule(std::size_t numel, std::size_t elem_size, int world, int rank,
                                        std::size_t segment_bytes, std::size_t lanes) {
  return ring_schedule(segment_layout(numel, elem_size, world, segment_bytes), world, rank, lanes,
                       RingPhases::AllReduce);
}

std::vector<Span> central_schedule(std::size_t numel, std::size_t elem_size, std::size_t segment_bytes) {
  const SegmentLayout layout = segment_layout(numel, elem_size, 1, segment_bytes);
  std::vector<Span> spans;
  spans.reserve(layout.segments_per_chunk);
  for (std::size_t seg = 0; seg < layout.segments_per_chunk; ++seg) {
    const Span span = layout.segment(0, seg);
    if (span.count > 0) spans.push_back(span);
  }
  return spans;
}

std::vector<DoublingStep> doubling_schedule(int world, int rank) {
  int rounds_span = 1;  // the largest power of two not above world
  while (rounds_span * 2 <= world) rounds_span *= 2;
  std::vector<DoublingStep> steps;
  if (rank >= rounds_span) {
    steps.push_back({rank - rounds_span, DoublingRole::HandOver});
    steps.push_back({rank - rounds_span, DoublingRole::TakeBack});
    return steps;
  }
  const bool stands_for_two = rank + rounds_span < world;
  if (stands_for_two) steps.push_back({rank + rounds_span, DoublingRole::TakeOver});
  for (int distance = 1; distance < rounds_span; distance *= 2) steps.push_back({rank ^ distance, DoublingRole::Exchange});
  if (stands_for_two) steps.push_back({rank + rounds_span, DoublingRole::HandBack});
  return steps;
}

std::vector<HalvingStep> halving_doubling_schedule(std::size_t numel, std::size_t elem_size, int world, int rank) {
  int chunks = 1;  // p, as in doubling_schedule
  while (chunks * 2 <= world) chunks *= 2;
  const SegmentLayout layout = segment_layout(numel, elem_size, chunks, elem_size);
  const auto span_of = [&](int first, int count) {  // chunks [first, first + count)
    const Span from = layout.chunk(first);
    const Span to = layout.chunk(first + count - 1);
    return Span{from.offset, to.offset + to.count - from.offset};
  };
  const Span whole{0, numel};
  std::vector<HalvingStep> steps;
  std::vector<int> partners;  // of the exchanges, in order
  std::optional<HalvingStep> hand_back;
  int first = 0, count = chunks;  // the chunks this rank still reduces
  for (const DoublingStep& pair : doubling_schedule(world, rank)) {
    switch (pair.role) {
      // A rank above p lends its buffer whole and takes the result back whole.
      case DoublingRole::HandOver: steps.push_back({pair.peer, pair.role, whole, {}, false, false}); break;
      case DoublingRole::TakeBack: steps.push_back({pair.peer, pair.role, {}, whole, false, false}); break;
      // Its stand-in adds it in before the exchanges and hands the result back after them.
      case DoublingRole::TakeOver: steps.push_back({pair.peer, pair.role, {}, whole, true, false}); break;
      case DoublingRole::HandBack: hand_back = HalvingStep{pair.peer, pair.role, whole, {}, false, false}; break;
      // Reduce-scatter: keep one half of the chunks, send the other.
      case DoublingRole::Exchange: {
        const int half = count / 2;
        const bool lower = rank < pair.peer;
        const int keep = lower ? first : first + half;
        steps.push_back({pair.peer, pair.role, span_of(lower ? first + half : first, half), span_of(keep, half), true,
                         half == 1});
        partners.push_back(pair.peer);
        first = keep;
        count = half;
        break;
      }
    }
  }
  // All-gather: the exchanges in reverse, each doubling what this rank owns.
  for (auto partner = partners.rbegin(); partner != partners.rend(); ++partner) {
    const int theirs = rank < *partner ? first + count : first - count;
    steps.push_back({*partner, DoublingRole::Exchange, span_of(first, count), span_of(theirs, count), false, false});
    first = std::min(first, theirs);
    count *= 2;
  }
  if (hand_back) steps.push_back(*hand_back);
  return steps;
}

}  // namespace ringreduce
