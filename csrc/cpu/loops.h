// The loop table of the host reducer, and the hand-vectorised loops that can fill it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/common.h"

namespace ringreduce {

// dst[i] = dst[i] op src[i] for i < count, and copy[i] = the result when copy is set; the `last`
// loops of AVG also divide by `world`.
using LoopFn = void (*)(void* dst, const void* src, void* copy, std::size_t count, int world);

struct LoopSet {
  LoopFn reduce;
  LoopFn reduce_copy;
  LoopFn last;
  LoopFn last_copy;
};

// The loops that carry float32 values across a link compressed: in a 16-bit format (bfloat16 or
// float16, an element per value), or in int8 blocks (an element per kInt8BlockValues values),
// rounding to nearest even. Counts are of values; a last, partial element is padded.
struct LinkCodec {
  std::size_t values_per_element;
  std::size_t element_bytes;
  // wire = values, rounded.
  void (*encode)(void* wire, const float* values, std::size_t count);
  // values = wire, widened (exact).
  void (*decode)(float* values, const void* wire, std::size_t count);
  // dst = (src widened + local) rounded once; the `divide` form divides the sum by `world` before
  // it rounds (an AVG's last reduction).
  using AddFn = void (*)(void* dst, const void* src, const float* local, std::size_t count, int world);
  AddFn add;
  AddFn add_divide;
};

// Hand-vectorised loops (cpu_lanes.h). Each returns false, leaving `loops` alone, for dtypes it does
// not cover and on CPUs or architectures without its instructions.
bool avx512bf16_loops(DType dtype, ReduceOp op, LoopSet* loops);  // bfloat16, AVX-512 BF16
bool avx2_loops(DType dtype, ReduceOp op, LoopSet* loops);        // float16 and bfloat16, AVX2 and F16C
// The same for the link codecs: Compression::BFloat16 only, and every compression.
bool avx512bf16_codec(Compression compression, LinkCodec* codec);
bool avx2_codec(Compression compression, LinkCodec* codec);

}  // namespace ringreduce
