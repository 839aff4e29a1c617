// RINGREDUCE_TRACE=<dir>: a timeline of every collective and every transfer it waits for, as a
// Chrome trace event file (chrome://tracing, Perfetto) per communicator. Off by default, and then
// nothing is recorded and nothing is wrapped.
#pragma once

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

// Nanoseconds on CLOCK_REALTIME: the clock the ranks of one host share (and hosts share as far as
// NTP keeps them), so the files of all ranks line up when merged.
std::int64_t trace_clock_ns();

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
};

// The events of one communicator. Its collectives run one at a time, so one buffer serves them
// without a lock. The file is written when the recorder is destroyed with its communicator
// (ringreduce.destroy, destroy_process_group), or at process exit if it never was.
class TraceRecorder {
 public:
  // A recorder when RINGREDUCE_TRACE names a folder (created if missing), else null.
  static std::unique_ptr<TraceRecorder> from_env(int rank, int world, const std::string& transport);
  TraceRecorder(std::string path, int rank, int world, std::string transport);
  ~TraceRecorder();

  void record(const TraceEvent& event) {
    if (events_.size() < kTraceCapacity) {
      events_.push_back(event);
    } else {
      ++dropped_;
    }
  }

  // Writes the file (the destructor and the exit handler call it).
  void write() const;

 private:
  std::string path_;
  int rank_;
  int world_;
  std::string transport_;
  std::vector<TraceEvent> events_;
  std::uint64_t dropped_ = 0;
};

}  // namespace ringreduce
