// A communicator: one group's transport, the algorithms, and the order collectives run in.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/reducer.h"
#include "core/stream_context.h"
#include "core/trace.h"
#include "core/transport.h"
#include "engine/auto_choice.h"
#include "engine/executor.h"
#include "engine/membership.h"
#include "hierarchy/hierarchical.h"

namespace ringreduce {

// Overrides every transport's default segment size (Transport::default_segment_bytes()).
constexpr const char* kSegmentBytesEnv = "RINGREDUCE_SEGMENT_BYTES";
// "0" turns off the comparison of each call across ranks (every rank must agree on it).
constexpr const char* kCheckCallsEnv = "RINGREDUCE_CHECK_CALLS";
// Overrides the ring's pipeline lanes (Transport::default_lanes()), up to what the transport can
// keep apart; every rank must agree on it (the call check compares it).
constexpr const char* kLanesEnv = "RINGREDUCE_LANES";

// The segment size a call gets: `requested` if non-zero, else the environment, else 0 (the
// transport's default, resolved when the collective runs).
std::size_t resolve_segment_bytes(std::size_t requested);

// One collective call. `data` is the working buffer of `numel` elements: the tensor of an
// all-reduce or a broadcast; `world` chunks of numel / world for a reduce-scatter (rank r's result
// lands in chunk r) or an all-gather (rank r's input sits in chunk r).
struct CollectiveArgs {
  Collective collective = Collective::AllReduce;
  void* data = nullptr;
  std::size_t numel = 0;
  DType dtype = DType::Float32;
  ReduceOp op = ReduceOp::Sum;
  Algorithm algorithm = Algorithm::Ring;
  std::size_t segment_bytes = 0;  // 0: the transport's default
  int root = 0;                   // central reducer and broadcast only
  // Reduce-scatter on host memory: the input, when it is not in `data` (then working memory).
  const void* input = nullptr;
  // A hierarchical reduce-scatter on host memory: where this rank's chunk goes, when not to chunk
  // `rank` of `data` (then `data` is not used, and its working memory is bounded).
  void* output = nullptr;
  // A hierarchical float32 SUM or AVG all-reduce or reduce-scatter: the format its values take
  // between hosts (16-bit, or int8 blocks).
  Compression compression = Compression::None;
  // A compressed SUM all-reduce on host memory: where this rank adds the rounding errors it made
  // (numel float32 values, apart from `data`), for error feedback.
  float* residual = nullptr;
};

// The algorithm a call runs, by name ("ring", "central", "one_shot", "hierarchical", "auto").
const char* algorithm_of(const CollectiveArgs& args);

class Communicator {
 public:
  using ReducerFactory = std::function<std::unique_ptr<Reducer>(DType, ReduceOp, int world)>;

  // `stream` is null for host memory; it outlives the transport and reducers, which use it. `hosts`
  // (host memory only) says which ranks share a host and holds this host's transport, where the
  // group spans hosts: then Algorithm::Hierarchical runs too.
  Communicator(std::unique_ptr<Transport> transport, ReducerFactory make_reducer,
               std::unique_ptr<StreamContext> stream = nullptr, std::unique_ptr<HostTier> hosts = nullptr);

  int rank() const { return transport_->rank(); }
  int size() const { return transport_->size(); }
  const char* transport_name() const { return transport_->name(); }
  OrderedExecutor& executor() { return executor_; }
  // What the caller keeps with the communicator between calls, released with it (the torch glue
  // keeps a reduce-scatter's working buffer here).
  std::shared_ptr<void>& caller_state() { return caller_state_; }
  // Host memory the communicator keeps between calls for its algorithms' working memory.
  std::size_t host_working_bytes() const { return host_scratch_bytes_; }
  StreamContext* stream_context() const { return stream_.get(); }
  // Which ranks share a host, where the group spans hosts; else null.
  const HostLayout* host_layout() const { return hosts_ ? &hosts_->layout : nullptr; }
  // Whether Algorithm::Hierarchical can move fewer bytes across hosts than a flat algorithm here.
  bool has_hierarchy() const { return hosts_ && hosts_->layout.has_hierarchy(); }
  // Whether the reduce-scatter and all-gather can run hierarchical too: where they move fewer bytes
  // across hosts than the ring (HostLayout::chunked_hierarchy_pays). Algorithm::Auto runs them so
  // here, and flat elsewhere.
  bool has_chunked_hierarchy() const { return hosts_ && hosts_->layout.chunked_hierarchy_pays(); }
  // Whether the group spans hosts: then a float32 SUM or AVG all-reduce can be compressed on the
  // link between them (Algorithm::Hierarchical, also where every host has one rank).
  bool spans_hosts() const { return hosts_ && hosts_->layout.hosts() > 1; }
  // What Algorithm::Auto runs for a reduce-scatter or all-gather here: hierarchical where it can
  // (it moves fewer bytes across hosts, in fewer steps), else the ring.
  Algorithm chunked_auto() const { return has_chunked_hierarchy() ? Algorithm::Hierarchical : Algorithm::Ring; }

  // From now on a failure asks `membership` whether ranks were lost, and raises RanksLostError with
  // the survivors' agreed set when they were (else the failure as it was).
  void watch(std::shared_ptr<Membership> membership) { membership_ = std::move(membership); }
  // Where no membership is watched: `advice` is added to every failure that is not a disagreement
  // (what to do when ranks cannot be named). Call before the first collective.
  void advise_on_failure(std::string advice) { advice_ = std::move(advice); }
  // Thread-safe: makes the transfers being waited for raise soon (Transport::cancel); the
  // communicator is broken afterwards. What a membership that finds a rank lost calls.
  void cancel();

  // Runs one collective on the calling thread; call it from a job of executor(). After a failure
  // the transport is aborted, every rank raises the same error, and every later call raises it again.
  // An all-reduce of algorithm Auto runs what the table, the learner or the prior chooses; a
  // reduce-scatter or all-gather of algorithm Auto runs hierarchical where it can, else the ring.
  void run(const CollectiveArgs& args);

  // What auto runs now in each size class it has decided, by the class's smallest size (empty
  // where it does not learn). Call it from a job of executor(), as the collectives change it.
  std::vector<std::pair<std::uint64_t, Algorithm>> auto_choices() const;
  // Whether auto learns the algorithm of an all-reduce of `bytes` here: on host memory, with 2 ranks
  // or more, where no table covers the transport. Elsewhere the table or the prior decides.
  bool auto_learns(std::uint64_t bytes) const;
  // What auto runs for `bytes` without learning: the table's line, or the prior.
  Algorithm fixed_auto(std::uint64_t bytes) const;
  // The auto table this communicator follows: the process's when it was made, until the group
  // agrees on another (adopt it before the first collective, from a job of executor()).
  const AutoTable& auto_table() const { return *auto_table_; }
  void adopt_auto_table(std::shared_ptr<const AutoTable> table);

 private:
  // The algorithm an Auto all-reduce of `bytes` runs, and whether the learner is trying it.
  AutoLearner::Pick resolve_auto(std::uint64_t bytes);
  // Ends an exploration round: every rank's times go through an all-reduce (MAX), so the learner of
  // every rank decides on the same, slowest-rank, numbers.
  void share_auto_times(std::uint64_t bytes);
  void run_resolved(const CollectiveArgs& args, const char* auto_role);
  const Reducer& reducer(DType dtype, ReduceOp op);
  // Host memory of at least `bytes`, kept for later calls (one-shot's accumulator).
  void* host_scratch(std::size_t bytes);

  // For host callers of the simulated device (StreamContext::host_wait): waits until the device has
  // done collective `sequence`, raising what the transport found meanwhile.
  void await_on_host(std::uint64_t sequence);
  [[noreturn]] void fail(AbortNotice notice);

  std::unique_ptr<StreamContext> stream_;
  // Null unless RINGREDUCE_TRACE is set; then transport_ is wrapped to time every wait. Declared
  // before the transport, so it outlives it and writes its file last.
  std::unique_ptr<TraceRecorder> trace_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<HostTier> hosts_;
  ReducerFactory make_reducer_;
  // Reducers made so far, by dtype and op: a call reuses them instead of allocating.
  std::unique_ptr<Reducer> reducers_[kDTypeCount][kReduceOpCount];
  std::shared_ptr<const AutoTable> auto_table_ = current_auto_table();
  std::unique_ptr<AutoLearner> learner_;  // made by the first Auto call that learns
  std::uint64_t sequence_ = 0;  // collectives issued so far (travels in the headers)
  AbortNotice broken_;          // why the communicator stopped; empty message while healthy
  std::shared_ptr<Membership> membership_;  // null: failures are not examined for lost ranks
  std::string advice_;                      // advise_on_failure's
  std::shared_ptr<void> caller_state_;
  std::unique_ptr<void, void (*)(void*)> host_scratch_{nullptr, std::free};
  std::size_t host_scratch_bytes_ = 0;
  // Destroyed first, so no job outlives the transport.
  OrderedExecutor executor_;
};

}  // namespace ringreduce
