// The loop table of the host reducer, and the hand-vectorised loops that can fill it.
#pragma once

#include <cstddef>

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

// Hand-vectorised loops (cpu_lanes.h). Each returns false, leaving `loops` alone, for dtypes it does
// not cover and on CPUs or architectures without its instructions.
bool avx512bf16_loops(DType dtype, ReduceOp op, LoopSet* loops);  // bfloat16, AVX-512 BF16
bool avx2_loops(DType dtype, ReduceOp op, LoopSet* loops);        // float16 and bfloat16, AVX2 and F16C

}  // namespace ringreduce
