#include "cuda/header_check.h"
#include "cuda/reduce_kernels.h"

namespace ringreduce {
namespace cuda {
namespace {

__global__ void write_header_kernel(HeaderSlots* slots, CollectiveHeader header) { slots->mine = header; }

__global__ void compare_headers_kernel(const HeaderSlots* slots, MismatchReport* report) {
  if (!fill_mismatch_report(slots, report)) return;
  __threadfence_system();  // the pair is visible to the host before the flag
  report->flag = 1;
}

}  // namespace

cudaError_t launch_write_header(HeaderSlots* slots, const CollectiveHeader& header, cudaStream_t stream) {
  write_header_kernel<<<1, 1, 0, stream>>>(slots, header);
  return cudaGetLastError();
}

cudaError_t launch_compare_headers(const HeaderSlots* slots, MismatchReport* report, cudaStream_t stream) {
  compare_headers_kernel<<<1, 1, 0, stream>>>(slots, report);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace ringreduce
