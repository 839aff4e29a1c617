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
  if (!broken_.message.empty()) {
    AbortNotice again = broken_;
    again.message = "ringreduce: this group's " + std::string(transport_->name()) +
                    " communicator failed earlier and cannot be used again (ringreduce.destroy(group) makes a new "
                    "one): " + broken_.message;
    again.raise();
  }
  const std::size_t segment_bytes =
      args.segment_bytes > 0 ? args.segment_bytes : transport_->default_segment_bytes();
  const Reducer& reducer = this->reducer(args.dtype, args.op);
  CollectiveHeader header;
  header.sequence = sequence_++;
  header.numel = args.numel;
  header.root = args.root;
  header.dtype = static_cast<std::uint8_t>(args.dtype);
  header.op = static_cast<std::uint8_t>(args.op);
  header.algorithm = static_cast<std::uint8_t>(args.algorithm);
  try {
    const char* check = std::getenv(kCheckCallsEnv);
    transport_->begin_collective(header, check == nullptr || std::string(check) != "0");
    if (args.numel == 0) {
      agree_on_nothing(*transport_);
    } else if (args.algorithm == Algorithm::Ring) {
      ring_all_reduce(*transport_, reducer, args.data, args.numel, segment_bytes);
    } else {
      central_all_reduce(*transport_, reducer, args.data, args.numel, segment_bytes, args.root);
    }
  } catch (const MismatchError& error) {
    fail({AbortNotice::Kind::Mismatch, error.what()});
  } catch (const TimeoutError& error) {
    fail({AbortNotice::Kind::Timeout, error.what()});
  } catch (const std::exception& error) {
    fail({AbortNotice::Kind::Failure, error.what()});
  }
}

void Communicator::fail(AbortNotice notice) {
  broken_ = transport_->abort(notice);
  broken_.raise();
}

}  // namespace ringreduce
