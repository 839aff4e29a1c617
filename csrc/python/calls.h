// One collective call from torch tensors: the working buffer, the copies in and out of it, the
// ordering against the caller's CUDA stream, and the Work that reports it. The drop-in functions
// and the torch.distributed backend both go through here.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <optional>
#include <vector>

#include "engine/communicator.h"

namespace ringreduce {

// A copy a call makes in stream order: `from` into `into`.
struct Copy {
  at::Tensor from;
  at::Tensor into;
};

// One call as its job runs it: the copies `before` (inputs into the working buffer), the collective
// on the buffer, then the copies `after` (the buffer into the outputs it stands in for). `results`
// is what the future holds: the outputs, as torch's backends report them.
struct Call {
  CollectiveArgs args;
  std::vector<Copy> before;
  std::vector<Copy> after;
  std::vector<at::Tensor> results;
  std::vector<at::Tensor> reads;  // inputs the collective reads where they are (kept alive until it ends)
};

ReduceOp checked_op(int op_code);

// The calls, checked against torch's rules (ValueError/TypeError naming what is wrong).
// With a `compression`, a float32 SUM or AVG on a group that spans hosts runs hierarchical,
// compressed between hosts (Auto or Hierarchical only); anything else runs exact. A compressed SUM
// on host memory adds the rounding errors this rank made to `residual` (error feedback).
Call all_reduce_call(Communicator& communicator, const at::Tensor& tensor, ReduceOp op, Algorithm algorithm,
                     std::size_t segment_bytes, int root, Compression compression = Compression::None,
                     const std::optional<at::Tensor>& residual = std::nullopt);
// A reduce-scatter or all-gather runs Auto (hierarchical where every host has the same number of
// ranks, else the ring), Ring or Hierarchical; a reduce-scatter compresses as an all-reduce, where
// it runs hierarchical.
Call reduce_scatter_call(Communicator& communicator, const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                         Algorithm algorithm, std::size_t segment_bytes, Compression compression = Compression::None);
Call all_gather_call(Communicator& communicator, const at::Tensor& output, const at::Tensor& input,
                     Algorithm algorithm, std::size_t segment_bytes);
// The working buffer the calls keep with `communicator` between calls (in bytes).
std::size_t caller_working_bytes(Communicator& communicator);
Call broadcast_call(Communicator& communicator, const at::Tensor& tensor, int root, std::size_t segment_bytes);
// The root's tensor ends with the reduction; the others' are left as they were.
Call reduce_call(Communicator& communicator, const at::Tensor& tensor, ReduceOp op, int root, std::size_t segment_bytes);

// Runs the call now and returns null (blocking: the caller's CUDA stream then waits for it), or
// queues it on the communicator's worker and returns a Work whose future holds call.results.
c10::intrusive_ptr<c10d::Work> submit(Communicator& communicator, Call call, bool async_op);

// Runs the call now, as a blocking submit(), and returns a Work that is already complete: what a
// torch.distributed backend hands back for a call made with async_op=False, which skips the
// hand-over to the communicator's worker thread.
c10::intrusive_ptr<c10d::Work> run_now(Communicator& communicator, Call call);

// Calls that failed on the simulated device whose tensors are still kept for work queued there.
std::size_t calls_kept_for_the_device();

}  // namespace ringreduce
