// The reducer contract the algorithms use. A reducer is bound to one dtype, op and world size,
// and to the memory it runs on (host loops, or kernels on a CUDA stream).
#pragma once

#include <cstddef>

#include "core/common.h"

namespace ringreduce {

class Reducer {
 public:
  Reducer(DType dtype, ReduceOp op) : dtype_(dtype), op_(op) {}
  virtual ~Reducer() = default;

  // Runs once per collective on this rank's own input, before any of it is sent or reduced (on a
  // GPU: first in stream order). A reducer that averages by pre-multiplying, as NCCL's ncclAvg
  // does, scales the input by 1/world here and then sums, so partial sums stay in range; the
  // others leave the input alone.
  virtual void prepare(void* data, std::size_t count) const {}

  // dst[i] = dst[i] op src[i] for i < count. With `last`, AVG divides the result by the world size
  // (each element takes its `last` reduction exactly once), unless prepare() pre-multiplied. dst
  // and src do not overlap.
  virtual void reduce(void* dst, const void* src, std::size_t count, bool last) const = 0;

  // As reduce(), and also writes the result to `copy` in the same pass.
  virtual void reduce_copy(void* dst, const void* src, void* copy, std::size_t count, bool last) const = 0;

  DType dtype() const { return dtype_; }
  ReduceOp op() const { return op_; }
  // Bytes per element of the memory it reduces: the dtype's, unless the elements are blocks.
  virtual std::size_t element_size() const { return ringreduce::element_size(dtype_); }

 private:
  DType dtype_;
  ReduceOp op_;
};

}  // namespace ringreduce
