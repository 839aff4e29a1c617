#include "communicator.h"

#include <cerrno>
#include <cstdlib>

#include "algorithms.h"

namespace ringreduce {

std::size_t resolve_segment_bytes(std::size_t requested) {
  if (requested > 0) return requested;
  const char* text = std::getenv(kSegmentBytesEnv);
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || value == 0 || text[0] == '-') {
    throw std::invalid_argument(detail::concat("ringreduce: ", kSegmentBytesEnv, "='", text,
                                               "' is not a positive number of bytes; unset it or set e.g. 262144"));
  }
  return static_cast<std::size_t>(value);
}

Communicator::Communicator(std::unique_ptr<Transport> transport, ReducerFactory make_reducer,
                           std::unique_ptr<StreamContext> stream)
    : stream_(std::move(stream)), transport_(std::move(transport)), make_reducer_(std::move(make_reducer)) {}

const Reducer& Communicator::reducer(DType dtype, ReduceOp op) {
  std::unique_ptr<Reducer>& slot = reducers_[static_cast<int>(dtype)][static_cast<int>(op)];
  if (!slot) slot = make_reducer_(dtype, op, size());
  return *slot;
}

void Communicator::all_reduce(const AllReduceArgs& args) {
  if (!broken_.empty()) {
    throw std::runtime_error("ringreduce: this group's " + std::string(transport_->name()) +
                             " communicator failed earlier and cannot be used again: " + broken_);
  }
  const std::size_t segment_bytes =
      args.segment_bytes > 0 ? args.segment_bytes : transport_->default_segment_bytes();
  const Reducer& reducer = this->reducer(args.dtype, args.op);
  try {
    if (args.algorithm == Algorithm::Ring) {
      ring_all_reduce(*transport_, reducer, args.data, args.numel, segment_bytes);
    } else {
      central_all_reduce(*transport_, reducer, args.data, args.numel, segment_bytes, args.root);
    }
  } catch (const std::exception& error) {
    broken_ = error.what();
    transport_->abort(broken_);
    throw;
  }
}

}  // namespace ringreduce
