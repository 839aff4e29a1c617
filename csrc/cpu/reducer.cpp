#include "cpu/reducer.h"

#include <cstdint>
#include <stdexcept>

#include "core/reduce_ops.h"
#include "cpu/formats.h"
#include "cpu/loops.h"

namespace ringreduce {
namespace {

class CpuReducer final : public Reducer {
 public:
  CpuReducer(DType dtype, int world, LoopSet loops) : Reducer(dtype), world_(world), loops_(loops) {}

  void reduce(void* dst, const void* src, std::size_t count, bool last) const override {
    (last ? loops_.last : loops_.reduce)(dst, src, nullptr, count, world_);
  }

  void reduce_copy(void* dst, const void* src, void* copy, std::size_t count, bool last) const override {
    (last ? loops_.last_copy : loops_.reduce_copy)(dst, src, copy, count, world_);
  }

 private:
  int world_;
  LoopSet loops_;
};

LoopSet portable_loops(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::Float32: return loops_for<ScalarLoop, Plain<float>, ScalarOps>(op);
    case DType::Float64: return loops_for<ScalarLoop, Plain<double>, ScalarOps>(op);
    case DType::Float16: return loops_for<ScalarLoop, Half, ScalarOps>(op);
    case DType::BFloat16: return loops_for<ScalarLoop, BFloat16, ScalarOps>(op);
    case DType::Int8: return loops_for<ScalarLoop, Plain<std::int8_t>, ScalarOps>(op);
    case DType::UInt8: return loops_for<ScalarLoop, Plain<std::uint8_t>, ScalarOps>(op);
    case DType::Int32: return loops_for<ScalarLoop, Plain<std::int32_t>, ScalarOps>(op);
    case DType::Int64: return loops_for<ScalarLoop, Plain<std::int64_t>, ScalarOps>(op);
  }
  throw std::invalid_argument("ringreduce: unknown dtype code");
}

bool is_integer(DType dtype) {
  return dtype == DType::Int8 || dtype == DType::UInt8 || dtype == DType::Int32 || dtype == DType::Int64;
}

}  // namespace

std::unique_ptr<Reducer> make_cpu_reducer(DType dtype, ReduceOp op, int world) {
  if (op == ReduceOp::Avg && is_integer(dtype)) {
    throw std::invalid_argument(
        "ringreduce: ReduceOp.AVG is not defined for integer tensors (torch refuses it too); "
        "use SUM and divide, or convert to a floating dtype");
  }
  LoopSet loops{};
  if (!avx512bf16_loops(dtype, op, &loops) && !avx2_loops(dtype, op, &loops)) loops = portable_loops(dtype, op);
  return std::make_unique<CpuReducer>(dtype, world, loops);
}

}  // namespace ringreduce
