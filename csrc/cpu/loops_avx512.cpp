// bfloat16 loops for x86-64 CPUs with AVX-512 BF16, whose VCVTNEPS2BF16 rounds sixteen floats to
// nearest even in one instruction, so the bfloat16 reduction keeps up with float32's.
#include "cpu/loops.h"

#if defined(__x86_64__) && defined(__GNUC__)

#pragma GCC push_options
// GCC 12's own AVX-512 headers trip this warning on _mm512_cvtepu16_epi32 (a known false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx2,fma,f16c,avx512f,avx512dq,avx512vl,avx512bw,avx512bf16")
#define RINGREDUCE_LANES_AVX512
#include "cpu/lanes.h"

namespace ringreduce {
namespace {

// Sixteen bfloat16 lanes per step. VCVTNE2PS2BF16 flushes subnormal results to zero; those rare
// steps take the AVX2 rounding, which keeps them, so every path gives the same bits.
struct BFloat16Lanes16 {
  using Scalar = BFloat16;
  using Vec = __m512;
  using Packed = __m256i;
  static constexpr std::size_t kLanes = 16;
  static Vec load(const std::uint16_t* p) {
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
  }
  static Packed round(Vec v) {
    constexpr int kSubnormalClass = 0x20;  // VFPCLASSPS category: denormal
    if (_mm512_fpclass_ps_mask(v, kSubnormalClass) != 0) {
      const __m128i low = round_to_bfloat16(_mm512_castps512_ps256(v));
      const __m128i high = round_to_bfloat16(_mm512_extractf32x8_ps(v, 1));
      return _mm256_set_m128i(high, low);
    }
    return reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v));
  }
  static void store(std::uint16_t* p, Packed x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x); }
};

}  // namespace
}  // namespace ringreduce

#pragma GCC pop_options

namespace ringreduce {

namespace {
bool has_avx512bf16() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
                                __builtin_cpu_supports("fma") && __builtin_cpu_supports("avx512f") &&
                                __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
                                __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16");
  return supported;
}
}  // namespace

bool avx512bf16_loops(DType dtype, ReduceOp op, LoopSet* loops) {
  if (dtype != DType::BFloat16 || !has_avx512bf16()) return false;
  *loops = lanes_for_op<BFloat16Lanes16>(op);
  return true;
}

bool avx512bf16_codec(Compression compression, LinkCodec* codec) {
  if (compression != Compression::BFloat16 || !has_avx512bf16()) return false;
  *codec = codec_lanes<BFloat16Lanes16>();
  return true;
}

}  // namespace ringreduce

#else  // not x86-64 with GCC or Clang

namespace ringreduce {
bool avx512bf16_loops(DType, ReduceOp, LoopSet*) { return false; }
bool avx512bf16_codec(Compression, LinkCodec*) { return false; }
}  // namespace ringreduce

#endif
