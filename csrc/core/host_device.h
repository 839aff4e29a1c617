// RR_HOST_DEVICE marks functions that both the host code and the CUDA kernels call.
#pragma once

#if defined(__CUDACC__)
#define RR_HOST_DEVICE __host__ __device__ __forceinline__
#else
// Always inlined: the AVX2 and AVX-512 translation units use these too, and an out-of-line copy
// compiled for those instructions must never be what the portable loops call.
#define RR_HOST_DEVICE inline __attribute__((always_inline))
#endif
