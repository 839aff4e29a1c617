#include "cpu/reducer.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "core/reduce_ops.h"
#include "cpu/formats.h"
#include "cpu/loops.h"

namespace ringreduce {
namespace {

class CpuReducer final : public Reducer {
 public:
  CpuReducer(DType dtype, ReduceOp op, int world, LoopSet loops) : Reducer(dtype, op), world_(world), loops_(loops) {}

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

template <typename Format>
LinkCodec portable_codec() {
  return LinkCodec{&encode_loop<Format>, &decode_loop<Format>, &add_encode_loop<Format, false>,
                   &add_encode_loop<Format, true>};
}

LinkCodec fastest_codec(Compression compression) {
  LinkCodec codec{};
  if (avx512bf16_codec(compression, &codec) || avx2_codec(compression, &codec)) return codec;
  return compression == Compression::Float16 ? portable_codec<Half>() : portable_codec<BFloat16>();
}

DType wire_dtype(Compression compression) {
  RR_CHECK(compression != Compression::None, "a link reducer needs a compression");
  return compression == Compression::Float16 ? DType::Float16 : DType::BFloat16;
}

}  // namespace

const LinkCodec& link_codec(Compression compression) {
  static const LinkCodec bfloat16 = fastest_codec(Compression::BFloat16);
  static const LinkCodec float16 = fastest_codec(Compression::Float16);
  return compression == Compression::Float16 ? float16 : bfloat16;
}

LinkReducer::LinkReducer(Compression compression, ReduceOp op, int world, const std::uint16_t* wire, const float* exact)
    : Reducer(wire_dtype(compression), op),
      codec_(link_codec(compression)),
      divides_(op == ReduceOp::Avg),
      world_(world),
      wire_(wire),
      exact_(exact) {
  RR_CHECK(op == ReduceOp::Sum || op == ReduceOp::Avg, "a compressed link reduces SUM and AVG only, not ", op_name(op));
}

void LinkReducer::reduce(void* dst, const void* src, std::size_t count, bool last) const {
  auto* out = static_cast<std::uint16_t*>(dst);
  const float* mine = exact_ + (out - wire_);  // this rank's value at the same position
  (last && divides_ ? codec_.add_divide : codec_.add)(out, static_cast<const std::uint16_t*>(src), mine, count, world_);
}

void LinkReducer::reduce_copy(void* dst, const void* src, void* copy, std::size_t count, bool last) const {
  reduce(dst, src, count, last);
  std::memcpy(copy, dst, count * sizeof(std::uint16_t));
}

std::unique_ptr<Reducer> make_cpu_reducer(DType dtype, ReduceOp op, int world) {
  if (op == ReduceOp::Avg && is_integer(dtype)) {
    throw std::invalid_argument(
        "ringreduce: ReduceOp.AVG is not defined for integer tensors (torch refuses it too); "
        "use SUM and divide, or convert to a floating dtype");
  }
  LoopSet loops{};
  if (!avx512bf16_loops(dtype, op, &loops) && !avx2_loops(dtype, op, &loops)) loops = portable_loops(dtype, op);
  return std::make_unique<CpuReducer>(dtype, op, world, loops);
}

}  // namespace ringreduce
