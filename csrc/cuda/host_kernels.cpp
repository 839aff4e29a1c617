#include "cuda/host_kernels.h"

#include <stdexcept>

#include "cuda/reduce_body.cuh"

namespace ringreduce {
namespace cuda {
namespace {

struct SimulatedGrid {
  void* dst;
  const void* src;
  void* copy;
  std::size_t count;
  int world;
  std::size_t threads;

  // Threads of a grid-stride kernel touch disjoint elements, so running them one by one gives
  // what the GPU gives in any interleaving.
  template <typename Format, typename Op, bool kDivide, bool kCopy>
  bool run() const {
    using Storage = typename Format::Storage;
    for (std::size_t thread = 0; thread < threads; ++thread) {
      reduce_span<Format, Op, kDivide, kCopy>(static_cast<Storage*>(dst), static_cast<const Storage*>(src),
                                              static_cast<Storage*>(copy), count,
                                              static_cast<typename Format::Compute>(world), thread, threads);
    }
    return true;
  }
};

struct SimulatedScaleGrid {
  void* data;
  std::size_t count;
  float factor;
  std::size_t threads;

  template <typename Format>
  bool run() const {
    for (std::size_t thread = 0; thread < threads; ++thread) {
      scale_span<Format>(static_cast<typename Format::Storage*>(data), count, factor, thread, threads);
    }
    return true;
  }
};

void check_grid(std::size_t blocks, std::size_t threads_per_block) {
  if (blocks == 0 || threads_per_block == 0) throw std::invalid_argument("ringreduce: a grid needs a thread");
}

}  // namespace

void host_scale(DType dtype, void* data, std::size_t count, float factor, std::size_t blocks,
                std::size_t threads_per_block) {
  check_grid(blocks, threads_per_block);
  if (!dispatch_scale(dtype, false, SimulatedScaleGrid{data, count, factor, blocks * threads_per_block})) {
    throw std::invalid_argument("ringreduce: the AVG pre-multiply is for float16 and bfloat16 only");
  }
}

void host_reduce(DType dtype, ReduceOp op, void* dst, const void* src, void* copy, std::size_t count, int world,
                 bool last, std::size_t blocks, std::size_t threads_per_block) {
  check_grid(blocks, threads_per_block);
  const SimulatedGrid grid{dst, src, copy, count, world, blocks * threads_per_block};
  if (!dispatch_reduce(dtype, op, last, copy != nullptr, false, grid)) {
    throw std::invalid_argument("ringreduce: AVG is not defined for integer tensors");
  }
}

}  // namespace cuda
}  // namespace ringreduce
