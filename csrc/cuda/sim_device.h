// The simulated device: the seam's lowest layer (device_api.h) executed on host threads, so the
// GPU path above it (device queue, nccl transport, watchdog, CUDA reducer, the local transport's
// device memory) runs unchanged on any machine, and its results are checked bit for bit.
//
// - Device memory is host memory; mapped memory is the same pointer.
// - A stream is an in-order queue run by a thread of its own. Events record, are queried and make
//   other streams wait with CUDA's semantics, across streams and threads.
// - Kernels run the bodies the GPU compiles (reduce_body.cuh, header_check.h) on the stream's thread.
// - NCCL: a communicator is a shm transport made through the group's rendezvous (ranks may be
//   threads of one process or processes of one host); its groups run one at a time, in the order
//   they were issued, each on its stream's thread, sends and receives matched per peer pair.
// - Adversarial timing: every stream operation waits a seeded random delay first, and fresh
//   staging is filled with a poison pattern, so a missing stream wait or a host read before the
//   device finished shows as a wrong result instead of being hidden by luck.
// - Faults can be injected per simulated GPU (SimFault).
//
// It cannot show real timing, the GPU's memory model, or what a driver does.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "cuda/device_api.h"

namespace ringreduce {
namespace cuda {

DeviceApi& sim_device();
NcclApi& sim_nccl();
// Staging on the simulated device: host memory filled with the poison pattern, given back in the
// order of the stream it was allocated on (poisoned again first), as the caching allocator reuses it.
DeviceAllocator sim_allocator();

// Byte that fresh staging is filled with: NaN in every float format, -1 or 255 in the integers.
constexpr unsigned char kSimPoison = 0xFF;

// The random delay before each stream operation: at most `max_delay`, drawn from a generator per
// stream seeded from `seed` and the stream's number. Zero turns the delays off.
void configure_sim(std::uint64_t seed, std::chrono::microseconds max_delay);

enum class SimFault {
  Stall,       // a kernel stops for `duration` (a kernel that hangs, and its stream behind it)
  SilentSend,  // from this NCCL group on, no send is posted (a peer that stops sending)
  Exit,        // the process exits in the middle of the NCCL group (a peer that dies)
  AsyncError,  // the NCCL group fails, and the communicator reports an asynchronous error
};

// Arms `fault` on simulated GPU `device`: it strikes its `after`-th operation queued from now
// (counting kernels for Stall, NCCL groups for the others; 0 is the next), once.
void inject_sim_fault(int device, SimFault fault, std::size_t after, std::chrono::milliseconds duration);
// Also forgets the devices' errors and the most operations queued.
void clear_sim_faults();

// Threads the simulated device runs (one per stream ever created; streams are pooled, as real ones are).
std::size_t sim_stream_threads();
// Streams that hold work now; and the most operations one stream has held at once since
// clear_sim_faults(), which shows how far the host ran ahead of the device.
std::size_t sim_busy_streams();
std::size_t sim_most_queued();

}  // namespace cuda
}  // namespace ringreduce
