// ringreduce as a torch.distributed backend: `init_process_group("ringreduce")` routes a program's
// all-reduces, reduce-scatters, all-gathers, broadcasts, reduces and barriers to the engine, and
// everything else (send/recv, gather, scatter, all-to-all) to a gloo backend on the same store.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/communicator.h"

namespace ringreduce {

class RingReduceBackend final : public c10d::Backend {
 public:
  // `cpu` serves CPU tensors (shm or pg, chosen by the Python creator); nccl communicators for CUDA
  // tensors are made on first use through `store`. `fallback` (gloo) serves the rest on CPU
  // tensors, `cuda_fallback` (torch's NCCL; null without CUDA) on CUDA tensors. With `announce`, the
  // first delegation of each op is said under RINGREDUCE_DEBUG=INFO.
  RingReduceBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
                    std::shared_ptr<Communicator> cpu, c10::intrusive_ptr<c10d::Backend> fallback,
                    c10::intrusive_ptr<c10d::Backend> cuda_fallback, Algorithm algorithm, bool announce,
                    std::shared_ptr<Membership> membership, Compression compression = Compression::None);
  ~RingReduceBackend() override;

  // Who in the group is still there: the CPU communicator's failures name the lost ranks, and a
  // shrink starts from the survivors' agreement.
  const std::shared_ptr<Membership>& membership() const { return membership_; }
  // Makes `communicator` follow the membership: its failures name the lost ranks (RanksLostError,
  // the same set as the backend's own calls), and a loss ends its waits at once instead of after the
  // group's timeout. For the package's calls on this group; the backend's own communicators follow it
  // already. Call before its first collective.
  void watch(const std::shared_ptr<Communicator>& communicator);
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // torch.distributed.shrink_group: the survivors (every caller) build a backend of their own on the
  // group's store, after the roll call (ringreduce.backend._shrink). `ranks_to_exclude` are group
  // ranks, sorted; torch has checked them. The shrunk group's backend makes its GPU communicators
  // anew, on first use.
  bool supportsShrinking() const override { return true; }
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<c10d::Backend::Options>& opts_override) override;

  // At interpreter exit (ringreduce's atexit): every live backend drops its delegates, which join
  // their threads while those can still take the GIL. torch keeps the backends of groups never
  // destroyed past the interpreter, and a gloo thread that drops a finished work's tensors during
  // finalization is ended by Python mid-unwind (std::terminate). Call without the GIL.
  static void drop_delegates_at_exit();

  // What a loss ends (backend.cpp), reached from the membership's pulse thread.
  struct Watched;

  const std::string getBackendName() const override { return "ringreduce"; }
  uint64_t getSequenceNumberForGroup() override;

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;

  // Delegated to the fallback backend (and so are sparse tensors given to allreduce).
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

 private:
  // The communicator for tensors on `tensor`'s device.
  Communicator& communicator(const at::Tensor& tensor);
  // A reduce-scatter's or all-gather's algorithm: the flat ring when the group's algorithm is
  // "ring", else auto (hierarchical where that moves fewer bytes across hosts).
  Algorithm chunked_algorithm() const { return algorithm_ == Algorithm::Ring ? Algorithm::Ring : Algorithm::Auto; }
  // The fallback for an op the engine does not run: gloo for CPU tensors, NCCL for CUDA tensors.
  // (A reference held for the call.)
  c10::intrusive_ptr<c10d::Backend> fallback(const std::vector<at::Tensor>& tensors, const char* op);
  // `run` on the fallback for `tensors`; on gloo, with a membership, the work's wait ends on a loss.
  c10::intrusive_ptr<c10d::Work> delegate(const std::vector<at::Tensor>& tensors, const char* op,
                                          const std::function<c10::intrusive_ptr<c10d::Work>(c10d::Backend&)>& run);

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<Watched> watched_;
  std::shared_ptr<Communicator> cpu_;
  std::shared_ptr<Membership> membership_;
  c10::intrusive_ptr<c10d::Backend> fallback_;
  c10::intrusive_ptr<c10d::Backend> cuda_fallback_;
  Algorithm algorithm_;
  Compression compression_;  // of float32 SUM and AVG all-reduces and reduce-scatters between hosts
  bool announce_;
  std::mutex mutex_;
  std::set<std::string> announced_;                   // ops already delegated once
  bool delegates_dropped_ = false;                    // by drop_delegates_at_exit()
  // GPU communicators in the order they were made, with their device index. Every rank makes its
  // k-th under the store prefix "nccl/<k>/", whatever its device, so ranks that each use their own
  // GPU (rank r on cuda:r) meet, as torch's NCCL backend numbers its communicators.
  std::vector<std::pair<int, std::shared_ptr<Communicator>>> gpus_;
  uint64_t sequence_ = 0;                             // collectives issued through this backend
};

}  // namespace ringreduce
