// What the torch glue shares: conversions from Python and torch types, the store-backed rendezvous,
// and (CUDA builds) staging memory from torch's caching allocator.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "core/common.h"
#include "core/rendezvous.h"
#include "cpu/reducer.h"
#include "engine/communicator.h"

#if defined(RINGREDUCE_WITH_SIM)
#include "cuda/device_queue.h"
#endif

namespace ringreduce {

// Seconds from Python as milliseconds; refuses what is not a positive number.
std::chrono::milliseconds to_millis(double seconds);

// RanksLostError as torch's DistBackendError, which torch's own error paths (autograd and DDP's
// backward, a blocking collective) keep as torch.distributed.DistBackendError; it still names the
// lost ranks for Python (ringreduce.RanksLostError, see translate_ranks_lost).
class TorchRanksLostError final : public c10::DistBackendError {
 public:
  explicit TorchRanksLostError(const RanksLostError& lost);
  const std::vector<int>& lost() const { return lost_; }

 private:
  std::vector<int> lost_;
};

// `error` as it should reach torch: a RanksLostError becomes a TorchRanksLostError; others as they are.
std::exception_ptr for_torch(std::exception_ptr error);

// pybind11's translator for both lost-ranks errors: raises ringreduce.RanksLostError with `lost_ranks`.
void translate_ranks_lost(std::exception_ptr error);

// Raises TypeError for a sparse or meta tensor: they have no strided data to move.
void require_dense(const at::Tensor& tensor);

// The engine's dtype for a tensor; raises TypeError for what it cannot reduce. (ringreduce/_checks.py
// has already refused other dtypes with the same kind of message.)
DType to_dtype(const at::Tensor& tensor, ReduceOp op);

// Says `message` once, through ringreduce._debug (stderr, under RINGREDUCE_DEBUG=INFO). The module
// is looked up at each call, so the engine holds no Python object: one kept in a C++ global or a
// backend would be released after the interpreter has gone, and crash the process at exit.
void debug_info(const std::string& message);

// The engine's rendezvous, backed by a torch.distributed store.
class StoreRendezvous final : public Rendezvous {
 public:
  explicit StoreRendezvous(c10d::Store& store) : store_(c10::intrusive_ptr<c10d::Store>::reclaim_copy(&store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key) override {
    const std::vector<std::uint8_t> value = store_->get(key);
    return std::string(value.begin(), value.end());
  }
  std::string set_once(const std::string& key, const std::string& value) override {
    const std::vector<std::uint8_t> held =
        store_->compareSet(key, std::vector<std::uint8_t>{}, std::vector<std::uint8_t>(value.begin(), value.end()));
    return std::string(held.begin(), held.end());
  }
  bool has(const std::string& key) override { return store_->check({key}); }
  std::int64_t add(const std::string& key, std::int64_t delta) override { return store_->add(key, delta); }
  std::vector<std::string> get_all(const std::vector<std::string>& keys) override {
    std::vector<std::string> values;
    for (const std::vector<std::uint8_t>& value : store_->multiGet(keys)) values.emplace_back(value.begin(), value.end());
    return values;
  }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

// Deletes `object` without holding the GIL, if this thread holds it: its destructor may wait for
// threads that need the GIL (Python callbacks of finished work, a parameter server's update).
// The objects of one kind alive now, for what must reach every one of them at exit (under
// `mutex`). Never destroyed: the objects may outlive static destruction.
template <typename T>
struct Live {
  std::mutex mutex;
  std::set<T*> objects;
  void add(T* object) {
    const std::lock_guard<std::mutex> lock(mutex);
    objects.insert(object);
  }
  void remove(T* object) {
    const std::lock_guard<std::mutex> lock(mutex);
    objects.erase(object);
  }
  static Live& all() {
    static auto* live = new Live;
    return *live;
  }
};

template <typename T>
void delete_without_gil(T* object) {
  if (PyGILState_Check()) {
    pybind11::gil_scoped_release release;
    delete object;
  } else {
    delete object;
  }
}

// A communicator over `transport`, deleted without the GIL (its worker may be finishing a job whose
// completion runs Python callbacks), and never on its own worker. Host reducers unless told otherwise; `stream` for GPU ones.
std::shared_ptr<Communicator> make_communicator(std::unique_ptr<Transport> transport,
                                               Communicator::ReducerFactory make_reducer = &make_cpu_reducer,
                                               std::unique_ptr<StreamContext> stream = nullptr,
                                               std::unique_ptr<HostTier> hosts = nullptr);

#if defined(RINGREDUCE_WITH_SIM)
// A communicator on `device` of `api` (a GPU, or the simulated device): its streams (one per
// lane), the transport on them, and reducers that launch on them. The communicator owns the queue
// and destroys it after the transport and reducers. `host_wait`: see cuda::DeviceQueue.
std::shared_ptr<Communicator> make_device_communicator(
    cuda::DeviceApi& api, int device, const std::function<std::unique_ptr<Transport>(cuda::DeviceQueue&)>& transport,
    std::chrono::milliseconds host_wait = {});

// A communicator over the simulated NCCL on simulated GPU `device`, serving host memory: group rank
// `rank` of `world` (collective over the group, which may be threads or processes of this host).
std::shared_ptr<Communicator> make_sim_nccl_communicator(std::unique_ptr<Rendezvous> rendezvous, int rank, int world,
                                                         int device, std::chrono::milliseconds timeout);
#endif

#if defined(RINGREDUCE_WITH_CUDA)
// The nccl communicator of a group (collective over it): group rank `rank` of `world`, on GPU `device`.
std::shared_ptr<Communicator> make_nccl_communicator(c10d::Store& store, int rank, int world, int device,
                                                     std::chrono::milliseconds timeout);

// Staging for the nccl transport from torch's caching allocator, on the stream that will use it:
// it shares the memory the process has reserved instead of holding HBM outside torch's view.
cuda::DeviceAllocator caching_allocator(int device);
#endif

}  // namespace ringreduce
