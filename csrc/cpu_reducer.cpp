#include "cpu_reducer.h"

#include <cstdint>
#include <stdexcept>

#include "cpu_formats.h"
#include "cpu_loops.h"
#include "reduce_ops.h"

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

template <typename Format, typename Op, bool kDivideLast>
LoopSet portable() {
  return LoopSet{&reduce_loop<Format, Op, false, false>, &reduce_loop<Format, Op, false, true>,
                 &reduce_loop<Format, Op, kDivideLast, false>, &reduce_loop<Format, Op, kDivideLast, true>};
}

template <typename Format>
LoopSet portable_for_format(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return portable<Format, SumOp, false>();
    case ReduceOp::Product: return portable<Format, ProductOp, false>();
    case ReduceOp::Min: return portable<Format, MinOp, false>();
    case ReduceOp::Max: return portable<Format, MaxOp, false>();
    case ReduceOp::Avg:
      if constexpr (std::is_integral_v<typename Format::Compute>) {
        throw std::invalid_argument(
            "ringreduce: ReduceOp.AVG is not defined for integer tensors (torch refuses it too); "
            "use SUM and divide, or convert to a floating dtype");
      } else {
        return portable<Format, AvgOp, true>();
      }
  }
  throw std::invalid_argument("ringreduce: unknown reduce op code");
}

LoopSet portable_loops(DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::Float32: return portable_for_format<Plain<float>>(op);
    case DType::Float64: return portable_for_format<Plain<double>>(op);
    case DType::Float16: return portable_for_format<Half>(op);
    case DType::BFloat16: return portable_for_format<BFloat16>(op);
    case DType::Int8: return portable_for_format<Plain<std::int8_t>>(op);
    case DType::UInt8: return portable_for_format<Plain<std::uint8_t>>(op);
    case DType::Int32: return portable_for_format<Plain<std::int32_t>>(op);
    case DType::Int64: return portable_for_format<Plain<std::int64_t>>(op);
  }
  throw std::invalid_argument("ringreduce: unknown dtype code");
}

}  // namespace

std::unique_ptr<Reducer> make_cpu_reducer(DType dtype, ReduceOp op, int world) {
  LoopSet loops{};
  if (!avx512bf16_loops(dtype, op, &loops) && !avx2_loops(dtype, op, &loops)) loops = portable_loops(dtype, op);
  return std::make_unique<CpuReducer>(dtype, world, loops);
}

}  // namespace ringreduce
