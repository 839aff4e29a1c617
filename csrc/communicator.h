// A communicator: one group's transport, the algorithms, and the order collectives run in.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "executor.h"
#include "reducer.h"
#include "transport.h"

namespace ringreduce {

// Default pipeline segment. gloo's ring uses 1 MiB; on the CPU transports 256 KiB keeps a
// segment and its staging slot in the 1 MiB L2 of this machine's cores and was the fastest of
// 64 KiB..4 MiB at 16 and 64 MiB in benchmarks/RESULTS.md. Override per call or with the
// environment variable below.
constexpr std::size_t kDefaultSegmentBytes = 256 << 10;
constexpr const char* kSegmentBytesEnv = "RINGREDUCE_SEGMENT_BYTES";

// The segment size a call gets: `requested` if non-zero, else the environment, else the default.
std::size_t resolve_segment_bytes(std::size_t requested);

struct AllReduceArgs {
  void* data = nullptr;
  std::size_t numel = 0;
  DType dtype = DType::Float32;
  ReduceOp op = ReduceOp::Sum;
  Algorithm algorithm = Algorithm::Ring;
  std::size_t segment_bytes = 0;  // 0: resolve_segment_bytes()
  int root = 0;                   // central reducer only
};

class Communicator {
 public:
  using ReducerFactory = std::function<std::unique_ptr<Reducer>(DType, ReduceOp, int world)>;

  Communicator(std::unique_ptr<Transport> transport, ReducerFactory make_reducer);

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  const char* transport_name() const { return transport_->name(); }
  OrderedExecutor& executor() { return executor_; }

  // Runs one all-reduce on the calling thread; call it from a job of executor(). After a failure
  // the transport is aborted and every later call raises the first error again.
  void all_reduce(const AllReduceArgs& args);

 private:
  std::unique_ptr<Transport> transport_;
  ReducerFactory make_reducer_;
  std::string broken_;  // why the communicator stopped, empty while healthy
  // Destroyed first, so no job outlives the transport.
  OrderedExecutor executor_;
};

}  // namespace ringreduce
