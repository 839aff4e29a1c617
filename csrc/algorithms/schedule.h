// The segment schedule: the one place that decides which elements move at which step.
// Pure functions of (numel, element size, world, rank, segment size); no I/O, no state.
#pragma once

#include <cstddef>
#include <vector>

namespace ringreduce {

// Chunk starts are rounded to this many bytes so every segment starts on a cache line
// (and on a 16-byte vector boundary for the GPU kernels).
constexpr std::size_t kChunkAlignBytes = 64;

// A run of elements [offset, offset + count) of the flat buffer.
struct Span {
  std::size_t offset = 0;
  std::size_t count = 0;
};

// How the buffer is cut: `world` chunks of `chunk_elems` (the last ones may be short or empty),
// each cut into `segments_per_chunk` segments of at most `segment_elems`.
struct SegmentLayout {
  std::size_t numel = 0;
  std::size_t chunk_elems = 0;
  std::size_t segment_elems = 0;
  std::size_t segments_per_chunk = 0;

  Span segment(int chunk, std::size_t index) const;
  // The whole of chunk `chunk` (short or empty at the end of the buffer).
  Span chunk(int chunk) const;
};

// All-reduce: the buffer cut into `world` chunks whose starts are rounded to kChunkAlignBytes.
SegmentLayout segment_layout(std::size_t numel, std::size_t elem_size, int world, std::size_t segment_bytes);

// Reduce-scatter and all-gather of torch's tensors: `world` chunks of exactly `chunk_elems`, chunk r
// being rank r's share.
SegmentLayout chunk_layout(std::size_t chunk_elems, std::size_t elem_size, int world, std::size_t segment_bytes);

// The hierarchical collectives cut `numel` elements into `shards` shards of `shard_elems` (the
// all-reduce's are segment_layout's chunks; the reduce-scatter's and all-gather's are columns), one
// per rank of the widest host, the last ones short or empty past `numel`. A host of `neighbours`
// ranks reduces them a round of `neighbours` consecutive shards at a time, rank i of the host ending
// with the round's i-th shard (the last round may be short). A round is a layout of its own,
// relative to its first element `offset`.
struct ShardRound {
  std::size_t offset = 0;
  SegmentLayout layout;
};
std::vector<ShardRound> shard_rounds(std::size_t numel, std::size_t shard_elems, std::size_t elem_size, int shards,
                                     int neighbours, std::size_t segment_bytes);

// One pipelined ring transfer of rank r: send `send` to rank r+1, receive `recv` from rank r-1.
// What rank r sends at position k is exactly what rank r+1 receives at position k, empty spans
// included, so both sides make the same transfers in the same order. Except at a segment's first
// step, every send passes on the span received at the same lane's position just before, which lets
// a transport fuse the receive and the send.
struct RingTransfer {
  Span send;
  Span recv;
  bool reduce = false;    // reduce-scatter: the received span is reduced into the buffer; all-gather: copied
  bool last = false;      // the final reduction of this span (AVG divides by the world size here)
  bool send_own = false;  // the send is this rank's own data (first step), not a received span passed on
  bool forward = false;   // the received span is sent on to rank r+1 at this lane's next position
  std::size_t lane = 0;   // the segment's pipeline lane (Transport::select_lane)
};

// Which halves of the ring a schedule makes, and so which chunk a rank owns between them.
enum class RingPhases {
  AllReduce,      // both halves; rank r finishes the reduce-scatter owning chunk r+1
  ReduceScatter,  // the first half alone, rank r ending with chunk r reduced
  AllGather,      // the second half alone, rank r starting with chunk r
};

// The whole ring for one rank, in issue order. Segments are taken `lanes` at a time, segment s in
// lane s % lanes; within such a group the positions go step by step, and within a step segment by
// segment, so consecutive positions belong to different lanes and never depend on each other.
// Each segment makes its reduce-scatter steps then its all-gather steps (those `phases` asks for).
// With one lane this is segment-major: every step of a segment before the next segment.
std::vector<RingTransfer> ring_schedule(const SegmentLayout& layout, int world, int rank, std::size_t lanes,
                                        RingPhases phases);

// The all-reduce's schedule over segment_layout(numel, ...).
std::vector<RingTransfer> ring_schedule(std::size_t numel, std::size_t elem_size, int world, int rank,
                                        std::size_t segment_bytes, std::size_t lanes = 1);

// The central reducer moves the whole buffer, segment by segment.
std::vector<Span> central_schedule(std::size_t numel, std::size_t elem_size, std::size_t segment_bytes);

// Recursive doubling: how `world` ranks combine one value each into one value that every rank ends
// with, in ceil(log2 world) rounds of pairwise exchanges (MPICH's all-reduce for short messages).
// Below the largest power of two p <= world, rank r exchanges with r ^ 2^k in round k. A rank
// r >= p first hands its value to r - p, which combines it before the rounds and hands the result
// back after them: two more messages for those pairs, so no rank sends more than ceil(log2 world)
// + 1 messages. Both ends of every exchange combine (lower rank's value, higher rank's value),
// so with a deterministic combination every rank ends with the same result.
enum class DoublingRole {
  HandOver,   // send this rank's value to `peer` (r >= p), which stands for both in the rounds
  TakeOver,   // receive `peer`'s value (peer = r + p) and combine it with this rank's
  Exchange,   // send the value, receive `peer`'s, and combine the two
  HandBack,   // send the final value to `peer` (the rank that handed its value over)
  TakeBack,   // receive the final value from `peer`
};
struct DoublingStep {
  int peer = 0;
  DoublingRole role = DoublingRole::Exchange;
};
std::vector<DoublingStep> doubling_schedule(int world, int rank);

// Halving-doubling (Rabenseifner's all-reduce, MPICH's for long messages, gloo's halving_doubling):
// doubling_schedule's pairs, with the buffer split instead of swapped whole. The buffer is cut into
// p chunks (segment_layout's; p the largest power of two <= world). In the reduce-scatter, the
// exchanges in order (partner r ^ 2^k at step k): the partners split the chunks they both still
// reduce, the lower rank keeping the lower half; each sends the other half and reduces its
// partner's copy of the half it keeps. Rank r ends owning one chunk, reduced over every rank (chunk
// number r with its bits reversed). The all-gather takes the exchanges in reverse, each partner
// sending all it owns. Each rank moves 2(p-1)/p of the buffer in 2 log2(p) exchanges, against
// doubling's whole buffer in each of log2(p); the ranks above p hand their buffer over and take
// the result back whole, as in doubling. Each chunk is reduced on one rank and copied to the rest,
// so every rank ends with the same bits.
struct HalvingStep {
  int peer = 0;
  DoublingRole role = DoublingRole::Exchange;
  Span send;            // sent to `peer` (empty: nothing)
  Span recv;            // received from `peer` (empty: nothing)
  bool reduce = false;  // the received span is reduced into the buffer (else copied)
  bool last = false;    // the final reduction of the received span (AVG divides here)
};
std::vector<HalvingStep> halving_doubling_schedule(std::size_t numel, std::size_t elem_size, int world, int rank);

}  // namespace ringreduce
