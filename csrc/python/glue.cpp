#include "python/glue.h"

#include <thread>

#if defined(RINGREDUCE_WITH_SIM)
#include "cuda/cuda_reducer.h"
#include "cuda/nccl_transport.h"
#include "cuda/sim_device.h"
#endif

#if defined(RINGREDUCE_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include "cuda/real_api.h"
#endif

namespace py = pybind11;

namespace ringreduce {

TorchRanksLostError::TorchRanksLostError(const RanksLostError& lost)
    : c10::DistBackendError(c10::SourceLocation{__func__, __FILE__, __LINE__}, lost.what()), lost_(lost.lost()) {}

std::exception_ptr for_torch(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const RanksLostError& lost) {
    return std::make_exception_ptr(TorchRanksLostError(lost));
  } catch (...) {
    return error;
  }
}

namespace {

void raise_ranks_lost(const std::string& message, const std::vector<int>& lost) {
  const py::object type = py::module_::import("ringreduce._errors").attr("RanksLostError");
  const py::object error = type(message, lost);
  PyErr_SetObject(type.ptr(), error.ptr());
}

}  // namespace

void translate_ranks_lost(std::exception_ptr error) {
  try {
    if (error) std::rethrow_exception(error);
  } catch (const TorchRanksLostError& lost) {
    raise_ranks_lost(lost.what_without_backtrace(), lost.lost());
  } catch (const RanksLostError& lost) {
    raise_ranks_lost(lost.what(), lost.lost());
  }
}

std::chrono::milliseconds to_millis(double seconds) {
  if (!(seconds > 0)) throw std::invalid_argument("ringreduce: a timeout must be a positive number of seconds");
  return std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000.0));
}

void require_dense(const at::Tensor& tensor) {
  if (tensor.layout() != at::kStrided) {
    throw py::type_error(detail::concat("ringreduce cannot move ", tensor.layout(), " tensors; call .to_dense() first"));
  }
  if (tensor.is_meta()) {
    throw py::type_error("ringreduce cannot move a meta tensor: it has no data; allocate it on cpu or cuda");
  }
}

DType to_dtype(const at::Tensor& tensor, ReduceOp op) {
  require_dense(tensor);
  if (op == ReduceOp::Avg && !at::isFloatingType(tensor.scalar_type())) {
    throw py::type_error("ringreduce: ReduceOp.AVG is not defined for integer tensors, as in torch.distributed; "
                         "use SUM and divide, or a floating dtype");
  }
  switch (tensor.scalar_type()) {
    case at::kFloat: return DType::Float32;
    case at::kDouble: return DType::Float64;
    case at::kHalf: return DType::Float16;
    case at::kBFloat16: return DType::BFloat16;
    case at::kChar: return DType::Int8;
    case at::kByte: return DType::UInt8;
    case at::kInt: return DType::Int32;
    case at::kLong: return DType::Int64;
    case at::kBool:
      // 0/1 bytes: MIN is logical and, MAX logical or, PRODUCT logical and.
      if (op == ReduceOp::Min || op == ReduceOp::Max || op == ReduceOp::Product) return DType::UInt8;
      throw py::type_error("ringreduce: torch.bool tensors support MIN, MAX and PRODUCT only; "
                           "convert to an integer dtype for SUM");
    default:
      throw py::type_error("ringreduce: unsupported dtype " + std::string(c10::toString(tensor.scalar_type())) +
                           "; use float32, float64, float16, bfloat16, int8, uint8, int32 or int64");
  }
}

namespace {

bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;  // public from Python 3.13, which drops the private name
#else
  return _Py_IsFinalizing() != 0;
#endif
}

}  // namespace

void debug_info(const std::string& message) {
  if (!Py_IsInitialized() || python_finalizing()) return;  // at exit nobody is listening
  const py::gil_scoped_acquire gil;
  try {
    py::module_::import("ringreduce._debug").attr("info_once")(py::make_tuple("engine", message), message);
  } catch (const py::error_already_set&) {
    // A log line that cannot be written must not fail the call that says it.
  }
}

namespace {

void delete_communicator(Communicator* communicator) {
  if (communicator->executor().on_worker()) {
    // A job's completion dropped the last reference (a callback released the group it used): the
    // worker cannot wait for itself to stop, so another thread deletes the communicator once the
    // worker has finished that completion.
    std::thread([communicator] { delete communicator; }).detach();
    return;
  }
  delete_without_gil(communicator);
}

}  // namespace

std::shared_ptr<Communicator> make_communicator(std::unique_ptr<Transport> transport,
                                               Communicator::ReducerFactory make_reducer,
                                               std::unique_ptr<StreamContext> stream,
                                               std::unique_ptr<HostTier> hosts) {
  return std::shared_ptr<Communicator>(
      new Communicator(std::move(transport), std::move(make_reducer), std::move(stream), std::move(hosts)),
      &delete_communicator);
}

#if defined(RINGREDUCE_WITH_SIM)
std::shared_ptr<Communicator> make_device_communicator(
    cuda::DeviceApi& api, int device, const std::function<std::unique_ptr<Transport>(cuda::DeviceQueue&)>& transport,
    std::chrono::milliseconds host_wait) {
  auto queue = std::make_unique<cuda::DeviceQueue>(api, device, cuda::kDeviceLanes, host_wait);
  const cuda::DeviceQueue* streams = queue.get();
  auto made = transport(*queue);
  return make_communicator(
      std::move(made),
      [streams](DType dtype, ReduceOp op, int world) { return cuda::make_cuda_reducer(dtype, op, world, *streams); },
      std::move(queue));
}

std::shared_ptr<Communicator> make_sim_nccl_communicator(std::unique_ptr<Rendezvous> rendezvous, int rank, int world,
                                                         int device, std::chrono::milliseconds timeout) {
  return make_device_communicator(
      cuda::sim_device(), device,
      [&](cuda::DeviceQueue& queue) {
        return std::make_unique<cuda::NcclTransport>(cuda::sim_nccl(), std::move(rendezvous), rank, world, queue,
                                                     cuda::sim_allocator(), timeout);
      },
      timeout);
}
#endif

#if defined(RINGREDUCE_WITH_CUDA)
std::shared_ptr<Communicator> make_nccl_communicator(c10d::Store& store, int rank, int world, int device,
                                                     std::chrono::milliseconds timeout) {
  return make_device_communicator(cuda::real_device(), device, [&](cuda::DeviceQueue& queue) {
    return std::make_unique<cuda::NcclTransport>(cuda::real_nccl(), std::make_unique<StoreRendezvous>(store), rank,
                                                 world, queue, caching_allocator(device), timeout);
  });
}

cuda::DeviceAllocator caching_allocator(int device) {
  return [device](std::size_t bytes, cuda::Stream stream) {
    const c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(device));
    void* memory = c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes == 0 ? 1 : bytes,
                                                                          reinterpret_cast<cudaStream_t>(stream));
    return std::shared_ptr<void>(memory, [](void* p) { c10::cuda::CUDACachingAllocator::raw_delete(p); });
  };
}
#endif

}  // namespace ringreduce
