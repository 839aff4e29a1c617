#include "cpu_reducer.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "reduce_ops.h"

namespace ringreduce {
namespace {

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// A storage format: how elements are kept in memory and the type they are reduced in.
template <typename T>
struct Plain {
  using Storage = T;
  using Compute = T;
  static Compute load(Storage v) { return v; }
  static Storage store(Compute v) { return v; }
};

// IEEE binary16, reduced in float. The conversions are written with selects instead of
// branches so that -O3 vectorises the loops.
struct Half {
  using Storage = std::uint16_t;
  using Compute = float;

  static float load(std::uint16_t h) {
    const std::uint32_t magnitude = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
    const std::uint32_t exponent = magnitude & (0x7c00u << 13);
    const std::uint32_t normal = magnitude + ((127u - 15u) << 23);
    const std::uint32_t inf_nan = normal + ((128u - 16u) << 23);
    // Subnormal halves: let the FPU renormalise by subtracting the implicit-one bias.
    const float subnormal = bits_float(normal + (1u << 23)) - bits_float(113u << 23);
    std::uint32_t out = exponent == (0x7c00u << 13) ? inf_nan : normal;
    out = exponent == 0 ? float_bits(subnormal) : out;
    return bits_float(out | (static_cast<std::uint32_t>(h & 0x8000u) << 16));
  }

  // Round to nearest even; overflow gives Inf, NaN stays a quiet NaN.
  static std::uint16_t store(float f) {
    const std::uint32_t bits = float_bits(f);
    const std::uint32_t sign = bits & 0x80000000u;
    const std::uint32_t magnitude = bits ^ sign;
    const std::uint32_t overflow = magnitude > (255u << 23) ? 0x7e00u : 0x7c00u;
    // Below 2^-14 the result is subnormal: adding 0.5 aligns the mantissa so the FPU rounds it.
    const std::uint32_t subnormal = float_bits(bits_float(magnitude) + bits_float(126u << 23)) - (126u << 23);
    const std::uint32_t odd = (magnitude >> 13) & 1u;
    const std::uint32_t normal = (magnitude + ((15u - 127u) << 23) + 0xfffu + odd) >> 13;
    std::uint32_t out = magnitude < (113u << 23) ? subnormal : normal;
    out = magnitude >= ((127u + 16u) << 23) ? overflow : out;
    return static_cast<std::uint16_t>(out | (sign >> 16));
  }
};

// bfloat16: the top half of a float, reduced in float.
struct BFloat16 {
  using Storage = std::uint16_t;
  using Compute = float;

  static float load(std::uint16_t h) { return bits_float(static_cast<std::uint32_t>(h) << 16); }

  // Round to nearest even; NaN stays a quiet NaN.
  static std::uint16_t store(float f) {
    const std::uint32_t bits = float_bits(f);
    const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    const bool is_nan = (bits & 0x7fffffffu) > 0x7f800000u;
    return static_cast<std::uint16_t>(is_nan ? ((bits >> 16) | 0x40u) : rounded);
  }
};

using LoopFn = void (*)(void* dst, const void* src, void* copy, std::size_t count, int world);

// One flat loop per (format, op, divide, copy): no per-element dispatch.
template <typename Format, typename Op, bool kDivide, bool kCopy>
void reduce_loop(void* dst_ptr, const void* src_ptr, void* copy_ptr, std::size_t count, int world) {
  using Storage = typename Format::Storage;
  using Compute = typename Format::Compute;
  Storage* __restrict dst = static_cast<Storage*>(dst_ptr);
  const Storage* __restrict src = static_cast<const Storage*>(src_ptr);
  Storage* __restrict copy = static_cast<Storage*>(copy_ptr);
  const Compute divisor = static_cast<Compute>(world);
  for (std::size_t i = 0; i < count; ++i) {
    Compute value = Op::apply(Format::load(dst[i]), Format::load(src[i]));
    if constexpr (kDivide) value = value / divisor;
    const Storage out = Format::store(value);
    dst[i] = out;
    if constexpr (kCopy) copy[i] = out;
  }
}

class CpuReducer final : public Reducer {
 public:
  CpuReducer(DType dtype, int world, LoopFn reduce, LoopFn reduce_copy, LoopFn last, LoopFn last_copy)
      : Reducer(dtype), world_(world), reduce_(reduce), reduce_copy_(reduce_copy), last_(last), last_copy_(last_copy) {}

  void reduce(void* dst, const void* src, std::size_t count, bool last) const override {
    (last ? last_ : reduce_)(dst, src, nullptr, count, world_);
  }

  void reduce_copy(void* dst, const void* src, void* copy, std::size_t count, bool last) const override {
    (last ? last_copy_ : reduce_copy_)(dst, src, copy, count, world_);
  }

 private:
  int world_;
  LoopFn reduce_, reduce_copy_, last_, last_copy_;
};

template <typename Format, typename Op, bool kDivideLast>
std::unique_ptr<Reducer> make_loops(DType dtype, int world) {
  return std::make_unique<CpuReducer>(dtype, world, &reduce_loop<Format, Op, false, false>,
                                      &reduce_loop<Format, Op, false, true>,
                                      &reduce_loop<Format, Op, kDivideLast, false>,
                                      &reduce_loop<Format, Op, kDivideLast, true>);
}

template <typename Format>
std::unique_ptr<Reducer> make_for_format(DType dtype, ReduceOp op, int world) {
  switch (op) {
    case ReduceOp::Sum: return make_loops<Format, SumOp, false>(dtype, world);
    case ReduceOp::Product: return make_loops<Format, ProductOp, false>(dtype, world);
    case ReduceOp::Min: return make_loops<Format, MinOp, false>(dtype, world);
    case ReduceOp::Max: return make_loops<Format, MaxOp, false>(dtype, world);
    case ReduceOp::Avg:
      if constexpr (std::is_integral_v<typename Format::Compute>) {
        throw std::invalid_argument(
            "ringreduce: ReduceOp.AVG is not defined for integer tensors (torch refuses it too); "
            "use SUM and divide, or convert to a floating dtype");
      } else {
        return make_loops<Format, AvgOp, true>(dtype, world);
      }
  }
  throw std::invalid_argument("ringreduce: unknown reduce op code");
}

}  // namespace

std::unique_ptr<Reducer> make_cpu_reducer(DType dtype, ReduceOp op, int world) {
  switch (dtype) {
    case DType::Float32: return make_for_format<Plain<float>>(dtype, op, world);
    case DType::Float64: return make_for_format<Plain<double>>(dtype, op, world);
    case DType::Float16: return make_for_format<Half>(dtype, op, world);
    case DType::BFloat16: return make_for_format<BFloat16>(dtype, op, world);
    case DType::Int8: return make_for_format<Plain<std::int8_t>>(dtype, op, world);
    case DType::UInt8: return make_for_format<Plain<std::uint8_t>>(dtype, op, world);
    case DType::Int32: return make_for_format<Plain<std::int32_t>>(dtype, op, world);
    case DType::Int64: return make_for_format<Plain<std::int64_t>>(dtype, op, world);
  }
  throw std::invalid_argument("ringreduce: unknown dtype code");
}

}  // namespace ringreduce
