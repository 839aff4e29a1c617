#include "cuda/real_api.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>

#include "cuda/reduce_kernels.h"

namespace ringreduce {
namespace cuda {
namespace {

Failure failure(cudaError_t status) { return status == cudaSuccess ? nullptr : cudaGetErrorString(status); }
Failure failure(ncclResult_t result) { return result == ncclSuccess ? nullptr : ncclGetErrorString(result); }
cudaStream_t cuda(Stream stream) { return reinterpret_cast<cudaStream_t>(stream); }
cudaEvent_t cuda(Event event) { return reinterpret_cast<cudaEvent_t>(event); }
ncclComm_t nccl(Comm comm) { return reinterpret_cast<ncclComm_t>(comm); }

class CudaDevice final : public DeviceApi {
 public:
  const char* name() const override { return "cuda"; }
  Failure get_device(int* device) override { return failure(cudaGetDevice(device)); }
  Failure set_device(int device) override { return failure(cudaSetDevice(device)); }
  void attach_thread(int device) override {
    cudaSetDevice(device);
    cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&relaxed);
  }
  Failure create_stream(Stream* stream) override {
    return failure(cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(stream), cudaStreamNonBlocking));
  }
  Failure synchronize(Stream stream) override { return failure(cudaStreamSynchronize(cuda(stream))); }
  Failure create_event(Event* event) override {
    return failure(cudaEventCreateWithFlags(reinterpret_cast<cudaEvent_t*>(event), cudaEventDisableTiming));
  }
  void destroy_event(Event event) override { cudaEventDestroy(cuda(event)); }
  Failure record(Event event, Stream stream) override { return failure(cudaEventRecord(cuda(event), cuda(stream))); }
  Failure wait(Stream stream, Event event) override { return failure(cudaStreamWaitEvent(cuda(stream), cuda(event), 0)); }
  EventState query(Event event, Failure* why) override {
    const cudaError_t state = cudaEventQuery(cuda(event));
    if (state == cudaSuccess) return EventState::Done;
    if (state == cudaErrorNotReady) return EventState::Pending;
    *why = cudaGetErrorString(state);
    return EventState::Failed;
  }
  Failure copy(void* dst, const void* src, std::size_t bytes, Stream stream) override {
    return failure(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda(stream)));
  }
  Failure allocate_mapped(std::size_t bytes, void** host, void** device) override {
    if (Failure failed = failure(cudaHostAlloc(host, bytes, cudaHostAllocMapped))) return failed;
    std::memset(*host, 0, bytes);
    const cudaError_t pointed = cudaHostGetDevicePointer(device, *host, 0);
    if (pointed != cudaSuccess) cudaFreeHost(*host);
    return failure(pointed);
  }
  void free_mapped(void* host) override { cudaFreeHost(host); }
  Failure reduce(DType dtype, ReduceOp op, void* dst, const void* src, void* copy, std::size_t count, int world,
                 bool last, Stream stream) override {
    return failure(launch_reduce(dtype, op, dst, src, copy, count, world, last, cuda(stream)));
  }
  Failure scale(DType dtype, void* data, std::size_t count, float factor, Stream stream) override {
    return failure(launch_scale(dtype, data, count, factor, cuda(stream)));
  }
  Failure write_header(HeaderSlots* slots, const CollectiveHeader& header, Stream stream) override {
    return failure(launch_write_header(slots, header, cuda(stream)));
  }
  Failure compare_headers(const HeaderSlots* slots, MismatchReport* report, Stream stream) override {
    return failure(launch_compare_headers(slots, report, cuda(stream)));
  }
  Failure wait_for_flag(const volatile int* flag, Stream stream) override {
    return failure(launch_wait_for_flag(flag, cuda(stream)));
  }
};

class RealNccl final : public NcclApi {
 public:
  std::string version() override {
    int code = 0;
    if (ncclGetVersion(&code) != ncclSuccess) return "unknown";
    // Codes from 2.9 on are major*10000 + minor*100 + patch.
    return detail::concat(code / 10000, ".", (code / 100) % 100, ".", code % 100);
  }
  Failure unique_id(std::string* id) override {
    ncclUniqueId made;
    if (Failure failed = failure(ncclGetUniqueId(&made))) return failed;
    id->assign(made.internal, sizeof made.internal);
    return nullptr;
  }
  Failure init_rank(Comm* comm, Rendezvous& /*rendezvous*/, int world, const std::string& id, int rank) override {
    ncclUniqueId unique;
    if (id.size() != sizeof unique.internal) return "the NCCL id has the wrong size";
    std::memcpy(unique.internal, id.data(), sizeof unique.internal);
    // Blocking: issuing a group costs microseconds on the calling thread. A non-blocking
    // communicator hands every ncclGroupEnd to a new thread (NCCL 2.23 on) and must be polled,
    // about 0.1 ms per ring step. The watchdog and the issue window bound how long anything waits.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;
    return failure(ncclCommInitRankConfig(reinterpret_cast<ncclComm_t*>(comm), world, unique, rank, &config));
  }
  Failure group_start() override { return failure(ncclGroupStart()); }
  Failure group_end() override { return failure(ncclGroupEnd()); }
  Failure send(const void* data, std::size_t bytes, int peer, Comm comm, Stream stream) override {
    return failure(ncclSend(data, bytes, ncclUint8, peer, nccl(comm), cuda(stream)));
  }
  Failure recv(void* data, std::size_t bytes, int peer, Comm comm, Stream stream) override {
    return failure(ncclRecv(data, bytes, ncclUint8, peer, nccl(comm), cuda(stream)));
  }
  Failure async_error(Comm comm) override {
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(nccl(comm), &async) != ncclSuccess || async == ncclInProgress) return nullptr;
    return failure(async);
  }
  void abort(Comm comm) override { ncclCommAbort(nccl(comm)); }
  void destroy(Comm comm) override { ncclCommDestroy(nccl(comm)); }
};

}  // namespace

DeviceApi& real_device() {
  static CudaDevice* device = new CudaDevice;  // never destroyed: streams outlive static destructors
  return *device;
}

NcclApi& real_nccl() {
  static RealNccl* api = new RealNccl;
  return *api;
}

}  // namespace cuda
}  // namespace ringreduce
