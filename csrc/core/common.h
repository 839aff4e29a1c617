// Types and error helpers shared by the whole engine. No torch, no CUDA.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/header.h"

namespace ringreduce {

// Element types the engine reduces. Bool travels as UInt8 (MIN, MAX and PRODUCT only).
enum class DType : int { Float32, Float64, Float16, BFloat16, Int8, UInt8, Int32, Int64 };
constexpr int kDTypeCount = 8;

// Same meaning as torch.distributed.ReduceOp.
enum class ReduceOp : int { Sum, Avg, Min, Max, Product };
constexpr int kReduceOpCount = 5;

inline std::size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::Float64:
    case DType::Int64: return 8;
    case DType::Float32:
    case DType::Int32: return 4;
    case DType::Float16:
    case DType::BFloat16: return 2;
    case DType::Int8:
    case DType::UInt8: return 1;
  }
  throw std::invalid_argument("ringreduce: unknown dtype code");
}

const char* dtype_name(DType dtype);
const char* op_name(ReduceOp op);
const char* algorithm_name(Algorithm algorithm);
const char* collective_name(Collective collective);
// "bf16", "fp16", "int8" or "none": the names ringreduce.all_reduce's `compress` takes.
const char* compression_name(Compression compression);

// Raised when a peer does not answer within the group's timeout.
class TimeoutError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "ringreduce: Timed out after 1000 ms: ", the start of every timeout's message: the words of
// torch's own backends, which programs (and torch's tests) look for.
std::string timed_out_after(std::chrono::milliseconds timeout);

// Raised on every rank when the ranks of a group disagree on a collective.
class MismatchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "1000 x float32, SUM, ring (collective #5)" for an all-reduce, "broadcast of 1000 x float32 from
// root 2 (collective #5)" and the like for the others; the segment size and lanes are named when
// they differ from `other`'s.
std::string describe(const CollectiveHeader& header, const CollectiveHeader& other);

// The error every rank raises when `mine` (ours) and `theirs` (peer's) differ.
[[noreturn]] void throw_mismatch(int rank, const CollectiveHeader& mine, int peer, const CollectiveHeader& theirs);

// Raised on every survivor when ranks of its group are lost (their process gone, or silent past the
// loss bound): `lost` is the set the survivors agreed on, in group ranks, sorted.
class RanksLostError : public std::runtime_error {
 public:
  RanksLostError(const std::string& message, std::vector<int> lost)
      : std::runtime_error(message), lost_(std::move(lost)) {}
  const std::vector<int>& lost() const { return lost_; }

 private:
  std::vector<int> lost_;
};

// "[1, 3]": how messages name a set of ranks.
std::string rank_list(const std::vector<int>& ranks);

// True when process `pid` (of this pid namespace) has exited; a zombie counts, as it never answers.
bool process_gone(std::int64_t pid);
// This process's pid namespace: pids compare only inside one.
std::uint64_t own_pid_namespace();

// How a failed collective ended, as every rank of the group will report it. Transports carry the
// first three kinds; Lost is what the group's membership makes of a failure (`lost`: the ranks).
struct AbortNotice {
  enum class Kind : std::uint8_t { Failure, Timeout, Mismatch, Lost };
  Kind kind = Kind::Failure;
  std::string message;
  std::vector<int> lost{};
  // Rethrows as the exception class the kind stands for.
  [[noreturn]] void raise() const;
};

namespace detail {
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}
}  // namespace detail

}  // namespace ringreduce

// Throws std::runtime_error naming the file and line; never exits the process.
#define RR_CHECK(cond, ...)                                                                   \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      throw std::runtime_error(::ringreduce::detail::concat(                                   \
          "ringreduce: ", ::ringreduce::detail::concat(__VA_ARGS__), " (", __FILE__, ":", __LINE__, ")")); \
    }                                                                                          \
  } while (0)
