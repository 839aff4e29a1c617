#include "cpu/reducer.h"

#include <algorithm>
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
  return LinkCodec{1, sizeof(std::uint16_t), &encode_loop<Format>, &decode_loop<Format>,
                   &add_encode_loop<Format, false>, &add_encode_loop<Format, true>};
}

LinkCodec fastest_codec(Compression compression) {
  LinkCodec codec{};
  if (avx512bf16_codec(compression, &codec) || avx2_codec(compression, &codec)) return codec;
  switch (compression) {
    case Compression::Float16: return portable_codec<Half>();
    case Compression::Int8: return Int8Blocks<quantize_block, dequantize_block>::codec();
    default: return portable_codec<BFloat16>();
  }
}

DType wire_dtype(Compression compression) {
  switch (compression) {
    case Compression::BFloat16: return DType::BFloat16;
    case Compression::Float16: return DType::Float16;
    case Compression::Int8: return DType::UInt8;  // blocks of bytes
    case Compression::None: break;
  }
  throw std::invalid_argument("ringreduce: a link reducer needs a compression");
}

}  // namespace

const LinkCodec& link_codec(Compression compression) {
  static const LinkCodec bfloat16 = fastest_codec(Compression::BFloat16);
  static const LinkCodec float16 = fastest_codec(Compression::Float16);
  static const LinkCodec int8 = fastest_codec(Compression::Int8);
  wire_dtype(compression);  // refuses None
  return compression == Compression::Float16 ? float16 : compression == Compression::Int8 ? int8 : bfloat16;
}

LinkReducer::LinkReducer(Compression compression, ReduceOp op, int world, const void* wire, const float* exact,
                         std::size_t count, float* residual)
    : Reducer(wire_dtype(compression), op),
      codec_(link_codec(compression)),
      divides_(op == ReduceOp::Avg),
      world_(world),
      wire_(static_cast<const unsigned char*>(wire)),
      exact_(exact),
      count_(count),
      residual_(residual) {
  RR_CHECK(op == ReduceOp::Sum || op == ReduceOp::Avg, "a compressed link reduces SUM and AVG only, not ", op_name(op));
  // (AVG's last rounding is of the sum divided, in other units than the values')
  RR_CHECK(residual == nullptr || op == ReduceOp::Sum, "a compressed link keeps its rounding errors for SUM only");
}

void LinkReducer::reduce(void* dst, const void* src, std::size_t count, bool last) const {
  // This rank's values at the same place: element k of the wire carries values from k * values_per_element.
  const std::size_t first = (static_cast<const unsigned char*>(dst) - wire_) / codec_.element_bytes * codec_.values_per_element;
  const std::size_t values = std::min(count * codec_.values_per_element, count_ - std::min(first, count_));
  (last && divides_ ? codec_.add_divide : codec_.add)(dst, src, exact_ + first, values, world_);
  if (residual_ != nullptr) keep_rounding_error(codec_, residual_ + first, exact_ + first, src, dst, values);
}

void LinkReducer::reduce_copy(void* dst, const void* src, void* copy, std::size_t count, bool last) const {
  reduce(dst, src, count, last);
  std::memcpy(copy, dst, count * codec_.element_bytes);
}

void keep_rounding_error(const LinkCodec& codec, float* residual, const float* exact, const void* arriving,
                         const void* wire, std::size_t count) {
  // Piece by piece through two buffers on the stack: whole elements (int8 blocks) of values.
  constexpr std::size_t kPieceValues = 4096;
  static_assert(kPieceValues % kInt8BlockValues == 0, "a piece holds whole int8 blocks");
  float before[kPieceValues];
  float after[kPieceValues];
  const std::size_t element_bytes = codec.element_bytes;
  for (std::size_t first = 0; first < count; first += kPieceValues) {
    const std::size_t n = std::min(kPieceValues, count - first);
    const std::size_t offset = first / codec.values_per_element * element_bytes;
    codec.decode(after, static_cast<const unsigned char*>(wire) + offset, n);
    if (arriving != nullptr) {
      codec.decode(before, static_cast<const unsigned char*>(arriving) + offset, n);
      for (std::size_t i = 0; i < n; ++i) before[i] += exact[first + i];  // the sum the codec rounded
    } else {
      std::memcpy(before, exact + first, n * sizeof(float));
    }
    for (std::size_t i = 0; i < n; ++i) residual[first + i] += before[i] - after[i];
  }
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
