// float16 and bfloat16 loops for x86-64 CPUs with AVX2 and F16C. The compiler does not vectorise
// the portable conversions well (float16 stayed below 2 GB/s, bfloat16 near 3), and these loops are
// chosen at run time only on CPUs that have the instructions.
#include "cpu/loops.h"

#if defined(__x86_64__) && defined(__GNUC__)

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "cpu/lanes.h"

namespace ringreduce {
namespace {

LoopSet avx2_lanes(DType dtype, ReduceOp op) {
  return dtype == DType::Float16 ? lanes_for_op<HalfLanes>(op) : lanes_for_op<BFloat16Lanes>(op);
}

LinkCodec avx2_codec_lanes(Compression compression) {
  switch (compression) {
    case Compression::Float16: return codec_lanes<HalfLanes>();
    case Compression::Int8: return int8_codec_lanes();
    default: return codec_lanes<BFloat16Lanes>();
  }
}

}  // namespace
}  // namespace ringreduce

#pragma GCC pop_options

namespace ringreduce {

namespace {
bool has_avx2() {
  static const bool supported =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
  return supported;
}
}  // namespace

bool avx2_loops(DType dtype, ReduceOp op, LoopSet* loops) {
  if ((dtype != DType::Float16 && dtype != DType::BFloat16) || !has_avx2()) return false;
  *loops = avx2_lanes(dtype, op);
  return true;
}

bool avx2_codec(Compression compression, LinkCodec* codec) {
  if (compression == Compression::None || !has_avx2()) return false;
  *codec = avx2_codec_lanes(compression);
  return true;
}

}  // namespace ringreduce

#else  // not x86-64 with GCC or Clang

namespace ringreduce {
bool avx2_loops(DType, ReduceOp, LoopSet*) { return false; }
bool avx2_codec(Compression, LinkCodec*) { return false; }
}  // namespace ringreduce

#endif
