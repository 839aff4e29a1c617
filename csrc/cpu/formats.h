// Storage formats of the host reducer (how elements sit in memory and the type they are reduced
// in) and the portable reduction loop. The 16-bit float conversions are written as selects, not
// branches, so that loops over them vectorise.
//
// Everything here has internal linkage: the AVX2 translation unit compiles it for other
// instructions, and the linker must never hand that copy to the portable path.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/reduce_ops.h"
#include "cpu/loops.h"

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

// The portable link codec loops of a 16-bit `Format` (loops.h, LinkCodec).
template <typename Format>
void encode_loop(void* wire_ptr, const float* values, std::size_t count) {
  auto* wire = static_cast<std::uint16_t*>(wire_ptr);
  for (std::size_t i = 0; i < count; ++i) wire[i] = Format::store(values[i]);
}

template <typename Format>
void decode_loop(float* values, const void* wire_ptr, std::size_t count) {
  const auto* wire = static_cast<const std::uint16_t*>(wire_ptr);
  for (std::size_t i = 0; i < count; ++i) values[i] = Format::load(wire[i]);
}

template <typename Format, bool kDivide>
void add_encode_loop(void* dst_ptr, const void* src_ptr, const float* local, std::size_t count, int world) {
  auto* dst = static_cast<std::uint16_t*>(dst_ptr);
  const auto* src = static_cast<const std::uint16_t*>(src_ptr);
  const float divisor = static_cast<float>(world);
  for (std::size_t i = 0; i < count; ++i) {
    float value = Format::load(src[i]) + local[i];
    if constexpr (kDivide) value = value / divisor;
    dst[i] = Format::store(value);
  }
}

// int8 blocks on the link: the values of a block share one float32 scale, the block's largest
// magnitude / 127, and each is kept as the nearest int8 multiple of it (ties to even), so a
// rounding costs at most half a step, largest / 254. A block on the wire is its scale, then its
// values. 256 values a block: the scale costs 4 bytes in 260 (1.5 % of the link's bytes), and a
// value's error is bounded by its 255 neighbours' largest; other sizes have not been measured.
constexpr std::size_t kInt8BlockValues = 256;
constexpr std::size_t kInt8BlockBytes = sizeof(float) + kInt8BlockValues;
constexpr float kInt8Levels = 127.0f;
// Added and taken away, it rounds a float of magnitude below 2^22 to an integer, ties to even (in
// the default rounding mode), in a form compilers vectorise, where nearbyint would be a call.
constexpr float kRoundingShift = 12582912.0f;  // 1.5 * 2^23

// Rounds `count` (at most kInt8BlockValues) values into one block; a non-finite value makes the
// whole block NaN (its scale is NaN), as it would poison the sum anyway.
inline void quantize_block(unsigned char* block, const float* values, std::size_t count) {
  float largest = 0.0f;
  bool finite = true;
  for (std::size_t i = 0; i < count; ++i) {
    const float magnitude = values[i] < 0 ? -values[i] : values[i];
    largest = magnitude > largest ? magnitude : largest;
    finite = finite && magnitude <= 3.4028235e38f;  // false for inf and NaN
  }
  float scale = largest / kInt8Levels;
  const float inverse = finite && largest > 0.0f ? kInt8Levels / largest : 0.0f;
  if (!finite) scale = bits_float(0x7fc00000u);
  auto* levels = reinterpret_cast<std::int8_t*>(block + sizeof(float));
  for (std::size_t i = 0; i < count; ++i) {
    const float scaled = finite ? values[i] * inverse : 0.0f;
    float level = (scaled + kRoundingShift) - kRoundingShift;
    level = level > kInt8Levels ? kInt8Levels : (level < -kInt8Levels ? -kInt8Levels : level);
    levels[i] = static_cast<std::int8_t>(level);
  }
  for (std::size_t i = count; i < kInt8BlockValues; ++i) levels[i] = 0;
  std::memcpy(block, &scale, sizeof scale);
}

inline void dequantize_block(float* values, const unsigned char* block, std::size_t count) {
  float scale;
  std::memcpy(&scale, block, sizeof scale);
  const auto* levels = reinterpret_cast<const std::int8_t*>(block + sizeof(float));
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>(levels[i]) * scale;
}

// The link codec of int8 blocks over one pair of block loops (these, or vectorised ones): `count`
// values from the start of a block, block after block, the last one partial.
template <void (*Quantize)(unsigned char*, const float*, std::size_t),
          void (*Dequantize)(float*, const unsigned char*, std::size_t)>
struct Int8Blocks {
  template <typename Block>
  static void for_blocks(std::size_t count, const Block& block) {
    for (std::size_t first = 0; first < count; first += kInt8BlockValues) {
      block(first / kInt8BlockValues * kInt8BlockBytes, first, std::min(kInt8BlockValues, count - first));
    }
  }
  static void encode(void* wire, const float* values, std::size_t count) {
    for_blocks(count, [&](std::size_t at, std::size_t first, std::size_t n) {
      Quantize(static_cast<unsigned char*>(wire) + at, values + first, n);
    });
  }
  static void decode(float* values, const void* wire, std::size_t count) {
    for_blocks(count, [&](std::size_t at, std::size_t first, std::size_t n) {
      Dequantize(values + first, static_cast<const unsigned char*>(wire) + at, n);
    });
  }
  template <bool kDivide>
  static void add(void* dst, const void* src, const float* local, std::size_t count, int world) {
    const float divisor = static_cast<float>(world);
    for_blocks(count, [&](std::size_t at, std::size_t first, std::size_t n) {
      alignas(64) float sum[kInt8BlockValues];
      Dequantize(sum, static_cast<const unsigned char*>(src) + at, n);
      for (std::size_t i = 0; i < n; ++i) {
        sum[i] += local[first + i];
        if constexpr (kDivide) sum[i] /= divisor;
      }
      Quantize(static_cast<unsigned char*>(dst) + at, sum, n);
    });
  }
  static LinkCodec codec() {
    return LinkCodec{kInt8BlockValues, kInt8BlockBytes, &encode, &decode, &add<false>, &add<true>};
  }
};

// Loop kinds run `Op` over a `Format` with `run<Format, Op, kDivide, kCopy>`. This one is the
// portable loop above; cpu_lanes.h has the hand-vectorised one.
struct ScalarLoop {
  template <typename Format, typename Op, bool kDivide, bool kCopy>
  static void run(void* dst, const void* src, void* copy, std::size_t count, int world) {
    reduce_loop<Format, Op, kDivide, kCopy>(dst, src, copy, count, world);
  }
};

// The functors a loop kind combines elements with, one per op (AVG is SUM that divides at the end).
struct ScalarOps {
  using Sum = SumOp;
  using Product = ProductOp;
  using Min = MinOp;
  using Max = MaxOp;
};

// The four loops of one format and op: plain and fused-copy, and their `last` forms.
template <typename Loop, typename Format, typename Op, bool kDivideLast>
LoopSet loop_set() {
  return LoopSet{&Loop::template run<Format, Op, false, false>, &Loop::template run<Format, Op, false, true>,
                 &Loop::template run<Format, Op, kDivideLast, false>, &Loop::template run<Format, Op, kDivideLast, true>};
}

// The loops of `Format` for `op`. Callers refuse AVG for integer formats before they get here.
template <typename Loop, typename Format, typename Ops>
LoopSet loops_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return loop_set<Loop, Format, typename Ops::Sum, false>();
    case ReduceOp::Avg: return loop_set<Loop, Format, typename Ops::Sum, true>();
    case ReduceOp::Product: return loop_set<Loop, Format, typename Ops::Product, false>();
    case ReduceOp::Min: return loop_set<Loop, Format, typename Ops::Min, false>();
    case ReduceOp::Max: return loop_set<Loop, Format, typename Ops::Max, false>();
  }
  return LoopSet{};
}

}  // namespace
}  // namespace ringreduce
