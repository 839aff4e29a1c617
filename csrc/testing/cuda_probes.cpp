#include "testing/cuda_probes.h"

#if defined(RINGREDUCE_WITH_CUDA)
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <pybind11/stl.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/device_queue.h"
#include "cuda/event_completion.h"
#include "cuda/mapped_memory.h"
#include "cuda/nccl_transport.h"
#include "cuda/real_api.h"
#include "transports/watchdog.h"
#endif

#if defined(RINGREDUCE_WITH_SIM)
#include "cuda/host_kernels.h"
#endif
#include "python/glue.h"

namespace py = pybind11;

namespace ringreduce {

namespace {
#if defined(RINGREDUCE_WITH_SIM)

// The operands of the kernel entry points below: contiguous tensors of one size and dtype, on
// the GPU or on the host as `cuda` says. Returns the engine's dtype.
DType kernel_operands(const char* entry, bool cuda, const at::Tensor& dst, const at::Tensor& src,
                      const c10::optional<at::Tensor>& copy, ReduceOp op) {
  auto fits = [&](const at::Tensor& t) {
    return t.is_cuda() == cuda && t.is_contiguous() && t.numel() == dst.numel() && t.scalar_type() == dst.scalar_type();
  };
  TORCH_CHECK(fits(dst) && fits(src) && (!copy || fits(*copy)), entry, " needs contiguous ", cuda ? "CUDA" : "CPU",
              " tensors of one size and dtype");
  return to_dtype(dst, op);
}

#if defined(RINGREDUCE_WITH_CUDA)
// torch's current stream, as the seam names streams.
cuda::Stream current_stream() { return reinterpret_cast<cuda::Stream>(c10::cuda::getCurrentCUDAStream().stream()); }

// The kernel on its own, on the current stream: for tests and benchmarks/kernel_bench.py.
void cuda_reduce(const at::Tensor& dst, const at::Tensor& src, int op_code, int world, bool last,
                 const c10::optional<at::Tensor>& copy) {
  const auto op = static_cast<ReduceOp>(op_code);
  const DType dtype = kernel_operands("cuda_reduce", true, dst, src, copy, op);
  const c10::cuda::CUDAGuard on_device(dst.device());
  RR_CUDA_CHECK(cuda::real_device().reduce(dtype, op, dst.data_ptr(), src.data_ptr(), copy ? copy->data_ptr() : nullptr,
                                           static_cast<std::size_t>(dst.numel()), world, last, current_stream()));
}

// The device side of the call check on its own: this rank's header and the previous rank's, equal
// but for numel, compared on GPU `device`. Returns (flag, numel of mine, numel of theirs) as the
// watchdog reads them from the report.
py::tuple device_header_check(std::uint64_t mine, std::uint64_t theirs, int device) {
  const c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(device));
  const at::Tensor memory = at::empty({static_cast<std::int64_t>(sizeof(cuda::HeaderSlots))},
                                      at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
  auto* slots = static_cast<cuda::HeaderSlots*>(memory.data_ptr());
  cuda::DeviceApi& api = cuda::real_device();
  const auto mapped = cuda::allocate_mapped<cuda::MismatchReport>(api);
  const std::unique_ptr<cuda::MismatchReport, std::function<void(void*)>> owned(
      mapped.host, [&api](void* host) { api.free_mapped(host); });
  cuda::MismatchReport* report = mapped.host;
  cuda::MismatchReport* report_on_device = mapped.device;
  const cuda::Stream stream = current_stream();
  CollectiveHeader header;
  header.numel = theirs;
  RR_CUDA_CHECK(api.write_header(slots, header, stream));  // what the previous rank sent...
  RR_CUDA_CHECK(api.copy(&slots->theirs, &slots->mine, sizeof header, stream));
  header.numel = mine;
  RR_CUDA_CHECK(api.write_header(slots, header, stream));  // ...and this rank's own
  RR_CUDA_CHECK(api.compare_headers(slots, report_on_device, stream));
  RR_CUDA_CHECK(api.synchronize(stream));
  return py::make_tuple(report->flag, report->mine.numel, report->theirs.numel);
}

// ncclSend and ncclRecv through a one-rank communicator to itself: `src` arrives in `dst`. The
// only NCCL transfer one GPU can make (the ring and central reducer stop early at world size 1).
void nccl_self_exchange(c10d::Store& store, const at::Tensor& src, const at::Tensor& dst, double timeout_s) {
  TORCH_CHECK(src.is_cuda() && src.is_contiguous() && dst.is_cuda() && dst.is_contiguous() &&
                  src.nbytes() == dst.nbytes() && src.device() == dst.device(),
              "nccl_self_exchange needs two contiguous CUDA tensors of one size on one GPU");
  const int device = src.device().index();
  cuda::DeviceQueue queue(cuda::real_device(), device, 1);
  cuda::NcclTransport transport(cuda::real_nccl(), std::make_unique<StoreRendezvous>(store), 0, 1, queue,
                                caching_allocator(device), to_millis(timeout_s));
  transport.begin_collective(CollectiveHeader{}, true);
  transport.isend(0, src.data_ptr(), src.nbytes());
  transport.wait(transport.irecv(0, dst.data_ptr(), dst.nbytes()));
  transport.end_collective();
  RR_CUDA_CHECK(cuda::real_device().synchronize(queue.lane_stream(0)));
}

// The watchdog on a real stream of GPU `device`, stalled by a kernel that waits for a flag nobody
// sets (a receive whose sender never comes). Returns the error it raised and the seconds from the
// collective's start; its abort sets the flag, as ncclCommAbort makes NCCL's kernels return, so the
// GPU is free again afterwards.
// C++ types out: it runs without the GIL (its binding releases it), and pybind11 converts the result
// once the GIL is back.
std::pair<std::string, double> cuda_watchdog_stall(int device, double timeout_s) {
  const c10::cuda::CUDAGuard on_device(static_cast<c10::DeviceIndex>(device));
  cuda::DeviceApi& api = cuda::real_device();
  const auto mapped = cuda::allocate_mapped<int>(api);
  const std::unique_ptr<int, std::function<void(void*)>> owned(mapped.host, [&api](void* host) { api.free_mapped(host); });
  int* flag = mapped.host;
  int* flag_on_device = mapped.device;
  cuda::DeviceQueue queue(api, device, 1);
  struct Stalled final : cuda::EventCompletion {
    Stalled(cuda::DeviceQueue& queue, int* flag)
        : EventCompletion(queue, "stalled stream"), flag(flag) {}
    AbortNotice abort(const AbortNotice& notice) override {
      *static_cast<volatile int*>(flag) = 1;
      return notice;
    }
    int* flag;
  };
  std::string message;
  double seconds = -1;
  {
    const std::chrono::milliseconds timeout = to_millis(timeout_s);
    Watchdog watchdog(std::make_unique<Stalled>(queue, flag), timeout);
    const auto start = std::chrono::steady_clock::now();
    watchdog.begin(0, "collective #0 on a stalled stream");
    RR_CUDA_CHECK(api.wait_for_flag(flag_on_device, queue.lane_stream(0)));
    watchdog.end(0);
    while (message.empty() && std::chrono::steady_clock::now() - start < 5 * timeout) {
      try {
        watchdog.check();
      } catch (const TimeoutError& error) {
        message = error.what();
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    *static_cast<volatile int*>(flag) = 1;  // never leave the kernel waiting
  }
  RR_CUDA_CHECK(api.synchronize(queue.lane_stream(0)));
  return {message, seconds};
}
#endif

// AVG's pre-multiply on a CPU tensor over a simulated grid (tests/test_host_kernels.py).
void host_scale(const at::Tensor& data, float factor, std::size_t blocks, std::size_t threads_per_block) {
  TORCH_CHECK(!data.is_cuda() && data.is_contiguous(), "host_scale needs a contiguous CPU tensor");
  cuda::host_scale(to_dtype(data, ReduceOp::Sum), data.data_ptr(), static_cast<std::size_t>(data.numel()), factor,
                   blocks, threads_per_block);
}

// The kernel's body on CPU tensors over a simulated grid (tests/test_host_kernels.py).
void host_reduce(const at::Tensor& dst, const at::Tensor& src, int op_code, int world, bool last,
                 const c10::optional<at::Tensor>& copy, std::size_t blocks, std::size_t threads_per_block) {
  const auto op = static_cast<ReduceOp>(op_code);
  const DType dtype = kernel_operands("host_reduce", false, dst, src, copy, op);
  cuda::host_reduce(dtype, op, dst.data_ptr(), src.data_ptr(), copy ? copy->data_ptr() : nullptr,
                    static_cast<std::size_t>(dst.numel()), world, last, blocks, threads_per_block);
}
#endif

}  // namespace

void bind_cuda_probes(py::module_& m) {
#if defined(RINGREDUCE_WITH_CUDA)
  m.def("cuda_reduce", &cuda_reduce, py::arg("dst"), py::arg("src"), py::arg("op"), py::arg("world"), py::arg("last"),
        py::arg("copy") = py::none(), "dst = dst op src (and copy = the result) with the engine's kernel.");
  m.def("device_header_check", &device_header_check, py::arg("mine"), py::arg("theirs"), py::arg("device"),
        "Two headers differing at most in numel, compared on the GPU: (flag, mine, theirs) from the report.");
  m.def("nccl_self_exchange", &nccl_self_exchange, py::arg("store"), py::arg("src"), py::arg("dst"),
        py::arg("timeout_s"), py::call_guard<py::gil_scoped_release>(),
        "src -> dst through ncclSend/ncclRecv on a one-rank communicator.");
  m.def("cuda_watchdog_stall", &cuda_watchdog_stall, py::arg("device"), py::arg("timeout_s"),
        py::call_guard<py::gil_scoped_release>(),
        "A watchdog over a stream stalled on GPU `device`: (error message, seconds to raise).");
#endif
#if defined(RINGREDUCE_WITH_SIM)
  m.def("host_scale", &host_scale, py::arg("data"), py::arg("factor"), py::arg("blocks"),
        py::arg("threads_per_block"), "AVG's pre-multiply kernel body on a CPU tensor over a simulated grid.");
  m.def("host_reduce", &host_reduce, py::arg("dst"), py::arg("src"), py::arg("op"), py::arg("world"), py::arg("last"),
        py::arg("copy"), py::arg("blocks"), py::arg("threads_per_block"),
        "The kernel's body on CPU tensors, every thread of a blocks x threads_per_block grid in turn.");
#endif
}

}  // namespace ringreduce
