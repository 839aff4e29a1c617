// The reduction kernel's body, written once for both sides: the __global__ wrapper in
// reduce_kernels.cu passes its thread's index in the grid, and host_kernels.cpp runs every thread
// of a simulated grid on the CPU, so the CI machines test the arithmetic, the alignment split and
// the tails without a GPU.
#pragma once

#include <type_traits>

#include "core/common.h"
#include "cuda/device_ops.cuh"

namespace ringreduce {
namespace cuda {

// How `count` elements split into a scalar head, whole 16-byte packs, and a scalar tail. The packs
// need dst, src and copy to sit at the same offset from a 16-byte boundary (a view such as t[1:]
// of every rank's buffer does); the head then runs up to the first boundary. Otherwise every
// element is scalar.
struct SpanSplit {
  std::size_t head = 0;   // scalar elements before the first pack
  std::size_t packs = 0;  // whole packs after the head
  std::size_t tail = 0;   // scalar elements after the packs
};

template <typename Storage>
RR_HOST_DEVICE SpanSplit split_span(const void* dst, const void* src, const void* copy, std::size_t count) {
  constexpr std::size_t kCount = kPackBytes / sizeof(Storage);
  const std::uintptr_t offset = reinterpret_cast<std::uintptr_t>(dst) % kPackBytes;
  const bool same_offset = reinterpret_cast<std::uintptr_t>(src) % kPackBytes == offset &&
                           (copy == nullptr || reinterpret_cast<std::uintptr_t>(copy) % kPackBytes == offset);
  SpanSplit split;
  if (!same_offset || offset % sizeof(Storage) != 0) {
    split.head = count;
    return split;
  }
  const std::size_t to_boundary = (kPackBytes - offset) % kPackBytes / sizeof(Storage);
  split.head = to_boundary < count ? to_boundary : count;
  split.packs = (count - split.head) / kCount;
  split.tail = count - split.head - split.packs * kCount;
  return split;
}

// Thread `thread` of `threads`: dst[i] = dst[i] op src[i] (and copy[i] = the result) for the packs
// at its index and every `threads`-th after, then likewise for the scalar head and tail elements.
template <typename Format, typename Op, bool kDivide, bool kCopy>
RR_HOST_DEVICE void reduce_span(typename Format::Storage* dst, const typename Format::Storage* src,
                                typename Format::Storage* copy, std::size_t count,
                                typename Format::Compute divisor, std::size_t thread, std::size_t threads) {
  using Storage = typename Format::Storage;
  constexpr int kCount = Pack<Storage>::kCount;
  const SpanSplit split = split_span<Storage>(dst, src, copy, count);
  const std::size_t body = split.head;  // first element of the packs
  for (std::size_t p = thread; p < split.packs; p += threads) {
    const std::size_t at = body + p * kCount;
    const Pack<Storage> a = load_pack(dst + at);
    const Pack<Storage> b = load_pack(src + at);
    Pack<Storage> out;
    RR_UNROLL
    for (int i = 0; i < kCount; ++i) out.values[i] = combine<Format, Op, kDivide>(a.values[i], b.values[i], divisor);
    store_pack(dst + at, out);
    if constexpr (kCopy) store_pack(copy + at, out);
  }
  // Scalar elements: the head, then the tail after the packs, numbered as one run.
  const std::size_t scalars = split.head + split.tail;
  const std::size_t tail_start = body + split.packs * kCount;
  for (std::size_t s = thread; s < scalars; s += threads) {
    const std::size_t i = s < split.head ? s : tail_start + (s - split.head);
    const Storage out = combine<Format, Op, kDivide>(dst[i], src[i], divisor);
    dst[i] = out;
    if constexpr (kCopy) copy[i] = out;
  }
}

// Thread `thread` of `threads`: data[i] = data[i] * factor, rounded once to the storage type; the
// pre-multiply of AVG (Reducer::prepare). Split like a reduction of data with itself.
template <typename Format>
RR_HOST_DEVICE void scale_span(typename Format::Storage* data, std::size_t count, typename Format::Compute factor,
                               std::size_t thread, std::size_t threads) {
  using Storage = typename Format::Storage;
  constexpr int kCount = Pack<Storage>::kCount;
  const SpanSplit split = split_span<Storage>(data, data, nullptr, count);
  for (std::size_t p = thread; p < split.packs; p += threads) {
    Storage* at = data + split.head + p * kCount;
    Pack<Storage> pack = load_pack(at);
    RR_UNROLL
    for (int i = 0; i < kCount; ++i) pack.values[i] = Format::store(Format::load(pack.values[i]) * factor);
    store_pack(at, pack);
  }
  const std::size_t tail_start = split.head + split.packs * kCount;
  for (std::size_t s = thread; s < split.head + split.tail; s += threads) {
    const std::size_t i = s < split.head ? s : tail_start + (s - split.head);
    data[i] = Format::store(Format::load(data[i]) * factor);
  }
}

// Calls launcher.template run<Format>() for the 16-bit float formats, the ones AVG pre-multiplies;
// `invalid` for any other dtype.
template <typename Result, typename Launcher>
Result dispatch_scale(DType dtype, Result invalid, Launcher&& launcher) {
  switch (dtype) {
    case DType::Float16: return launcher.template run<HalfFormat>();
    case DType::BFloat16: return launcher.template run<BFloat16Format>();
    default: return invalid;
  }
}

// The work items one call has for its threads: packs or scalar elements, whichever are more.
template <typename Storage>
RR_HOST_DEVICE std::size_t span_work(const void* dst, const void* src, const void* copy, std::size_t count) {
  const SpanSplit split = split_span<Storage>(dst, src, copy, count);
  const std::size_t scalars = split.head + split.tail;
  return split.packs > scalars ? split.packs : scalars;
}

namespace detail_dispatch {

template <typename Format, typename Op, bool kDivide, typename Result, typename Launcher>
Result with_copy(bool copy, Launcher& launcher) {
  return copy ? launcher.template run<Format, Op, kDivide, true>() : launcher.template run<Format, Op, kDivide, false>();
}

template <typename Format, typename Result, typename Launcher>
Result with_op(ReduceOp op, bool last, bool copy, Result invalid, Launcher& launcher) {
  switch (op) {
    case ReduceOp::Sum: return with_copy<Format, SumOp, false, Result>(copy, launcher);
    case ReduceOp::Product: return with_copy<Format, ProductOp, false, Result>(copy, launcher);
    case ReduceOp::Min: return with_copy<Format, MinOp, false, Result>(copy, launcher);
    case ReduceOp::Max: return with_copy<Format, MaxOp, false, Result>(copy, launcher);
    case ReduceOp::Avg:
      if constexpr (std::is_integral_v<typename Format::Compute>) {
        return invalid;
      } else {
        return last ? with_copy<Format, AvgOp, true, Result>(copy, launcher)
                    : with_copy<Format, AvgOp, false, Result>(copy, launcher);
      }
  }
  return invalid;
}

}  // namespace detail_dispatch

// Calls launcher.template run<Format, Op, kDivide, kCopy>() for the dtype, op and variant asked
// for: one dtype and op switch for the GPU launch and its host twin. AVG on integers never gets
// here (the reducers refuse it); `invalid` is returned then, and for unknown codes.
template <typename Result, typename Launcher>
Result dispatch_reduce(DType dtype, ReduceOp op, bool last, bool copy, Result invalid, Launcher&& launcher) {
  using detail_dispatch::with_op;
  switch (dtype) {
    case DType::Float32: return with_op<PlainFormat<float>>(op, last, copy, invalid, launcher);
    case DType::Float64: return with_op<PlainFormat<double>>(op, last, copy, invalid, launcher);
    case DType::Float16: return with_op<HalfFormat>(op, last, copy, invalid, launcher);
    case DType::BFloat16: return with_op<BFloat16Format>(op, last, copy, invalid, launcher);
    case DType::Int8: return with_op<PlainFormat<std::int8_t>>(op, last, copy, invalid, launcher);
    case DType::UInt8: return with_op<PlainFormat<std::uint8_t>>(op, last, copy, invalid, launcher);
    case DType::Int32: return with_op<PlainFormat<std::int32_t>>(op, last, copy, invalid, launcher);
    case DType::Int64: return with_op<PlainFormat<std::int64_t>>(op, last, copy, invalid, launcher);
  }
  return invalid;
}

}  // namespace cuda
}  // namespace ringreduce
