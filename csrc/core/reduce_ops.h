// Reduction functors, shared by the host loops and the CUDA kernels.
//
// Contract for every functor: apply(a, b) combines two values of the compute type (float for
// float16/bfloat16, the storage type otherwise) and
//  - is commutative; the engine still applies it in one fixed order so that every rank gets the
//    same bits;
//  - propagates NaN for floating types: if either operand is NaN the result is NaN (MIN and MAX
//    included, as torch.minimum and torch.maximum do);
//  - wraps modulo 2^bits for integer SUM and PRODUCT, as torch's integer arithmetic does.
#pragma once

#include <type_traits>

#include "core/host_device.h"

namespace ringreduce {

// Integer SUM and PRODUCT are done in the unsigned type of the same width, where wrapping is defined.
template <typename T>
struct WrapType {
  using type = T;
};
template <>
struct WrapType<int> {
  using type = unsigned int;
};
template <>
struct WrapType<long> {
  using type = unsigned long;
};
template <>
struct WrapType<long long> {
  using type = unsigned long long;
};

struct SumOp {
  template <typename T>
  static RR_HOST_DEVICE T apply(T a, T b) {
    using W = typename WrapType<T>::type;
    return static_cast<T>(static_cast<W>(a) + static_cast<W>(b));
  }
};

struct ProductOp {
  template <typename T>
  static RR_HOST_DEVICE T apply(T a, T b) {
    using W = typename WrapType<T>::type;
    return static_cast<T>(static_cast<W>(a) * static_cast<W>(b));
  }
};

struct MinOp {
  template <typename T>
  static RR_HOST_DEVICE T apply(T a, T b) {
    return (a != a || a < b) ? a : b;  // a != a: a is NaN
  }
};

struct MaxOp {
  template <typename T>
  static RR_HOST_DEVICE T apply(T a, T b) {
    return (a != a || a > b) ? a : b;
  }
};

// AVG reduces as SUM; the division by the world size happens once, at an element's last reduction.
using AvgOp = SumOp;

}  // namespace ringreduce
