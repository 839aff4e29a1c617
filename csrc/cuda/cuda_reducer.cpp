#include "cuda/cuda_reducer.h"

#include <stdexcept>

#include "cuda/cuda_check.h"

namespace ringreduce {
namespace cuda {
namespace {

bool is_integer(DType dtype) {
  return dtype == DType::Int8 || dtype == DType::UInt8 || dtype == DType::Int32 || dtype == DType::Int64;
}

bool is_16_bit_float(DType dtype) { return dtype == DType::Float16 || dtype == DType::BFloat16; }

// AVG of float16 and bfloat16 is a SUM of inputs pre-multiplied by 1/world, as NCCL's ncclAvg:
// partial sums then stay within the type's range (a float16 sum of 8 ranks' 10000s would overflow
// where their average does not). Wider types divide once, at the last reduction.
class CudaReducer final : public Reducer {
 public:
  CudaReducer(DType dtype, ReduceOp op, int world, const DeviceQueue& queue)
      : Reducer(dtype, op),
        premultiply_(op == ReduceOp::Avg && is_16_bit_float(dtype)),
        op_(premultiply_ ? ReduceOp::Sum : op),
        world_(world),
        queue_(queue) {}

  void prepare(void* data, std::size_t count) const override {
    if (premultiply_) RR_CUDA_CHECK(queue_.api().scale(dtype(), data, count, 1.0f / world_, queue_.cuda_stream()));
  }

  void reduce(void* dst, const void* src, std::size_t count, bool last) const override {
    RR_CUDA_CHECK(queue_.api().reduce(dtype(), op_, dst, src, nullptr, count, world_, last, queue_.cuda_stream()));
  }

  void reduce_copy(void* dst, const void* src, void* copy, std::size_t count, bool last) const override {
    RR_CUDA_CHECK(queue_.api().reduce(dtype(), op_, dst, src, copy, count, world_, last, queue_.cuda_stream()));
  }

 private:
  bool premultiply_;
  ReduceOp op_;  // SUM when pre-multiplying
  int world_;
  const DeviceQueue& queue_;
};

}  // namespace

std::unique_ptr<Reducer> make_cuda_reducer(DType dtype, ReduceOp op, int world, const DeviceQueue& queue) {
  if (op == ReduceOp::Avg && is_integer(dtype)) {
    throw std::invalid_argument(
        "ringreduce: ReduceOp.AVG is not defined for integer tensors (torch refuses it too); "
        "use SUM and divide, or convert to a floating dtype");
  }
  return std::make_unique<CudaReducer>(dtype, op, world, queue);
}

}  // namespace cuda
}  // namespace ringreduce
