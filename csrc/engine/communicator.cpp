#include "engine/communicator.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "algorithms/algorithms.h"
#include "engine/traced_transport.h"

namespace ringreduce {

namespace {

// A positive integer from the environment variable `name`, or 0 when it is unset or empty.
std::size_t positive_from_env(const char* name, const char* example) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (errno != 0 || *end != '\0' || value == 0 || text[0] == '-') {
    throw std::invalid_argument(detail::concat("ringreduce: ", name, "='", text,
                                               "' is not a positive integer; unset it or set e.g. ", example));
  }
  return static_cast<std::size_t>(value);
}

// The largest lane count a header can carry.
constexpr std::size_t kMaxHeaderLanes = 255;

// Working memory is aligned to a cache line, as the reducers' vector loops like it.
constexpr std::size_t kScratchAlignment = 64;

// How often a host caller of the simulated device looks at it: an event query is a lock and a
// compare, and the collectives it waits for take tens of microseconds at least.
constexpr std::chrono::microseconds kHostWaitPoll{20};

}  // namespace

const char* algorithm_of(const CollectiveArgs& args) {
  switch (args.collective) {
    case Collective::AllReduce: return algorithm_name(args.algorithm);
    case Collective::ReduceScatter:
    case Collective::AllGather: return algorithm_name(args.algorithm);
    case Collective::Reduce: return "central";
    default: return "ring";  // a chain along the ring
  }
}

std::size_t resolve_segment_bytes(std::size_t requested) {
  return requested > 0 ? requested : positive_from_env(kSegmentBytesEnv, "262144");
}

Communicator::Communicator(std::unique_ptr<Transport> transport, ReducerFactory make_reducer,
                           std::unique_ptr<StreamContext> stream, std::unique_ptr<HostTier> hosts)
    : stream_(std::move(stream)),
      trace_(TraceRecorder::from_env(transport->rank(), transport->size(), transport->name())),
      transport_(std::move(transport)),
      hosts_(std::move(hosts)),
      make_reducer_(std::move(make_reducer)) {
  RR_CHECK(!hosts_ || (stream_ == nullptr && hosts_->layout.world() == size() && hosts_->layout.hosts() > 1),
           "a host tier is for a group on host memory over several hosts, with one layout entry per rank");
  if (trace_) transport_ = std::make_unique<TracedTransport>(std::move(transport_), *trace_);
}

const Reducer& Communicator::reducer(DType dtype, ReduceOp op) {
  std::unique_ptr<Reducer>& slot = reducers_[static_cast<int>(dtype)][static_cast<int>(op)];
  if (!slot) slot = make_reducer_(dtype, op, size());
  return *slot;
}

void* Communicator::host_scratch(std::size_t bytes) {
  if (bytes > host_scratch_bytes_) {
    const std::size_t rounded = (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
    host_scratch_.reset(std::aligned_alloc(kScratchAlignment, rounded));
    RR_CHECK(host_scratch_ != nullptr, "could not allocate ", rounded, " bytes of working memory");
    host_scratch_bytes_ = rounded;
  }
  return host_scratch_.get();
}

void Communicator::run(const CollectiveArgs& args) {
  if (args.algorithm == Algorithm::Auto && is_chunked(args.collective)) {
    CollectiveArgs resolved = args;
    resolved.algorithm = chunked_auto();
    run_resolved(resolved, nullptr);
    return;
  }
  if (args.collective != Collective::AllReduce || args.algorithm != Algorithm::Auto) {
    run_resolved(args, nullptr);
    return;
  }
  const std::uint64_t bytes = args.numel * element_size(args.dtype);
  const AutoLearner::Pick pick = resolve_auto(bytes);
  CollectiveArgs resolved = args;
  resolved.algorithm = pick.algorithm;
  if (!pick.exploring) {
    run_resolved(resolved, nullptr);
    return;
  }
  const auto started = std::chrono::steady_clock::now();
  run_resolved(resolved, "explore");
  const auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started);
  if (learner_->record(bytes, took.count())) share_auto_times(bytes);
}

bool Communicator::auto_learns(std::uint64_t bytes) const {
  // A table the user gave wins where it has lines. A device's calls return before its work is
  // done, so the host cannot time them: there the prior stands.
  return size() > 1 && bytes > 0 && stream_ == nullptr && !table_covers(*auto_table_, transport_name());
}

Algorithm Communicator::fixed_auto(std::uint64_t bytes) const {
  return choose_algorithm(*auto_table_, transport_name(), size(), bytes, stream_ == nullptr, has_hierarchy(),
                          spans_hosts());
}

void Communicator::adopt_auto_table(std::shared_ptr<const AutoTable> table) {
  auto_table_ = std::move(table);
  learner_.reset();  // what it learned was under the other table's lines
}

AutoLearner::Pick Communicator::resolve_auto(std::uint64_t bytes) {
  const bool host_memory = stream_ == nullptr;
  if (!auto_learns(bytes)) {
    return {fixed_auto(bytes), false};
  }
  if (!learner_) {
    std::vector<int> host_of_rank;  // where the group spans hosts: the cost model prices the candidates
    for (int rank = 0; spans_hosts() && rank < size(); ++rank) host_of_rank.push_back(hosts_->layout.host_of(rank));
    learner_ = std::make_unique<AutoLearner>(transport_name(), size(), host_memory, has_hierarchy(), spans_hosts(),
                                             std::move(host_of_rank));
  }
  return learner_->pick(bytes);
}

std::vector<std::pair<std::uint64_t, Algorithm>> Communicator::auto_choices() const {
  return learner_ ? learner_->choices() : std::vector<std::pair<std::uint64_t, Algorithm>>{};
}

void Communicator::share_auto_times(std::uint64_t bytes) {
  AutoLearner::Times& times = learner_->round_times(bytes);
  CollectiveArgs exchange;
  exchange.data = times.data();
  exchange.numel = times.size();
  exchange.dtype = DType::Int64;
  exchange.op = ReduceOp::Max;
  exchange.algorithm = Algorithm::OneShot;  // a few dozen bytes, on host memory (the only memory that learns)
  run_resolved(exchange, "exchange");
  learner_->decide(bytes);
}

void Communicator::run_resolved(const CollectiveArgs& args, const char* auto_role) {
  if (!broken_.message.empty()) {
    AbortNotice again = broken_;
    again.message = "ringreduce: this group's " + std::string(transport_->name()) +
                    " communicator failed earlier and cannot be used again (ringreduce.destroy(group) makes a new "
                    "one): " + broken_.message;
    again.raise();
  }
  const bool chunked = is_chunked(args.collective);
  RR_CHECK(!chunked || args.numel % static_cast<std::size_t>(size()) == 0,
           collective_name(args.collective), " of ", args.numel, " elements does not split into ", size(), " chunks");
  const bool hierarchical = args.algorithm == Algorithm::Hierarchical;
  const std::size_t segment_bytes = args.segment_bytes > 0      ? args.segment_bytes
                                    : hierarchical && hosts_ ? hierarchical_segment_bytes(hosts_->layout)
                                                             : transport_->default_segment_bytes();
  RR_CHECK(args.algorithm != Algorithm::Auto, "the algorithm must be resolved before the collective runs");
  RR_CHECK(!host_memory_only(args.algorithm) || stream_ == nullptr, algorithm_name(args.algorithm),
           " runs on host memory only; use ring or central for device tensors");
  const bool log_steps = args.algorithm == Algorithm::Doubling || args.algorithm == Algorithm::HalvingDoubling;
  RR_CHECK(!log_steps || args.collective == Collective::AllReduce, algorithm_name(args.algorithm),
           " runs all-reduces only");
  RR_CHECK(args.input == nullptr || (stream_ == nullptr && args.collective == Collective::ReduceScatter),
           "a separate input is for host reduce-scatters only");
  RR_CHECK(args.output == nullptr || (hierarchical && args.input != nullptr && args.collective ==
                                      Collective::ReduceScatter),
           "a separate output is for hierarchical host reduce-scatters with a separate input only");
  const bool compressed = args.compression != Compression::None;
  RR_CHECK(!compressed || (hierarchical && args.dtype == DType::Float32 &&
                           (args.op == ReduceOp::Sum || args.op == ReduceOp::Avg) && spans_hosts() &&
                           (args.collective == Collective::AllReduce || args.collective == Collective::ReduceScatter)),
           "compression runs on a hierarchical float32 SUM or AVG all-reduce or reduce-scatter over several hosts only");
  RR_CHECK(args.residual == nullptr || (compressed && args.collective == Collective::AllReduce &&
                                        args.op == ReduceOp::Sum && stream_ == nullptr),
           "a residual keeps the rounding errors of a compressed SUM all-reduce on host memory only");
  RR_CHECK(!hierarchical || has_hierarchy() || compressed, "hierarchical runs on a group whose ranks span several "
           "hosts with several ranks on some host; this group is ", hosts_ ? hosts_->layout.describe() : "on one host",
           ": use ring, central or one_shot");
  RR_CHECK(!hierarchical || args.collective == Collective::AllReduce || (chunked && has_chunked_hierarchy()),
           "a hierarchical ", collective_name(args.collective), " runs where it moves fewer bytes across hosts than "
           "the ring; this group is ", hosts_ ? hosts_->layout.describe() : "on one host");
  Transport* neighbours = hierarchical ? hosts_->neighbours.get() : nullptr;
  const Reducer& reducer = this->reducer(args.dtype, args.op);
  const std::size_t wanted_lanes = positive_from_env(kLanesEnv, "1");
  const std::size_t asked_lanes = wanted_lanes > 0 ? wanted_lanes : transport_->default_lanes();
  // The ring's collectives pipeline in lanes; the central reducer and the broadcast chain in one.
  const bool ring = chunked || hierarchical || (args.collective == Collective::AllReduce && args.algorithm == Algorithm::Ring);
  const std::size_t lanes = ring ? std::min({transport_->max_lanes(), kMaxHeaderLanes, asked_lanes}) : 1;
  CollectiveHeader header;
  header.sequence = sequence_++;
  header.numel = args.numel;
  header.segment_bytes = segment_bytes;
  header.root = args.root;
  header.dtype = static_cast<std::uint8_t>(args.dtype);
  header.op = static_cast<std::uint8_t>(args.op);
  header.algorithm = static_cast<std::uint8_t>(args.algorithm);
  header.lanes = static_cast<std::uint8_t>(lanes);
  header.collective = static_cast<std::uint8_t>(args.collective);
  header.compression = static_cast<std::uint8_t>(args.compression);
  const std::size_t chunk = args.numel / static_cast<std::size_t>(size());
  const std::int64_t traced_from = trace_ ? trace_clock_ns() : 0;
  try {
    const char* check_env = std::getenv(kCheckCallsEnv);
    const bool check = check_env == nullptr || std::string(check_env) != "0";
    transport_->begin_collective(header, check);
    if (neighbours != nullptr) neighbours->begin_collective(header, check);
    // A doubling all-reduce checks the call in its own messages.
    const bool checks_itself = args.algorithm == Algorithm::Doubling;  // (all-reduces only, checked above)
    if (check && size() > 1 && !transport_->compares_headers() && !checks_itself) agree_on_call(*transport_, header);
    // In a broadcast or reduce some ranks only send; they must not return before a disagreement
    // found by the rank they send to has reached them.
    const bool some_only_send = args.collective == Collective::Broadcast || args.collective == Collective::Reduce;
    if (check && some_only_send && size() > 1) transport_->agree_with_every_peer();
    const bool reduces = args.collective == Collective::AllReduce || args.collective == Collective::ReduceScatter ||
                         args.collective == Collective::Reduce;
    // (A separate input is host memory, whose reducers prepare nothing.)
    if (reduces && args.numel > 0 && size() > 1) reducer.prepare(args.data, args.numel);
    // The working memory of a hierarchical reduce-scatter or all-gather.
    auto staging = [&] {
      return host_scratch(hierarchical_staging_bytes(chunk, reducer.element_size(), hosts_->layout));
    };
    if (args.numel == 0 && !checks_itself) {
      agree_on_nothing(*transport_);
    } else {
      switch (args.collective) {
        case Collective::AllReduce:
          switch (args.algorithm) {
            case Algorithm::Ring:
              ring_all_reduce(*transport_, reducer, args.data, args.numel, segment_bytes, lanes);
              break;
            case Algorithm::Central:
              central_all_reduce(*transport_, reducer, args.data, args.numel, segment_bytes, args.root);
              break;
            case Algorithm::Hierarchical:
              hierarchical_all_reduce(*transport_, *hosts_, reducer, args.data, args.numel, segment_bytes, lanes,
                                      args.compression, args.residual);
              break;
            case Algorithm::Doubling:
              doubling_all_reduce(*transport_, header, reducer, args.data,
                                  host_scratch(2 * args.numel * reducer.element_size()), args.numel, segment_bytes);
              break;
            case Algorithm::HalvingDoubling:
              halving_doubling_all_reduce(*transport_, reducer, args.data, args.numel, segment_bytes);
              break;
            default:
              one_shot_all_reduce(*transport_, reducer, args.data, host_scratch(args.numel * reducer.element_size()),
                                  args.numel);
          }
          break;
        case Collective::ReduceScatter:
          if (hierarchical) {
            hierarchical_reduce_scatter(
                *transport_, *hosts_, reducer, args.input != nullptr ? args.input : args.data,
                args.output != nullptr ? args.output
                                       : static_cast<char*>(args.data) + rank() * chunk * reducer.element_size(),
                staging(), chunk, segment_bytes, lanes, args.compression);
          } else {
            ring_reduce_scatter(*transport_, reducer, args.data, chunk, segment_bytes, lanes, args.input);
          }
          break;
        case Collective::AllGather:
          if (hierarchical) {
            hierarchical_all_gather(*transport_, *hosts_, reducer.element_size(), args.data, staging(), chunk,
                                    segment_bytes, lanes);
          } else {
            ring_all_gather(*transport_, reducer.element_size(), args.data, chunk, segment_bytes, lanes);
          }
          break;
        case Collective::Broadcast:
          chain_broadcast(*transport_, args.data, args.numel * reducer.element_size(), segment_bytes, args.root);
          break;
        case Collective::Reduce:
          central_reduce(*transport_, reducer, args.data, args.numel, segment_bytes, args.root);
          break;
      }
    }
    transport_->end_collective();
    if (neighbours != nullptr) neighbours->end_collective();
    if (stream_ != nullptr && stream_->host_wait().count() > 0) await_on_host(header.sequence);
    if (trace_) {
      TraceEvent event;
      event.name = collective_name(args.collective);
      event.begin_ns = traced_from;
      event.end_ns = trace_clock_ns();
      event.bytes = args.numel * reducer.element_size();
      event.sequence = header.sequence;
      event.algorithm = algorithm_of(args);
      event.dtype = dtype_name(args.dtype);
      event.op = op_name(args.op);
      event.auto_role = auto_role;
      trace_->record(event);
    }
  } catch (const MismatchError& error) {
    fail({AbortNotice::Kind::Mismatch, error.what()});
  } catch (const TimeoutError& error) {
    fail({AbortNotice::Kind::Timeout, error.what()});
  } catch (const std::exception& error) {
    fail({AbortNotice::Kind::Failure, error.what()});
  }
}

void Communicator::await_on_host(std::uint64_t sequence) {
  const std::function<bool()> done = stream_->done_probe();
  const auto deadline = std::chrono::steady_clock::now() + stream_->host_wait();
  while (!done()) {
    transport_->raise_if_failed();
    if (std::chrono::steady_clock::now() > deadline) {
      throw TimeoutError(detail::concat(timed_out_after(stream_->host_wait()), "the device did not finish collective #",
                                        sequence, " of rank ", rank()));
    }
    std::this_thread::sleep_for(kHostWaitPoll);
  }
  transport_->raise_if_failed();
}

void Communicator::cancel() {
  transport_->cancel();
  if (hosts_ && hosts_->neighbours) hosts_->neighbours->cancel();
}

void Communicator::fail(AbortNotice notice) {
  const auto failed_at = std::chrono::steady_clock::now();
  broken_ = transport_->abort(notice);
  // This host's ranks may wait for this one in shared memory, where the group's notice does not reach.
  if (hosts_ && hosts_->neighbours) hosts_->neighbours->abort(broken_);
  // A disagreement is never a loss; anything else may be one, and every survivor must say so alike.
  if (membership_ && broken_.kind != AbortNotice::Kind::Mismatch) {
    try {
      const std::vector<int> lost = membership_->agree_on_loss(failed_at);
      if (!lost.empty()) membership_->raise_lost(lost, "first seen here as: " + broken_.message);
    } catch (const RanksLostError& lost) {
      broken_ = {AbortNotice::Kind::Lost, lost.what(), lost.lost()};
    } catch (const std::exception& unknown) {
      broken_.message += detail::concat("; ", unknown.what());
    }
  } else if (!membership_ && !advice_.empty() && broken_.kind != AbortNotice::Kind::Mismatch) {
    broken_.message += detail::concat("; ", advice_);
  }
  broken_.raise();
}

}  // namespace ringreduce
