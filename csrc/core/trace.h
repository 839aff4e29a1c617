// RINGREDUCE_TRACE=<dir>: a timeline of every collective and every transfer it waits for, as a
// Chrome trace event file (chrome://tracing, Perfetto) per communicator. Off by default, and then
// nothing is recorded and nothing is wrapped.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ringreduce {

constexpr const char* kTraceEnv = "RINGREDUCE_TRACE";
// Events one communicator keeps before it drops (and counts) the rest: about 15 MiB, reserved only
// when tracing is on. A 4-rank ring all-reduce of 64 MiB in 256 KiB segments records about 1,600.
constexpr std::size_t kTraceCapacity = 1 << 18;

// Nanoseconds on CLOCK_MONOTONIC, which never steps back: the clock every span is timed on. Each
// file places them on CLOCK_REALTIME through one pair of readings taken when its recorder starts,
// so the files of all ranks line up when merged (as far as NTP keeps hosts together).
std::int64_t trace_clock_ns();

// `ns` as the microseconds of Chrome's trace format, e.g. "-1.500" for -1500 ns.
std::string trace_microseconds(std::int64_t ns);

// One timed span. Transfers name what was waited for ("send", "recv", "recv_reduce", "forward",
// "forward_reduce", "flush"); collectives name the collective and carry their call.
struct TraceEvent {
  const char* name = "";
  std::int64_t begin_ns = 0;
  std::int64_t end_ns = 0;
  std::int32_t peer = -1;  // -1: not a transfer
  std::uint32_t lane = 0;
  std::uint64_t bytes = 0;
  std::uint64_t sequence = 0;     // the collective's number on its communicator
  const char* algorithm = nullptr;  // collectives only
  const char* dtype = nullptr;
  const char* op = nullptr;
  const char* auto_role = nullptr;  // "explore" (auto trying a candidate), "exchange" (its times) or null
};

// The events of one communicator. Its collectives run one at a time, so one buffer serves them
// without a lock; each event is published by a count that a writer reads first, so a file written
// at process exit while a collective still records holds only whole events. The file is written
// when the recorder is destroyed with its communicator (ringreduce.destroy, destroy_process_group),
// or at process exit if it never was.
class TraceRecorder {
 public:
  // A recorder when RINGREDUCE_TRACE names a folder (created if missing), else null.
  static std::unique_ptr<TraceRecorder> from_env(int rank, int world, const std::string& transport);
  TraceRecorder(std::string path, int rank, int world, std::string transport);
  ~TraceRecorder();

  void record(const TraceEvent& event) {
    const std::size_t count = count_.load(std::memory_order_relaxed);
    if (count < kTraceCapacity) {
      events_.push_back(event);  // within the reserved capacity: the storage never moves
      count_.store(count + 1, std::memory_order_release);
    } else {
      dropped_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // Writes the file (the destructor and the exit handler call it).
  void write() const;

 private:
  std::string path_;
  int rank_;
  int world_;
  std::string transport_;
  std::int64_t realtime_anchor_ns_;   // CLOCK_REALTIME ...
  std::int64_t monotonic_anchor_ns_;  // ... and trace_clock_ns() at the same moment
  std::vector<TraceEvent> events_;    // reserved to kTraceCapacity
  std::atomic<std::size_t> count_{0};  // events whole in events_
  std::atomic<std::uint64_t> dropped_{0};
};

}  // namespace ringreduce
