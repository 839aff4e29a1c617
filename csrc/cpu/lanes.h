// Hand-vectorised float16 and bfloat16 reduction loops: eight or sixteen elements are widened to
// float in registers, combined, and rounded back to nearest even. Shared by the AVX2 and AVX-512 translation
// units; each includes it after enabling at least AVX2, FMA and F16C, and everything here has
// internal linkage so the linker never mixes their copies.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "cpu/formats.h"

namespace ringreduce {
namespace {

// Float vector primitives, overloaded by width so one loop serves 8 lanes (AVX2) and 16 (AVX-512).
// MIN and MAX keep the NaN rule of reduce_ops.h: a NaN in `a` wins, and a NaN in `b` loses every
// comparison, so it wins too.
inline __m256 add(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
inline __m256 mul(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
inline __m256 div(__m256 a, __m256 b) { return _mm256_div_ps(a, b); }
inline __m256 splat(__m256, float x) { return _mm256_set1_ps(x); }
inline __m256 take_if_nan_or(__m256 a, __m256 b, __m256 a_wins) {
  return _mm256_blendv_ps(b, a, _mm256_or_ps(_mm256_cmp_ps(a, a, _CMP_UNORD_Q), a_wins));
}
inline __m256 load_floats(__m256, const float* p) { return _mm256_loadu_ps(p); }
inline void store_floats(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
inline __m256 min_nan(__m256 a, __m256 b) { return take_if_nan_or(a, b, _mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
inline __m256 max_nan(__m256 a, __m256 b) { return take_if_nan_or(a, b, _mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
#if defined(RINGREDUCE_LANES_AVX512)  // set by the AVX-512 translation unit
inline __m512 add(__m512 a, __m512 b) { return _mm512_add_ps(a, b); }
inline __m512 mul(__m512 a, __m512 b) { return _mm512_mul_ps(a, b); }
inline __m512 div(__m512 a, __m512 b) { return _mm512_div_ps(a, b); }
inline __m512 splat(__m512, float x) { return _mm512_set1_ps(x); }
inline __m512 take_if_nan_or(__m512 a, __m512 b, __mmask16 a_wins) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q) | a_wins, b, a);
}
inline __m512 load_floats(__m512, const float* p) { return _mm512_loadu_ps(p); }
inline void store_floats(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline __m512 min_nan(__m512 a, __m512 b) { return take_if_nan_or(a, b, _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ)); }
inline __m512 max_nan(__m512 a, __m512 b) { return take_if_nan_or(a, b, _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ)); }
#endif

// A 16-bit format seen through a float vector: `Vec` holds kLanes floats, `Packed` the same number
// of 16-bit values. `Scalar` is the portable format, used for the ragged tail.
struct HalfLanes {
  using Scalar = Half;
  using Vec = __m256;
  using Packed = __m128i;
  static constexpr std::size_t kLanes = 8;
  static Vec load(const std::uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static Packed round(Vec v) { return _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static void store(std::uint16_t* p, Packed x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), x); }
};

// Round eight floats to bfloat16, to nearest even as BFloat16::store does; NaN becomes a quiet NaN.
inline __m128i round_to_bfloat16(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd);
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i out = _mm256_blendv_epi8(rounded, quiet_nan, is_nan);
  // Every lane is below 2^16, so the saturating pack keeps it; then gather the two halves.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(out, out), 0x08);
  return _mm256_castsi256_si128(packed);
}

struct BFloat16Lanes {
  using Scalar = BFloat16;
  using Vec = __m256;
  using Packed = __m128i;
  static constexpr std::size_t kLanes = 8;
  static Vec load(const std::uint16_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
  static Packed round(Vec v) { return round_to_bfloat16(v); }
  static void store(std::uint16_t* p, Packed x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), x); }
};

// The vector forms of the functors in reduce_ops.h.
struct SumLanes {
  using Scalar = SumOp;
  template <typename V>
  static V apply(V a, V b) { return add(a, b); }
};
struct ProductLanes {
  using Scalar = ProductOp;
  template <typename V>
  static V apply(V a, V b) { return mul(a, b); }
};
struct MinLanes {
  using Scalar = MinOp;
  template <typename V>
  static V apply(V a, V b) { return min_nan(a, b); }
};
struct MaxLanes {
  using Scalar = MaxOp;
  template <typename V>
  static V apply(V a, V b) { return max_nan(a, b); }
};

template <typename Format, typename Op, bool kDivide, bool kCopy>
void lanes_loop(void* dst_ptr, const void* src_ptr, void* copy_ptr, std::size_t count, int world) {
  using Vec = typename Format::Vec;
  auto* dst = static_cast<std::uint16_t*>(dst_ptr);
  const auto* src = static_cast<const std::uint16_t*>(src_ptr);
  auto* copy = static_cast<std::uint16_t*>(copy_ptr);
  const Vec divisor = splat(Vec{}, static_cast<float>(world));
  std::size_t i = 0;
  for (; i + Format::kLanes <= count; i += Format::kLanes) {
    Vec value = Op::apply(Format::load(dst + i), Format::load(src + i));
    if constexpr (kDivide) value = div(value, divisor);
    const typename Format::Packed out = Format::round(value);
    Format::store(dst + i, out);
    if constexpr (kCopy) Format::store(copy + i, out);
  }
  // The ragged tail, element by element, with the same rounding.
  reduce_loop<typename Format::Scalar, typename Op::Scalar, kDivide, kCopy>(
      dst + i, src + i, kCopy ? copy + i : nullptr, count - i, world);
}

struct LanesLoop {
  template <typename Format, typename Op, bool kDivide, bool kCopy>
  static void run(void* dst, const void* src, void* copy, std::size_t count, int world) {
    lanes_loop<Format, Op, kDivide, kCopy>(dst, src, copy, count, world);
  }
};

struct LaneOps {
  using Sum = SumLanes;
  using Product = ProductLanes;
  using Min = MinLanes;
  using Max = MaxLanes;
};

// The loops of one 16-bit format for `op`.
template <typename Format>
LoopSet lanes_for_op(ReduceOp op) {
  return loops_for<LanesLoop, Format, LaneOps>(op);
}

// The link codec of one 16-bit format, kLanes values per step; the ragged tail takes the portable
// loops, which round the same way.
template <typename Format>
void encode_lanes(void* wire_ptr, const float* values, std::size_t count) {
  using Vec = typename Format::Vec;
  auto* wire = static_cast<std::uint16_t*>(wire_ptr);
  std::size_t i = 0;
  for (; i + Format::kLanes <= count; i += Format::kLanes) Format::store(wire + i, Format::round(load_floats(Vec{}, values + i)));
  encode_loop<typename Format::Scalar>(wire + i, values + i, count - i);
}

template <typename Format>
void decode_lanes(float* values, const void* wire_ptr, std::size_t count) {
  const auto* wire = static_cast<const std::uint16_t*>(wire_ptr);
  std::size_t i = 0;
  for (; i + Format::kLanes <= count; i += Format::kLanes) store_floats(values + i, Format::load(wire + i));
  decode_loop<typename Format::Scalar>(values + i, wire + i, count - i);
}

template <typename Format, bool kDivide>
void add_encode_lanes(void* dst_ptr, const void* src_ptr, const float* local, std::size_t count, int world) {
  using Vec = typename Format::Vec;
  auto* dst = static_cast<std::uint16_t*>(dst_ptr);
  const auto* src = static_cast<const std::uint16_t*>(src_ptr);
  const Vec divisor = splat(Vec{}, static_cast<float>(world));
  std::size_t i = 0;
  for (; i + Format::kLanes <= count; i += Format::kLanes) {
    Vec value = add(Format::load(src + i), load_floats(Vec{}, local + i));
    if constexpr (kDivide) value = div(value, divisor);
    Format::store(dst + i, Format::round(value));
  }
  add_encode_loop<typename Format::Scalar, kDivide>(dst + i, src + i, local + i, count - i, world);
}

// int8 blocks eight values at a time, with formats.h's rounding (the same bits): a whole block's
// largest magnitude, then its levels rounded to nearest even by the conversion. Partial blocks and
// blocks with a non-finite value take the portable loop.
inline void quantize_block_lanes(unsigned char* block, const float* values, std::size_t count) {
  const __m256 magnitude_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 largest_finite = _mm256_set1_ps(3.4028235e38f);
  __m256 largest = _mm256_setzero_ps();
  __m256 not_finite = _mm256_setzero_ps();
  if (count == kInt8BlockValues) {
    for (std::size_t i = 0; i < kInt8BlockValues; i += 8) {
      const __m256 magnitude = _mm256_and_ps(_mm256_loadu_ps(values + i), magnitude_mask);
      largest = _mm256_max_ps(largest, magnitude);
      not_finite = _mm256_or_ps(not_finite, _mm256_cmp_ps(magnitude, largest_finite, _CMP_NLE_UQ));
    }
  }
  if (count != kInt8BlockValues || _mm256_movemask_ps(not_finite) != 0) {
    quantize_block(block, values, count);
    return;
  }
  __m128 half = _mm_max_ps(_mm256_castps256_ps128(largest), _mm256_extractf128_ps(largest, 1));
  half = _mm_max_ps(half, _mm_movehl_ps(half, half));
  half = _mm_max_ss(half, _mm_shuffle_ps(half, half, 1));
  const float most = _mm_cvtss_f32(half);
  const float scale = most / kInt8Levels;
  const __m256 inverse = _mm256_set1_ps(most > 0.0f ? kInt8Levels / most : 0.0f);
  const __m256i in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // undoes the packs' lane interleaving
  for (std::size_t i = 0; i < kInt8BlockValues; i += 32) {
    __m256i levels[4];
    for (int k = 0; k < 4; ++k) levels[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(values + i + 8 * k), inverse));
    const __m256i words = _mm256_packs_epi32(levels[0], levels[1]);
    const __m256i more_words = _mm256_packs_epi32(levels[2], levels[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(words, more_words), in_order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(block + sizeof(float) + i), bytes);
  }
  std::memcpy(block, &scale, sizeof scale);
}

inline void dequantize_block_lanes(float* values, const unsigned char* block, std::size_t count) {
  if (count != kInt8BlockValues) {
    dequantize_block(values, block, count);
    return;
  }
  float scale;
  std::memcpy(&scale, block, sizeof scale);
  const __m256 scales = _mm256_set1_ps(scale);
  for (std::size_t i = 0; i < kInt8BlockValues; i += 8) {
    const __m128i levels = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + sizeof(float) + i));
    _mm256_storeu_ps(values + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(levels)), scales));
  }
}

inline LinkCodec int8_codec_lanes() { return Int8Blocks<quantize_block_lanes, dequantize_block_lanes>::codec(); }

template <typename Format>
LinkCodec codec_lanes() {
  return LinkCodec{1, sizeof(std::uint16_t), &encode_lanes<Format>, &decode_lanes<Format>,
                   &add_encode_lanes<Format, false>, &add_encode_lanes<Format, true>};
}

}  // namespace
}  // namespace ringreduce
