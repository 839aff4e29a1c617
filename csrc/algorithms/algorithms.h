// The collectives' algorithms. They see a Transport and a Reducer, never a socket, segment or stream.
#pragma once

#include <cstddef>

#include "algorithms/schedule.h"
#include "core/reducer.h"
#include "core/transport.h"

namespace ringreduce {

// Receives posted ahead of the one being reduced, so a transfer is always in flight while a
// segment is reduced: two, as gloo's ring and NCCL keep. 1 and 4 measured no differently on the shm
// and pg transports within this machine's noise (benchmarks/RESULTS.md).
constexpr std::size_t kRecvsAhead = 2;

// Sends the central reducer keeps in flight per destination before it waits for the oldest.
constexpr std::size_t kSendsInFlight = 2;

// Ring all-reduce: chunked reduce-scatter then all-gather, pipelined by segment, with consecutive
// segments in `lanes` lanes of the transport (at most its max_lanes()). Every rank moves 2(N-1)/N
// of the buffer whatever N is, and ends with the same bits: each chunk is reduced by exactly one
// rank and copied to the others.
void ring_all_reduce(Transport& transport, const Reducer& reducer, void* data, std::size_t numel,
                     std::size_t segment_bytes, std::size_t lanes);

// The ring's first half alone: `data` holds `world` chunks of `chunk_elems`, and rank r ends with
// chunk r reduced over every rank (the other chunks hold partial sums). Each rank moves (N-1)/N.
// With `input` (host memory only), the rank's input is read from there and left as it was, and
// `data` is working memory: no copy of the whole input first.
void ring_reduce_scatter(Transport& transport, const Reducer& reducer, void* data, std::size_t chunk_elems,
                         std::size_t segment_bytes, std::size_t lanes, const void* input = nullptr);

// The same over any chunk layout (a hierarchical round: its last chunks may be short or empty).
// With `finishes` false the reductions are not the last ones of the elements (AVG divides later).
void ring_reduce_scatter(Transport& transport, const Reducer& reducer, void* data, const SegmentLayout& layout,
                         std::size_t lanes, bool finishes);

// The ring's second half alone: rank r's chunk r of `data` (elements of `elem` bytes) reaches every
// rank's chunk r. Each rank moves (N-1)/N of the buffer.
void ring_all_gather(Transport& transport, std::size_t elem, void* data, std::size_t chunk_elems,
                     std::size_t segment_bytes, std::size_t lanes);

// The same over any chunk layout.
void ring_all_gather(Transport& transport, std::size_t elem, void* data, const SegmentLayout& layout, std::size_t lanes);

// Broadcast along the ring from `root`, pipelined by segment: each rank passes a segment on to the
// next as it arrives, so every link carries the buffer once and the time is about one buffer's
// transfer plus N-2 segments'. The last rank before the root only receives.
void chain_broadcast(Transport& transport, void* data, std::size_t bytes, std::size_t segment_bytes, int root);

// Central reducer (parameter-server style): every rank sends its buffer to `root`, which reduces
// the contributions in a fixed order (its own, then the others by rank) and sends the result back.
// The root's links carry (N-1) times the buffer each way.
void central_all_reduce(Transport& transport, const Reducer& reducer, void* data, std::size_t numel,
                        std::size_t segment_bytes, int root);

// The central reducer's first half: `root` ends with the reduction, the others' buffers are read
// only. The root's links carry (N-1) times the buffer.
void central_reduce(Transport& transport, const Reducer& reducer, void* data, std::size_t numel,
                    std::size_t segment_bytes, int root);

// Bytes of a doubling all-reduce that travel in the same message as the call check at each step;
// the rest follows in segments once the step's check has passed. A receive posted this large costs
// gloo nothing when less comes (it moves only what is sent). 64 KiB: doubling is the algorithm of
// small messages, where a step's second message would cost as much as the first; from 1 MiB, where
// auto stops trying doubling (kDoublingCandidateBytes), one more message per step is small beside
// the data.
constexpr std::size_t kCheckedPayloadBytes = 64 << 10;

// Recursive doubling all-reduce (doubling_schedule), the latency algorithm across hosts: in each of
// ceil(log2 N) steps partners swap their whole partial results and both reduce them elementwise (a
// commutative op, so both get the same bits), with a hand-over before and after for the ranks above
// the largest power of two. Each rank sends at most log2(N) + 1 messages, of the whole buffer, against
// the ring's 2(N-1) of 1/N. Every step's first message carries the call check (agree_on_call's) and
// the buffer's first kCheckedPayloadBytes, so the check costs no messages of its own; the rest
// follows once both ends know that every rank they stand for agrees. Every rank ends with the same
// bits, or every rank raises the same MismatchError and its buffer is left as it was. `scratch`
// (twice the buffer) holds the working copy and the partners' segments.
void doubling_all_reduce(Transport& transport, const CollectiveHeader& header, const Reducer& reducer, void* data,
                         void* scratch, std::size_t numel, std::size_t segment_bytes);

// Halving-doubling all-reduce (halving_doubling_schedule), the bandwidth algorithm of large groups
// across hosts: a reduce-scatter by recursive halving and an all-gather by recursive doubling, 2
// log2(N) steps of pairwise exchanges that move 2(N-1)/N of the buffer per rank, as the ring does
// in 2(N-1) steps (with a whole buffer's hand-over before and after for the ranks above the largest
// power of two). Each step's transfers go in segments of `segment_bytes`. The call is checked
// before it (agree_on_call, or a transport that compares headers). Every rank ends with the same bits.
void halving_doubling_all_reduce(Transport& transport, const Reducer& reducer, void* data, std::size_t numel,
                                 std::size_t segment_bytes);

// One-shot all-reduce, for small messages in host memory: every rank sends its whole buffer to
// every peer and reduces the N contributions itself, in rank order, in `scratch` (as large as the
// buffer). One round of messages instead of the ring's 2(N-1) or the central reducer's two, at the
// price of (N-1) times the buffer on every rank's links. Every rank ends with the same bits.
void one_shot_all_reduce(Transport& transport, const Reducer& reducer, void* data, void* scratch, std::size_t numel);

// Finds out whether every rank of the group makes the same call (`header`), for a transport whose
// messages carry no header: one small message per doubling_schedule() step, ceil(log2 N) + 1 at
// most per rank, before any data moves. Each message says what the ranks it stands for called: the
// lowest one's header, and the lowest rank whose header differs from it. So every rank ends knowing
// the same, and where they differ every rank raises the same MismatchError, naming those two
// ranks. Its receives take kCheckedPayloadBytes more than the check, so that a rank running a
// doubling all-reduce (the same messages, with data) meets it without overrunning a buffer.
void agree_on_call(Transport& transport, const CollectiveHeader& header);

// An all-reduce of nothing still meets the neighbours: one empty message around the ring carries
// the headers, so a rank that passed an empty tensor while others did not is caught, not left waiting.
void agree_on_nothing(Transport& transport);

}  // namespace ringreduce
