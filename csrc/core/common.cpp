#include "core/common.h"

#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <fstream>

namespace ringreduce {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::Float32: return "float32";
    case DType::Float64: return "float64";
    case DType::Float16: return "float16";
    case DType::BFloat16: return "bfloat16";
    case DType::Int8: return "int8";
    case DType::UInt8: return "uint8";
    case DType::Int32: return "int32";
    case DType::Int64: return "int64";
  }
  return "unknown";
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "SUM";
    case ReduceOp::Avg: return "AVG";
    case ReduceOp::Min: return "MIN";
    case ReduceOp::Max: return "MAX";
    case ReduceOp::Product: return "PRODUCT";
  }
  return "unknown";
}

const char* algorithm_name(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::Ring: return "ring";
    case Algorithm::Central: return "central";
    case Algorithm::OneShot: return "one_shot";
    case Algorithm::Hierarchical: return "hierarchical";
    case Algorithm::Doubling: return "doubling";
    case Algorithm::HalvingDoubling: return "halving_doubling";
    case Algorithm::Auto: return "auto";
  }
  return "unknown";
}

const char* collective_name(Collective collective) {
  switch (collective) {
    case Collective::AllReduce: return "all_reduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::AllGather: return "all_gather";
    case Collective::Broadcast: return "broadcast";
    case Collective::Reduce: return "reduce";
  }
  return "unknown";
}

const char* compression_name(Compression compression) {
  switch (compression) {
    case Compression::None: return "none";
    case Compression::BFloat16: return "bf16";
    case Compression::Float16: return "fp16";
    case Compression::Int8: return "int8";
  }
  return "unknown";
}

std::string describe(const CollectiveHeader& header, const CollectiveHeader& other) {
  const auto algorithm = static_cast<Algorithm>(header.algorithm);
  const auto collective = static_cast<Collective>(header.collective);
  const std::string what = detail::concat(header.numel, " x ", dtype_name(static_cast<DType>(header.dtype)));
  std::string text;
  switch (collective) {
    case Collective::AllReduce:
      text = detail::concat(what, ", ", op_name(static_cast<ReduceOp>(header.op)), ", ", algorithm_name(algorithm));
      if (algorithm == Algorithm::Central) text += detail::concat(" at root ", header.root);
      break;
    case Collective::ReduceScatter:
      text = detail::concat("reduce_scatter of ", what, ", ", op_name(static_cast<ReduceOp>(header.op)));
      break;
    case Collective::AllGather: text = detail::concat("all_gather of ", what); break;
    case Collective::Broadcast: text = detail::concat("broadcast of ", what, " from root ", header.root); break;
    case Collective::Reduce:
      text = detail::concat("reduce of ", what, ", ", op_name(static_cast<ReduceOp>(header.op)), " to root ",
                            header.root);
      break;
  }
  if (header.segment_bytes != other.segment_bytes) {
    text += detail::concat(" in segments of ", header.segment_bytes, " bytes");
  }
  if (header.lanes != other.lanes) text += detail::concat(" in ", static_cast<int>(header.lanes), " lanes");
  if (header.compression != other.compression) {
    text += detail::concat(" compressed to ", compression_name(static_cast<Compression>(header.compression)),
                           " across hosts");
  }
  return text + detail::concat(" (collective #", header.sequence, ")");
}

void throw_mismatch(int rank, const CollectiveHeader& mine, int peer, const CollectiveHeader& theirs) {
  throw MismatchError(detail::concat(
      "ringreduce: the ranks disagree on this collective: rank ", peer, " has ", describe(theirs, mine), ", rank ",
      rank, " has ", describe(mine, theirs), ". Every rank of the group must make the same calls, in the same order, with the same "
      "collective, numel, dtype, op, algorithm and compression (and root, segment size and RINGREDUCE_LANES); recreate the group's communicators with ringreduce.destroy(group)"));
}

std::string timed_out_after(std::chrono::milliseconds timeout) {
  return detail::concat("ringreduce: Timed out after ", timeout.count(), " ms: ");
}

void AbortNotice::raise() const {
  switch (kind) {
    case Kind::Mismatch: throw MismatchError(message);
    case Kind::Timeout: throw TimeoutError(message);
    case Kind::Lost: throw RanksLostError(message, lost);
    case Kind::Failure: break;
  }
  throw std::runtime_error(message);
}

std::string rank_list(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  out << "]";
  return out.str();
}

std::uint64_t own_pid_namespace() {
  struct stat info {};
  return ::stat("/proc/self/ns/pid", &info) == 0 ? static_cast<std::uint64_t>(info.st_ino) : 0;
}

bool process_gone(std::int64_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
  std::string line;
  std::getline(stat, line);
  const auto paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && (line[paren + 2] == 'Z' || line[paren + 2] == 'X');
}

}  // namespace ringreduce
