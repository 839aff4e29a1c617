// ringreduce as a torch.distributed backend: `init_process_group("ringreduce")` routes a program's
// all-reduces, reduce-scatters, all-gathers, broadcasts, reduces and barriers to the engine, and
// everything else (send/recv, gather, scatter, all-to-all) to a gloo backend on the same store.
#pragma once

#include <torch/extension.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "engine/communicator.h"

namespace ringreduce {

class RingReduceBackend final : public c10d::Backend {
 public:
  // `cpu` serves CPU tensors (shm or pg, chosen by the Python creator); nccl communicators for CUDA
  // tensors are made on first use through `store`. `fallback` (gloo) serves the rest on CPU
  // tensors, `cuda_fallback` (torch's NCCL; null without CUDA) on CUDA tensors, and `announce`
  // (when set) is told the name of each op the first time it is delegated.
  RingReduceBackend(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout,
                    std::shared_ptr<Communicator> cpu, c10::intrusive_ptr<c10d::Backend> fallback,
                    c10::intrusive_ptr<c10d::Backend> cuda_fallback, Algorithm algorithm,
                    std::function<void(const std::string&)> announce);

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

  // Delegated to the fallback backend.
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
  // The fallback for an op the engine does not run: gloo for CPU tensors, NCCL for CUDA tensors.
  c10d::Backend& fallback(const std::vector<at::Tensor>& tensors, const char* op);

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<Communicator> cpu_;
  c10::intrusive_ptr<c10d::Backend> fallback_;
  c10::intrusive_ptr<c10d::Backend> cuda_fallback_;
  Algorithm algorithm_;
  std::function<void(const std::string&)> announce_;
  std::mutex mutex_;
  std::set<std::string> announced_;                   // ops already delegated once
  std::map<int, std::shared_ptr<Communicator>> gpus_;  // by device index
  uint64_t sequence_ = 0;                             // collectives issued through this backend
};

}  // namespace ringreduce
