// Device helpers shared by every kernel: storage formats with their up/down conversion, and
// 16-byte packs for vectorised loads and stores. The op functors themselves are the ones the
// host loops use (core/reduce_ops.h), so both sides follow one contract. CUDA headers only, and
// everything is __host__ __device__: the host build of the kernel bodies (host_kernels.cpp) uses it.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/reduce_ops.h"

namespace ringreduce {
namespace cuda {

// Unrolls the loop that follows on the GPU; the host compiler decides for itself.
#if defined(__CUDACC__)
#define RR_UNROLL _Pragma("unroll")
#else
#define RR_UNROLL
#endif

// Bytes moved by one vectorised load or store (one LDG.128 / STG.128).
constexpr std::size_t kPackBytes = 16;

// A storage format: the type in memory and the type it is reduced in.
template <typename T>
struct PlainFormat {
  using Storage = T;
  using Compute = T;
  static RR_HOST_DEVICE Compute load(Storage v) { return v; }
  static RR_HOST_DEVICE Storage store(Compute v) { return v; }
};

// float16 and bfloat16 are reduced in float registers and rounded to nearest even on the way out.
struct HalfFormat {
  using Storage = __half;
  using Compute = float;
  static RR_HOST_DEVICE float load(__half v) { return __half2float(v); }
  static RR_HOST_DEVICE __half store(float v) { return __float2half_rn(v); }
};

struct BFloat16Format {
  using Storage = __nv_bfloat16;
  using Compute = float;
  static RR_HOST_DEVICE float load(__nv_bfloat16 v) { return __bfloat162float(v); }
  static RR_HOST_DEVICE __nv_bfloat16 store(float v) { return __float2bfloat16_rn(v); }
};

// kPackBytes of elements, loaded and stored as one 128-bit access.
template <typename Storage>
struct alignas(kPackBytes) Pack {
  static constexpr int kCount = static_cast<int>(kPackBytes / sizeof(Storage));
  Storage values[kCount];
};

template <typename Storage>
RR_HOST_DEVICE Pack<Storage> load_pack(const Storage* p) {
  Pack<Storage> pack;
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(&pack) = *reinterpret_cast<const uint4*>(p);
#else
  std::memcpy(static_cast<void*>(&pack), p, kPackBytes);
#endif
  return pack;
}

template <typename Storage>
RR_HOST_DEVICE void store_pack(Storage* p, const Pack<Storage>& pack) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&pack);
#else
  std::memcpy(static_cast<void*>(p), &pack, kPackBytes);
#endif
}

// One element: dst op src, divided by the world size for AVG's last reduction.
template <typename Format, typename Op, bool kDivide>
RR_HOST_DEVICE typename Format::Storage combine(typename Format::Storage a, typename Format::Storage b,
                                                typename Format::Compute divisor) {
  typename Format::Compute value = Op::apply(Format::load(a), Format::load(b));
  if constexpr (kDivide) value = value / divisor;
  return Format::store(value);
}

}  // namespace cuda
}  // namespace ringreduce
