#include "cuda/cuda_reducer.h"

#include <stdexcept>

#include "cuda/cuda_check.h"
#include "cuda/reduce_kernels.h"

namespace ringreduce {
namespace cuda {
namespace {

bool is_integer(DType dtype) {
  return dtype == DType::Int8 || dtype == DType::UInt8 || dtype == DType::Int32 || dtype == DType::Int64;
}

class CudaReducer final : public Reducer {
 public:
  CudaReducer(DType dtype, ReduceOp op, int world, const DeviceQueue& queue)
      : Reducer(dtype), op_(op), world_(world), queue_(queue) {}

  void reduce(void* dst, const void* src, std::size_t count, bool last) const override {
    RR_CUDA_CHECK(launch_reduce(dtype(), op_, dst, src, nullptr, count, world_, last, queue_.cuda_stream()));
  }

  void reduce_copy(void* dst, const void* src, void* copy, std::size_t count, bool last) const override {
    RR_CUDA_CHECK(launch_reduce(dtype(), op_, dst, src, copy, count, world_, last, queue_.cuda_stream()));
  }

 private:
  ReduceOp op_;
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
