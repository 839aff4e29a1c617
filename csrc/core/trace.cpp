#include "core/trace.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <set>

#include "core/common.h"

namespace ringreduce {
namespace {

// Communicators traced so far in this process: part of each file's name.
std::atomic<int> traced_communicators{0};

// The recorders alive, so that those of communicators nobody destroyed (a process that exits
// without destroy_process_group) are still written at exit. Never destroyed: exit may use it late.
struct LiveRecorders {
  std::mutex mutex;
  std::set<const TraceRecorder*> recorders;
};
LiveRecorders& live_recorders() {
  static LiveRecorders* live = new LiveRecorders;
  return *live;
}

void write_live_recorders() {
  LiveRecorders& live = live_recorders();
  const std::lock_guard<std::mutex> lock(live.mutex);
  for (const TraceRecorder* recorder : live.recorders) recorder->write();
}

void make_folder(const std::string& path) {
  std::string prefix;
  for (std::size_t at = 0; at != std::string::npos;) {
    at = path.find('/', at + 1);
    prefix = path.substr(0, at);
    if (!prefix.empty() && ::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      throw std::invalid_argument(detail::concat("ringreduce: ", kTraceEnv, "='", path, "': cannot create ", prefix,
                                                 " (errno ", errno, ")"));
    }
  }
}

std::int64_t clock_ns(clockid_t clock) {
  timespec now{};
  ::clock_gettime(clock, &now);
  return static_cast<std::int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

void write_time(std::FILE* out, const char* key, std::int64_t ns) {
  std::fprintf(out, "\"%s\":%s", key, trace_microseconds(ns).c_str());
}

}  // namespace

std::int64_t trace_clock_ns() { return clock_ns(CLOCK_MONOTONIC); }

std::string trace_microseconds(std::int64_t ns) {
  // The sign goes in front of the whole number, and the fraction keeps the nanoseconds.
  const std::uint64_t magnitude = ns < 0 ? 0 - static_cast<std::uint64_t>(ns) : static_cast<std::uint64_t>(ns);
  char text[32];
  std::snprintf(text, sizeof text, "%s%" PRIu64 ".%03u", ns < 0 ? "-" : "", magnitude / 1000,
                static_cast<unsigned>(magnitude % 1000));
  return text;
}

std::unique_ptr<TraceRecorder> TraceRecorder::from_env(int rank, int world, const std::string& transport) {
  const char* folder = std::getenv(kTraceEnv);
  if (folder == nullptr || *folder == '\0') return nullptr;
  make_folder(folder);
  const std::string path = detail::concat(folder, "/ringreduce-", transport, "-rank", rank, "of", world, "-pid",
                                          ::getpid(), "-", traced_communicators++, ".json");
  return std::make_unique<TraceRecorder>(path, rank, world, transport);
}

TraceRecorder::TraceRecorder(std::string path, int rank, int world, std::string transport)
    : path_(std::move(path)),
      rank_(rank),
      world_(world),
      transport_(std::move(transport)),
      realtime_anchor_ns_(clock_ns(CLOCK_REALTIME)),
      monotonic_anchor_ns_(trace_clock_ns()) {
  events_.reserve(kTraceCapacity);
  static const bool at_exit = std::atexit(write_live_recorders) == 0;
  (void)at_exit;
  LiveRecorders& live = live_recorders();
  const std::lock_guard<std::mutex> lock(live.mutex);
  live.recorders.insert(this);
}

TraceRecorder::~TraceRecorder() {
  {
    LiveRecorders& live = live_recorders();
    const std::lock_guard<std::mutex> lock(live.mutex);
    live.recorders.erase(this);
  }
  try {
    write();
  } catch (...) {
    // A trace that cannot be written must not take the program down with it.
  }
}

void TraceRecorder::write() const {
  std::FILE* out = std::fopen(path_.c_str(), "w");
  if (out == nullptr) return;
  // One process per rank, one thread per lane: what `python -m ringreduce.trace merge` keeps.
  // Only the events whole when the count is read: a collective may still be recording (at exit).
  const std::size_t count = count_.load(std::memory_order_acquire);
  std::fprintf(out, "{\"otherData\":{\"rank\":%d,\"world\":%d,\"transport\":\"%s\",\"clock\":\"CLOCK_REALTIME\","
               "\"dropped_events\":%" PRIu64 "},\n\"traceEvents\":[\n", rank_, world_, transport_.c_str(),
               dropped_.load(std::memory_order_relaxed));
  std::fprintf(out, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}", rank_, rank_);
  for (std::size_t i = 0; i < count; ++i) {
    const TraceEvent& e = events_.data()[i];
    std::fprintf(out, ",\n{\"ph\":\"X\",\"pid\":%d,\"tid\":%u,\"name\":\"%s\",\"cat\":\"%s\",", rank_, e.lane, e.name,
                 e.algorithm != nullptr ? "collective" : "transfer");
    write_time(out, "ts", realtime_anchor_ns_ + (e.begin_ns - monotonic_anchor_ns_));
    std::fputc(',', out);
    write_time(out, "dur", e.end_ns - e.begin_ns);
    std::fprintf(out, ",\"args\":{\"bytes\":%" PRIu64 ",\"sequence\":%" PRIu64, e.bytes, e.sequence);
    if (e.algorithm != nullptr) {
      std::fprintf(out, ",\"algorithm\":\"%s\",\"transport\":\"%s\",\"dtype\":\"%s\",\"op\":\"%s\"", e.algorithm,
                   transport_.c_str(), e.dtype, e.op);
      if (e.auto_role != nullptr) std::fprintf(out, ",\"auto\":\"%s\"", e.auto_role);
    } else {
      std::fprintf(out, ",\"peer\":%d,\"lane\":%u", e.peer, e.lane);
    }
    std::fputs("}}", out);
  }
  std::fputs("\n]}\n", out);
  std::fclose(out);
}

}  // namespace ringreduce
