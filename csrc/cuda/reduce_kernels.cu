// The reduction kernels: dst = dst op src (and optionally copy = the result) for every dtype and op.
#include "cuda/reduce_kernels.h"

#include <algorithm>
#include <cstdint>

#include "cuda/device_ops.cuh"

namespace ringreduce {
namespace cuda {
namespace {

// Threads per block: 512 lets each SM hold four blocks (2048 threads) with the few registers
// these memory-bound loops need; the launch bound tells the compiler so.
constexpr int kThreadsPerBlock = 512;
// Blocks per SM for large arrays: enough resident warps to keep HBM busy with 128-bit accesses
// (the usual grid-stride sizing for streaming kernels); more only adds scheduling.
constexpr int kBlocksPerSm = 4;

template <typename Format, typename Op, bool kDivide, bool kCopy>
__global__ void __launch_bounds__(kThreadsPerBlock)
    reduce_kernel(typename Format::Storage* __restrict__ dst, const typename Format::Storage* __restrict__ src,
                  typename Format::Storage* __restrict__ copy, std::size_t count, bool vectorised,
                  typename Format::Compute divisor) {
  using Storage = typename Format::Storage;
  constexpr int kCount = Pack<Storage>::kCount;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t scalar_begin = 0;
  if (vectorised) {
    // Body: whole 16-byte packs, a grid-stride loop over them.
    const std::size_t packs = count / kCount;
    for (std::size_t p = first; p < packs; p += stride) {
      const Pack<Storage> a = load_pack(dst + p * kCount);
      const Pack<Storage> b = load_pack(src + p * kCount);
      Pack<Storage> out;
#pragma unroll
      for (int i = 0; i < kCount; ++i) out.values[i] = combine<Format, Op, kDivide>(a.values[i], b.values[i], divisor);
      store_pack(dst + p * kCount, out);
      if constexpr (kCopy) store_pack(copy + p * kCount, out);
    }
    scalar_begin = packs * kCount;
  }
  // Tail (or everything, for misaligned pointers): element by element.
  for (std::size_t i = scalar_begin + first; i < count; i += stride) {
    const Storage out = combine<Format, Op, kDivide>(dst[i], src[i], divisor);
    dst[i] = out;
    if constexpr (kCopy) copy[i] = out;
  }
}

int sm_count() {
  int device = 0;
  int count = 0;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 1;
  }
  return std::max(count, 1);
}

bool aligned(const void* p) { return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % kPackBytes == 0; }

template <typename Format, typename Op, bool kDivide, bool kCopy>
cudaError_t launch(void* dst, const void* src, void* copy, std::size_t count, int world, cudaStream_t stream) {
  using Storage = typename Format::Storage;
  const bool vectorised = aligned(dst) && aligned(src) && aligned(copy);
  const std::size_t work = vectorised ? count / Pack<Storage>::kCount + count % Pack<Storage>::kCount : count;
  const std::size_t wanted = (work + kThreadsPerBlock - 1) / kThreadsPerBlock;
  static const int most_blocks = sm_count() * kBlocksPerSm;
  const int blocks = static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(wanted, most_blocks)));
  reduce_kernel<Format, Op, kDivide, kCopy><<<blocks, kThreadsPerBlock, 0, stream>>>(
      static_cast<Storage*>(dst), static_cast<const Storage*>(src), static_cast<Storage*>(copy), count, vectorised,
      static_cast<typename Format::Compute>(world));
  return cudaGetLastError();
}

template <typename Format, typename Op, bool kDivide>
cudaError_t launch_copy_or_not(void* dst, const void* src, void* copy, std::size_t count, int world,
                               cudaStream_t stream) {
  return copy != nullptr ? launch<Format, Op, kDivide, true>(dst, src, copy, count, world, stream)
                         : launch<Format, Op, kDivide, false>(dst, src, copy, count, world, stream);
}

template <typename Format>
cudaError_t launch_for_format(ReduceOp op, void* dst, const void* src, void* copy, std::size_t count, int world,
                              bool last, cudaStream_t stream) {
  switch (op) {
    case ReduceOp::Sum: return launch_copy_or_not<Format, SumOp, false>(dst, src, copy, count, world, stream);
    case ReduceOp::Product: return launch_copy_or_not<Format, ProductOp, false>(dst, src, copy, count, world, stream);
    case ReduceOp::Min: return launch_copy_or_not<Format, MinOp, false>(dst, src, copy, count, world, stream);
    case ReduceOp::Max: return launch_copy_or_not<Format, MaxOp, false>(dst, src, copy, count, world, stream);
    case ReduceOp::Avg:
      if constexpr (std::is_integral_v<typename Format::Compute>) {
        return cudaErrorInvalidValue;  // refused before any launch (see make_cuda_reducer)
      } else {
        return last ? launch_copy_or_not<Format, AvgOp, true>(dst, src, copy, count, world, stream)
                    : launch_copy_or_not<Format, AvgOp, false>(dst, src, copy, count, world, stream);
      }
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_reduce(DType dtype, ReduceOp op, void* dst, const void* src, void* copy, std::size_t count,
                          int world, bool last, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (dtype) {
    case DType::Float32: return launch_for_format<PlainFormat<float>>(op, dst, src, copy, count, world, last, stream);
    case DType::Float64: return launch_for_format<PlainFormat<double>>(op, dst, src, copy, count, world, last, stream);
    case DType::Float16: return launch_for_format<HalfFormat>(op, dst, src, copy, count, world, last, stream);
    case DType::BFloat16: return launch_for_format<BFloat16Format>(op, dst, src, copy, count, world, last, stream);
    case DType::Int8: return launch_for_format<PlainFormat<std::int8_t>>(op, dst, src, copy, count, world, last, stream);
    case DType::UInt8: return launch_for_format<PlainFormat<std::uint8_t>>(op, dst, src, copy, count, world, last, stream);
    case DType::Int32: return launch_for_format<PlainFormat<std::int32_t>>(op, dst, src, copy, count, world, last, stream);
    case DType::Int64: return launch_for_format<PlainFormat<std::int64_t>>(op, dst, src, copy, count, world, last, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace ringreduce
