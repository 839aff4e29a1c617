// The real side of the seam: CUDA and NCCL, one call each. Only a CUDA build has them.
#pragma once

#include "cuda/device_api.h"

namespace ringreduce {
namespace cuda {

DeviceApi& real_device();
NcclApi& real_nccl();

}  // namespace cuda
}  // namespace ringreduce
