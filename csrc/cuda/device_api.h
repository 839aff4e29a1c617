// The seam under the GPU path: every CUDA runtime and NCCL call the host-side GPU code makes goes
// through one of these two interfaces. The real ones (real_api.h) forward each call to CUDA and
// NCCL; the simulated ones (sim_device.h) execute the same calls on host threads, so the device
// queue, the nccl transport, its watchdog and the CUDA reducer run on any machine. No CUDA header
// is needed here, so the code above the seam builds without a toolkit.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/common.h"
#include "core/header.h"
#include "core/rendezvous.h"

namespace ringreduce {
namespace cuda {

// Opaque handles, as cudaStream_t, cudaEvent_t and ncclComm_t are.
struct StreamOpaque;
struct EventOpaque;
struct CommOpaque;
using Stream = StreamOpaque*;
using Event = EventOpaque*;
using Comm = CommOpaque*;

// What a call returns: null when it succeeded, else the library's text for the error (a static
// string, or one that lives as long as what it describes).
using Failure = const char*;

enum class EventState { Done, Pending, Failed };

// Lives in mapped (pinned, device-visible) host memory. The compare kernel fills the pair, then
// sets the flag; the watchdog reads it.
struct MismatchReport {
  volatile int flag;  // 0 until a disagreement is found
  CollectiveHeader mine;
  CollectiveHeader theirs;  // the previous rank's
};

// The two device slots of the header exchange: this rank's header, and the previous rank's.
struct HeaderSlots {
  CollectiveHeader mine;
  CollectiveHeader theirs;
};

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;
  // "cuda" or "sim": what the device's memory is ("sim": the host's).
  virtual const char* name() const = 0;

  virtual Failure get_device(int* device) = 0;
  virtual Failure set_device(int device) = 0;
  // The watchdog's thread, before it polls: `device` current, and its event queries allowed while
  // another thread captures a CUDA graph.
  virtual void attach_thread(int device) = 0;

  // A non-blocking stream (it never syncs with stream 0) on the current device.
  virtual Failure create_stream(Stream* stream) = 0;
  virtual Failure synchronize(Stream stream) = 0;
  // A timing-free event.
  virtual Failure create_event(Event* event) = 0;
  virtual void destroy_event(Event event) = 0;
  virtual Failure record(Event event, Stream stream) = 0;
  // `stream`'s later work waits for the work before the event's latest record.
  virtual Failure wait(Stream stream, Event event) = 0;
  // Done once the work before the latest record has finished; Failed with `why` set when the
  // device reported an error.
  virtual EventState query(Event event, Failure* why) = 0;
  // Whether no queued work can touch memory any more once query() has said Failed for `event`. A
  // GPU whose context holds a sticky error runs nothing more (the default); the simulated device
  // goes on running its queues, so it is drained only when the event's device has none busy.
  virtual bool drained_after_failure(Event event) { return true; }

  virtual Failure copy(void* dst, const void* src, std::size_t bytes, Stream stream) = 0;
  // Zeroed pinned host memory that kernels address at `*device` (the host at `*host`).
  virtual Failure allocate_mapped(std::size_t bytes, void** host, void** device) = 0;
  virtual void free_mapped(void* host) = 0;

  // The kernels (reduce_kernels.h), in stream order.
  virtual Failure reduce(DType dtype, ReduceOp op, void* dst, const void* src, void* copy, std::size_t count, int world,
                         bool last, Stream stream) = 0;
  virtual Failure scale(DType dtype, void* data, std::size_t count, float factor, Stream stream) = 0;
  virtual Failure write_header(HeaderSlots* slots, const CollectiveHeader& header, Stream stream) = 0;
  virtual Failure compare_headers(const HeaderSlots* slots, MismatchReport* report, Stream stream) = 0;
  // Waits on the device until *flag is non-zero: a stand-in for a transfer whose sender never comes.
  virtual Failure wait_for_flag(const volatile int* flag, Stream stream) = 0;
};

class NcclApi {
 public:
  virtual ~NcclApi() = default;
  virtual std::string version() = 0;  // "major.minor.patch"
  virtual Failure unique_id(std::string* id) = 0;
  // Blocking and collective: every rank of the group calls it with the id rank 0 made.
  // `rendezvous` is the group's store (the simulated NCCL connects through it).
  virtual Failure init_rank(Comm* comm, Rendezvous& rendezvous, int world, const std::string& id, int rank) = 0;
  virtual Failure group_start() = 0;
  virtual Failure group_end() = 0;
  virtual Failure send(const void* data, std::size_t bytes, int peer, Comm comm, Stream stream) = 0;
  virtual Failure recv(void* data, std::size_t bytes, int peer, Comm comm, Stream stream) = 0;
  // The communicator's asynchronous error, or null while it has none (or one in progress).
  virtual Failure async_error(Comm comm) = 0;
  virtual void abort(Comm comm) = 0;
  virtual void destroy(Comm comm) = 0;
};

// Device memory for staging, ordered on `stream`: freed (in stream order) when the pointer is dropped.
using DeviceAllocator = std::function<std::shared_ptr<void>(std::size_t bytes, Stream stream)>;

}  // namespace cuda
}  // namespace ringreduce
