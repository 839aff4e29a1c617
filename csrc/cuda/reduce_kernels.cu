// The reduction kernels: dst = dst op src (and optionally copy = the result) for every dtype and op.
#include <algorithm>
#include <cstdint>

#include "cuda/reduce_body.cuh"
#include "cuda/reduce_kernels.h"

namespace ringreduce {
namespace cuda {
namespace {

// Threads per block: 512, sixteen warps, the usual size for streaming kernels; the occupancy query
// below decides how many blocks fit on an SM with it.
constexpr int kThreadsPerBlock = 512;

template <typename Format, typename Op, bool kDivide, bool kCopy>
__global__ void __launch_bounds__(kThreadsPerBlock)
    reduce_kernel(typename Format::Storage* __restrict__ dst, const typename Format::Storage* __restrict__ src,
                  typename Format::Storage* __restrict__ copy, std::size_t count, typename Format::Compute divisor) {
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t threads = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  reduce_span<Format, Op, kDivide, kCopy>(dst, src, copy, count, divisor, thread, threads);
}

template <typename Format>
__global__ void __launch_bounds__(kThreadsPerBlock)
    scale_kernel(typename Format::Storage* __restrict__ data, std::size_t count, typename Format::Compute factor) {
  const std::size_t thread = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t threads = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  scale_span<Format>(data, count, factor, thread, threads);
}

// The most blocks of `kernel` that are resident at once on the current GPU: a grid-stride loop
// needs no more, since every extra block would only wait for a free slot.
template <typename Kernel>
int resident_blocks(Kernel kernel) {
  int device = 0;
  int sms = 0;
  int per_sm = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreadsPerBlock, 0) != cudaSuccess) {
    return 1;
  }
  return std::max(sms * per_sm, 1);
}

// Blocks for `work` items of `kernel`: one item per thread up to what is resident at once.
template <typename Kernel>
int blocks_for(Kernel kernel, std::size_t work, int most_blocks) {
  const std::size_t wanted = (work + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<int>(std::max<std::size_t>(1, std::min<std::size_t>(wanted, most_blocks)));
}

struct Launch {
  void* dst;
  const void* src;
  void* copy;
  std::size_t count;
  int world;
  cudaStream_t stream;

  template <typename Format, typename Op, bool kDivide, bool kCopy>
  cudaError_t run() const {
    using Storage = typename Format::Storage;
    const auto kernel = reduce_kernel<Format, Op, kDivide, kCopy>;
    // Asked once per instantiation; every GPU of the process is taken to be of one kind.
    static const int most_blocks = resident_blocks(kernel);
    const int blocks = blocks_for(kernel, span_work<Storage>(dst, src, copy, count), most_blocks);
    kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<Storage*>(dst), static_cast<const Storage*>(src),
                                                    static_cast<Storage*>(copy), count,
                                                    static_cast<typename Format::Compute>(world));
    return cudaGetLastError();
  }
};

struct LaunchScale {
  void* data;
  std::size_t count;
  float factor;
  cudaStream_t stream;

  template <typename Format>
  cudaError_t run() const {
    using Storage = typename Format::Storage;
    const auto kernel = scale_kernel<Format>;
    static const int most_blocks = resident_blocks(kernel);
    const int blocks = blocks_for(kernel, span_work<Storage>(data, data, nullptr, count), most_blocks);
    kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<Storage*>(data), count, factor);
    return cudaGetLastError();
  }
};

}  // namespace

cudaError_t launch_scale(DType dtype, void* data, std::size_t count, float factor, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return dispatch_scale(dtype, cudaErrorInvalidValue, LaunchScale{data, count, factor, stream});
}

cudaError_t launch_reduce(DType dtype, ReduceOp op, void* dst, const void* src, void* copy, std::size_t count,
                          int world, bool last, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return dispatch_reduce(dtype, op, last, copy != nullptr, cudaErrorInvalidValue,
                         Launch{dst, src, copy, count, world, stream});
}

}  // namespace cuda
}  // namespace ringreduce
